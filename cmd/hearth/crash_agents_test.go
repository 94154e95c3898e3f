package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/appliance/appliancetest"
	"hearth/client"
	"hearth/internal/leftovers"
)

// TestCrashDaemonKilledMidAgent kills the daemon with SIGKILL while an
// agent works: a CLI following the execution ends promptly saying the
// daemon went away; the restarted daemon marks the execution interrupted,
// keeps every event it had acknowledged and adds the final one, records
// the partial output, and destroys the machine left behind.
func TestCrashDaemonKilledMidAgent(t *testing.T) {
	e := newCrashEnv(t)
	e.agentEnv([]modeltest.Turn{
		bash("mkdir -p outputs && echo partial > outputs/draft.md && sleep 120"),
	}, "outputs = [\"outputs/*.md\"]\n", "")
	e.up()
	id := strings.TrimSpace(e.mustCLI("agents", "run", "analyst", "a long task", "--detach"))
	c := client.New(e.cfg.SocketPath())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	written := errors.New("written")
	err := c.FollowEvents(ctx, id, 0, func(ev client.Event) error {
		if ev.Type == "file" && strings.Contains(string(ev.Payload), "outputs/draft.md") {
			return written
		}
		return nil
	})
	if !errors.Is(err, written) {
		t.Fatalf("waiting for the draft: %v", err)
	}
	before, err := c.Events(context.Background(), id, 0, 0)
	if err != nil || len(before.Events) == 0 {
		t.Fatalf("events before the crash: %+v, %v", before, err)
	}

	var out, errOut bytes.Buffer
	follow := exec.Command(e.bin, e.withConfig([]string{"agents", "execution", id, "--follow"})...)
	follow.Stdout, follow.Stderr = &out, &errOut
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	e.crash()
	code, _ := e.wait(follow)
	took := time.Since(killed)
	t.Logf("agents execution --follow exited %d %v after the daemon's SIGKILL: stderr %q", code, took.Round(time.Millisecond), errOut.String())
	if took > hangLimit || code == 0 || !strings.Contains(errOut.String(), "daemon") {
		t.Errorf("following after the daemon died: exit %d after %v, stderr %q; want a prompt non-zero exit saying the daemon went away", code, took, errOut.String())
	}

	e.up()
	got, err := c.Execution(context.Background(), id)
	if err != nil || got.Status != "interrupted" || strings.Join(got.Outputs, ",") != "outputs/draft.md" {
		t.Errorf("after the restart: %+v, %v; want interrupted with outputs/draft.md", got, err)
	}
	after := allEventsOf(t, c, id)
	// The agent may add events between the snapshot and the kill; what
	// was stored stays as it was, and the interrupted status comes last.
	if len(after) < len(before.Events)+1 || !client.FinalEvent(after[len(after)-1]) {
		t.Fatalf("%d events before the crash, %d after the restart (want them all, then the interrupted status)", len(before.Events), len(after))
	}
	for i, ev := range before.Events {
		if after[i].Seq != ev.Seq || after[i].Type != ev.Type || !bytes.Equal(after[i].Payload, ev.Payload) {
			t.Errorf("event %d changed across the crash: %s %s, was %s %s", ev.Seq, after[i].Type, after[i].Payload, ev.Type, ev.Payload)
		}
	}
	if b, err := os.ReadFile(filepath.Join(e.cfg.Workspace.Mount, got.Session, "outputs", "draft.md")); err != nil || string(b) != "partial\n" {
		t.Errorf("the partial output after the restart: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "jail", "machines", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the execution's machine after the restart: %v, want it destroyed", err)
	}
	if left := leftovers.Processes(e.agent); len(left) > 0 {
		t.Errorf("guest agents still running after the restart: %v", left)
	}
	e.stop()
}

