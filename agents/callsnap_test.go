package agents

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/fs"
)

func TestParseRetention(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Retention
	}{
		{"", Retention{Last: DefaultCallSnapshots}},
		{"all", Retention{All: true}},
		{"off", Retention{Off: true}},
		{"last 2", Retention{Last: 2}},
		{" last   7 ", Retention{Last: 7}},
		{"days 3", Retention{Age: 72 * time.Hour}},
	} {
		got, err := ParseRetention(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseRetention(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if again, err := ParseRetention(got.String()); err != nil || again != got {
			t.Errorf("ParseRetention(%q.String() = %q) = %+v, %v", c.in, got.String(), again, err)
		}
	}
	for _, bad := range []string{"last", "last 0", "last -1", "last x", "days 0", "some", "all 3", "last 1 2", "last 99999999999"} {
		if _, err := ParseRetention(bad); err == nil || !strings.Contains(err.Error(), `"last N"`) {
			t.Errorf("ParseRetention(%q) = %v, want an error saying what to give", bad, err)
		}
	}
}

func TestRetentionExpired(t *testing.T) {
	now := time.Now()
	var snaps []SnapshotRef
	at := now.Add(-10 * 24 * time.Hour)
	add := func(name string) {
		at = at.Add(24 * time.Hour)
		snaps = append(snaps, SnapshotRef{Name: name, Created: at})
	}
	add("mine")           // a user's: never touched
	add("exec-a.start")   // 9 days old
	add("exec-a.call-1")  // 8
	add("exec-a.call-2")  // 7
	add("exec-a.end")     // 6
	add("exec-b.start")   // 5
	add("exec-b.call-1")  // 4
	add("exec-b.call-2")  // 3
	add("exec-b.call-3")  // 2
	add("exec-b.end")     // 1
	add("exec-c.call")    // not one of the runner's names
	add("exec-c.start-1") // nor this
	got := Retention{Last: 2}.expired(snaps, now)
	slices.Sort(got)
	if want := []string{"exec-a.call-1", "exec-a.call-2", "exec-b.call-1"}; !slices.Equal(got, want) {
		t.Errorf("last 2 expires %q, want %q", got, want)
	}
	got = Retention{Last: 1}.expired(snaps, now)
	slices.Sort(got)
	if want := []string{"exec-a.call-1", "exec-a.call-2", "exec-a.end", "exec-a.start", "exec-b.call-1", "exec-b.call-2"}; !slices.Equal(got, want) {
		t.Errorf("last 1 expires %q, want %q", got, want)
	}
	got = Retention{Age: 3*24*time.Hour + time.Hour}.expired(snaps, now)
	slices.Sort(got)
	if want := []string{"exec-a.call-1", "exec-a.call-2", "exec-a.end", "exec-a.start", "exec-b.start"}; !slices.Equal(got, want) {
		t.Errorf("days ~3 expires %q, want %q", got, want)
	}
	if got := (Retention{All: true}).expired(snaps, now); got != nil {
		t.Errorf("all expires %q", got)
	}
}

// failingSnaps is the test workspace with snapshots refused.
type failingSnaps struct{ fsWorkspace }

func (failingSnaps) Snapshot(session, name string) error {
	return errors.New("scripted snapshot failure")
}

// TestRunCallSnapshots: the real claude CLI in a jail does a three-call
// task; the session gets a start snapshot, one after each call (named in
// the call's model_call event) and an end one, each holding the files as
// they were then, the agent's .home (its transcript) included. A second
// execution with call_snapshots = "last 2" leaves only the newest two call
// snapshots; a third, whose snapshots fail, says so in error events and
// is metered all the same.
func TestRunCallSnapshots(t *testing.T) {
	turns := func(tag string) []modeltest.Turn {
		return []modeltest.Turn{
			{Blocks: []modeltest.Block{bash("echo one > outputs/" + tag + "-a.txt && echo MARK-" + tag + "-A")}, Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}},
			{Blocks: []modeltest.Block{bash("echo two > outputs/" + tag + "-b.txt && echo MARK-" + tag + "-B")}, Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}},
			{Blocks: []modeltest.Block{modeltest.Text("done " + tag)}, Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}},
		}
	}
	script := append(append(turns("x"), turns("y")...), turns("z")...)
	h := newHarness(t, script, Limits{USD: 1000, Turns: 20})
	ws := h.runner.cfg.Workspace.(fsWorkspace)
	h.runner.cfg.CallSnapshots = Retention{All: true}
	ctx := context.Background()

	first, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "Write two files"})
	evs := h.eventsOf(t, first.Execution.ID)
	if err != nil || first.Execution.Status != store.Completed {
		t.Fatalf("Run = %+v, %v\nevents:\n%s", first.Execution, err, dump(evs))
	}
	id, sess := first.Execution.ID, first.Execution.Session
	// The model_call events name their snapshots, in order.
	var named []string
	for _, e := range evs {
		var p gateway.ModelCallPayload
		if e.Type == stream.ModelCall && json.Unmarshal(e.Payload, &p) == nil && p.Phase != gateway.PhaseStart {
			named = append(named, p.Snapshot)
		}
	}
	want := []string{id + ".call-1", id + ".call-2", id + ".call-3"}
	if !slices.Equal(named, want) {
		t.Fatalf("model_call events name snapshots %q, want %q\nevents:\n%s", named, want, dump(evs))
	}
	if n := countType(evs, stream.Error, "snapshot"); n != 0 {
		t.Errorf("%d error events about snapshots\n%s", n, dump(evs))
	}
	list, err := ws.Snapshots(sess)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list {
		names = append(names, s.Name)
	}
	if want := []string{id + ".start", id + ".call-1", id + ".call-2", id + ".call-3", id + ".end"}; !slices.Equal(names, want) {
		t.Fatalf("session snapshots %q, want %q", names, want)
	}
	// The transcript the CLI keeps in .home, found in the live session.
	transcripts, err := filepath.Glob(filepath.Join(ws.views, "host", sess, ".home/.claude/projects/*/*.jsonl"))
	if err != nil || len(transcripts) != 1 {
		t.Fatalf("the agent's transcript in .home: %q, %v", transcripts, err)
	}
	transcript, _ := filepath.Rel(filepath.Join(ws.views, "host", sess), transcripts[0])
	read := func(snap, p string) (string, bool) {
		b, err := ws.s.ReadFile(sess, snap, p, 0)
		if errors.Is(err, fs.ErrNotFound) {
			return "", false
		}
		if err != nil {
			t.Fatalf("read %s in snapshot %s: %v", p, snap, err)
		}
		return string(b), true
	}
	// Files: one the agent writes in answer to call N is in the
	// snapshots after calls N+1 and on, not in the earlier ones.
	// The transcript: the CLI appends to it lazily (its call-2 snapshot
	// has been seen to lack the tool result call 2 sent), so what holds is
	// that each snapshot's transcript is a prefix of the next one's, and
	// that some call snapshot holds part of it but not all.
	prev, partial := "", false
	for _, c := range []struct {
		snap string
		a, b bool // outputs/x-a.txt, outputs/x-b.txt there
	}{
		{"start", false, false},
		{"call-1", false, false},
		{"call-2", true, false},
		{"call-3", true, true},
		{"end", true, true},
	} {
		snap := id + "." + c.snap
		if _, ok := read(snap, "outputs/x-a.txt"); ok != c.a {
			t.Errorf("%s: outputs/x-a.txt there: %v, want %v", snap, ok, c.a)
		}
		if _, ok := read(snap, "outputs/x-b.txt"); ok != c.b {
			t.Errorf("%s: outputs/x-b.txt there: %v, want %v", snap, ok, c.b)
		}
		if prompt, ok := read(snap, promptFile); !ok || !strings.Contains(prompt, "Write two files") {
			t.Errorf("%s: %s = %q, %v; want the prompt (.home is in the snapshot)", snap, promptFile, prompt, ok)
		}
		tr, ok := read(snap, transcript)
		if c.snap == "start" && ok {
			t.Errorf("%s: the transcript is there before the agent started", snap)
		}
		if !strings.HasPrefix(tr, prev) {
			t.Errorf("%s: transcript (%d bytes) does not go on from the previous snapshot's (%d bytes)", snap, len(tr), len(prev))
		}
		t.Logf("%s: transcript %d bytes", snap, len(tr))
		if c.snap == "end" {
			if !strings.Contains(tr, "MARK-x-B") || !strings.Contains(tr, "done x") {
				t.Errorf("%s: transcript (%d bytes) lacks the last tool result or answer", snap, len(tr))
			}
		} else if len(tr) > 0 {
			partial = true
		}
		prev = tr
	}
	if !partial {
		t.Errorf("no call snapshot holds part of the transcript")
	}

	// "last 2": after a second execution, only its two newest call
	// snapshots (and the newest two start and end ones) are left.
	h.runner.cfg.CallSnapshots = Retention{Last: 2}
	second, err := h.runner.Run(ctx, TaskRequest{Session: sess, Prompt: "Write two more"})
	if err != nil || second.Execution.Status != store.Completed {
		t.Fatalf("second run = %+v, %v\nevents:\n%s", second.Execution, err, dump(h.eventsOf(t, second.Execution.ID)))
	}
	id2 := second.Execution.ID
	list, err = ws.Snapshots(sess)
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, s := range list {
		names = append(names, s.Name)
	}
	if want := []string{id + ".start", id + ".end", id2 + ".start", id2 + ".call-2", id2 + ".call-3", id2 + ".end"}; !slices.Equal(names, want) {
		t.Errorf("with last 2, session snapshots %q, want %q", names, want)
	}

	// Snapshots that fail: error events, and the calls metered all the
	// same.
	h.runner.cfg.Workspace = failingSnaps{ws}
	third, err := h.runner.Run(ctx, TaskRequest{Session: sess, Prompt: "Write again"})
	evs = h.eventsOf(t, third.Execution.ID)
	if err != nil || third.Execution.Status != store.Completed {
		t.Fatalf("third run = %+v, %v\nevents:\n%s", third.Execution, err, dump(evs))
	}
	if n := countType(evs, stream.Error, "scripted snapshot failure"); n != 5 {
		t.Errorf("%d error events about failed snapshots, want 5 (start, 3 calls, end)\n%s", n, dump(evs))
	}
	if e := third.Execution; e.Turns != 3 || e.Tokens.Input != 300 || e.Tokens.Output != 30 {
		t.Errorf("third execution metered %d turns, %+v tokens; want 3 turns, 300 in, 30 out", e.Turns, e.Tokens)
	}
	if n := countType(evs, stream.ModelCall, `"snapshot"`); n != 0 {
		t.Errorf("%d model_call events name a snapshot that failed", n)
	}
}
