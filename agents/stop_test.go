package agents

import (
	"context"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/vmm"
)

// TestStopUnansweringMachine: an execution cancelled while its machine
// does not answer (frozen, as a wedged VM is) ends within its bounds,
// cancelled, saying the machine stopped answering, and the machine is
// destroyed: no wait on it is unbounded.
func TestStopUnansweringMachine(t *testing.T) {
	const killWait = 2 * time.Second
	h := newHarnessWith(t, harnessOptions{model: modeltest.Config{Turns: []modeltest.Turn{
		{Blocks: []modeltest.Block{bash(busy(300))}},
	}}, limits: Limits{USD: 500, WallTime: Duration(time.Hour)}, killWait: killWait})
	e, done := h.start(t, TaskRequest{Agent: "analyst", Prompt: "go"})
	var m vmm.Machine
	select {
	case m = <-h.machines:
	case <-time.After(120 * time.Second):
		t.Fatal("no machine was created in 120s")
	}
	for deadline := time.Now().Add(120 * time.Second); countType(h.eventsOf(t, e.ID), stream.ToolCall, "sleep 300") == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no tool call in 120s:\n%s", dump(h.eventsOf(t, e.ID)))
		}
	}
	if err := m.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := h.runner.Cancel(e.ID); err != nil {
		t.Fatal(err)
	}
	// TERM and KILL each wait up to killWait to be delivered, then the
	// grace period, then killWait for the end: 9s here, with room.
	var r ran
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("Run did not return in 60s after Cancel with the machine frozen")
	}
	took := time.Since(t0)
	ex := r.res.Execution
	t.Logf("ended %s after %v: %s", ex.Status, took.Round(time.Millisecond), ex.Error)
	if ex.Status != store.Cancelled || !strings.Contains(ex.Error, "stopped answering") {
		t.Errorf("execution %s (%q), %v: want cancelled, saying its machine stopped answering\n%s", ex.Status, ex.Error, r.err, dump(h.eventsOf(t, e.ID)))
	}
	if took < 2*killWait {
		t.Errorf("Run returned %v after Cancel: want it to have waited for the frozen machine first", took)
	}
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Error("the frozen machine was not destroyed with its execution")
	}
}
