package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/appliance"
	"hearth/appliance/appliancetest"
)

// TestCrashDaemonKilledMidAgent kills the daemon with SIGKILL while an
// agent works: a CLI following the execution ends promptly saying the
// daemon went away; the restarted daemon marks the execution interrupted,
// keeps every event it had acknowledged and adds the final one, records
// the partial output, and destroys the machine left behind.
func TestCrashDaemonKilledMidAgent(t *testing.T) {
	e := newCrashEnv(t)
	appliancetest.LinkImages(t, e.cfg.StateDir, appliancetest.ClaudeCodeImages(t))
	model := modeltest.New(modeltest.Config{Turns: []modeltest.Turn{
		bash("mkdir -p outputs && echo partial > outputs/draft.md && sleep 120"),
	}})
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	key, defs := filepath.Join(e.dir, "api-key"), filepath.Join(e.dir, "defs")
	os.WriteFile(key, []byte(model.Key()), 0o600)
	os.MkdirAll(defs, 0o755)
	os.WriteFile(filepath.Join(defs, "analyst.toml"), []byte("image = \"claude-code\"\nmodel = \"claude-sonnet-4-5\"\noutputs = [\"outputs/*.md\"]\n"), 0o644)
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[agents]\ndir = %q\n[model]\nupstream = %q\napi_key_file = %q\n",
		e.cfg.StateDir, e.cfg.Workspace.Mount, defs, model.URL(), key)
	if err := os.WriteFile(e.config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	e.up()
	id := strings.TrimSpace(e.mustCLI("agents", "run", "analyst", "a long task", "--detach"))
	c := appliance.NewClient(e.cfg.SocketPath())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	written := errors.New("written")
	err := c.FollowEvents(ctx, id, 0, func(ev appliance.Event) error {
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
	if len(after) < len(before.Events)+1 || !appliance.FinalEvent(after[len(after)-1]) {
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
	if left := processesOf(e.agent); len(left) > 0 {
		t.Errorf("guest agents still running after the restart: %v", left)
	}
	e.stop()
}

func allEventsOf(t *testing.T, c *appliance.Client, id string) []appliance.Event {
	t.Helper()
	page, err := c.Events(context.Background(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return page.Events
}