func allEventsOf(t *testing.T, c *client.Client, id string) []client.Event {
	t.Helper()
	page, err := c.Events(context.Background(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return page.Events
}

// TestCrashDaemonKilledMidCall kills the daemon with SIGKILL while a
// model answer streams: the restarted daemon records that call as cut
// (it was served, but its end was never seen) and charges it, so every
// call the provider served is metered or cut, the credit ledger charged
// exactly what the model_call records say, and the interrupted execution
// shows those turns, tokens and dollars rather than zero.
func TestCrashDaemonKilledMidCall(t *testing.T) {
	e := newCrashEnv(t)
	slow := say("a long answer that streams slowly")
	slow.Delay = 3 * time.Second
	model := e.agentEnv([]modeltest.Turn{bash("echo one"), slow}, "", "[credits]\nenabled = true\n")
	e.up()
	e.mustCLI("credits", "add", "10")
	id := strings.TrimSpace(e.mustCLI("agents", "run", "analyst", "a task", "--budget", "2", "--detach"))
	for deadline := time.Now().Add(2 * time.Minute); len(model.MessageRequests()) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the slow call never came: %d calls", len(model.MessageRequests()))
		}
	}
	time.Sleep(500 * time.Millisecond) // into the stream
	e.crash()
	served := len(model.MessageRequests())
	e.up()
	defer e.stop()

	c := client.New(e.cfg.SocketPath())
	got, err := c.Execution(context.Background(), id)
	if err != nil || got.Status != "interrupted" {
		t.Fatalf("after the restart: %+v, %v; want interrupted", got, err)
	}
	var metered, cut int
	var recorded float64
	for _, ev := range allEventsOf(t, c, id) {
		if ev.Type != "model_call" || strings.Contains(string(ev.Payload), `"phase":"start"`) {
			continue
		}
		var p struct {
			USD       float64 `json:"usd"`
			Cut       bool    `json:"cut"`
			Recovered bool    `json:"recovered"`
		}
		json.Unmarshal(ev.Payload, &p)
		recorded += p.USD
		if p.Recovered && p.Cut && p.USD > 0 {
			cut++
		} else if !p.Recovered {
			metered++
		}
	}
	cr, err := c.Credits(context.Background()) // the only execution's
	if err != nil {
		t.Fatal(err)
	}
	spent := cr.Spent
	if cr.Reserved != 0 {
		t.Errorf("credits after the restart: %+v, want nothing reserved", cr)
	}
	t.Logf("served %d, metered %d, cut %d; records $%.6f, ledger $%.6f, execution $%.6f, %d turns", served, metered, cut, recorded, spent, got.Usd, got.Turns)
	if served != 2 || metered != 1 || cut != 1 {
		t.Errorf("served %d calls, metered %d, cut %d: want 2 == 1 + 1", served, metered, cut)
	}
	if math.Abs(recorded-spent) > 1e-6 || math.Abs(got.Usd-spent) > 1e-6 || got.Turns != 1 || got.Tokens.Input != 1000 {
		t.Errorf("records $%.6f, ledger $%.6f, execution %+v: want the same dollars, 1 turn, 1000 input tokens", recorded, spent, got)
	}
}

// agentEnv gives the crash environment an agent "analyst" on the
// claude-code image (defExtra: further lines of its definition), a
// scripted model playing turns, and a config naming both (confExtra:
// further lines of it), and returns the model.
func (e *crashEnv) agentEnv(turns []modeltest.Turn, defExtra, confExtra string) *modeltest.Server {
	t := e.t
	t.Helper()
	appliancetest.LinkImages(t, e.cfg.StateDir, appliancetest.ClaudeCodeImages(t))
	model := modeltest.New(modeltest.Config{Turns: turns})
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	key, defs := filepath.Join(e.dir, "api-key"), filepath.Join(e.dir, "defs")
	def := "image = \"claude-code\"\nmodel = \"claude-sonnet-4-5\"\n" + defExtra
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[agents]\ndir = %q\n[model]\nupstream = %q\napi_key_file = %q\n",
		e.cfg.StateDir, e.cfg.Workspace.Mount, defs, model.URL(), key) + confExtra
	for _, err := range []error{
		os.WriteFile(key, []byte(model.Key()), 0o600),
		os.MkdirAll(defs, 0o755),
		os.WriteFile(filepath.Join(defs, "analyst.toml"), []byte(def), 0o644),
		os.WriteFile(e.config, []byte(body), 0o644),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return model
}
