package agents

import (
	"context"
	"errors"
	"testing"

	"hearth/agents/modeltest"
	"hearth/agents/store"
)

// TestRunRecorded: Record leaves a checked task's execution pending
// without running it; RunRecorded runs it with its inputs and output
// patterns (as a queue's node would), once: a second run, a delegated or
// a streamed-file task and an unknown execution are refused.
func TestRunRecorded(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{bash("mkdir -p outputs && cp inputs/data.txt outputs/copy.txt")}},
		{Blocks: []modeltest.Block{modeltest.Text("copied")}},
	}, Limits{USD: 500})
	ctx := context.Background()
	e, q, err := h.runner.Record(ctx, TaskRequest{Agent: "analyst", Prompt: "Copy the data", Inputs: map[string][]byte{"data.txt": []byte("42\n")}, Outputs: []string{"outputs/*.txt"}})
	if err != nil || e.Status != store.Pending || string(q.Inputs["data.txt"]) != "42\n" {
		t.Fatalf("Record = %+v, %+v, %v; want a pending execution and its inputs", e, q, err)
	}
	if _, _, err := h.runner.Record(ctx, TaskRequest{Agent: "analyst", Prompt: "x", Parent: e.ID}); !errors.Is(err, ErrNotPending) {
		t.Errorf("Record of a delegated task = %v, want ErrNotPending", err)
	}
	if _, _, err := h.runner.Record(ctx, TaskRequest{Agent: "analyst", Prompt: "x", InputFiles: map[string]string{"a": "/etc/passwd"}}); !errors.Is(err, ErrNotPending) {
		t.Errorf("Record of a task with streamed files = %v, want ErrNotPending", err)
	}
	res, err := h.runner.RunRecorded(ctx, e.ID, q)
	if err != nil || res.Execution.Status != store.Completed || res.Execution.ID != e.ID || len(res.Outputs) != 1 || res.Outputs[0] != "outputs/copy.txt" {
		t.Fatalf("RunRecorded = %+v (outputs %v), %v\n%s", res.Execution, res.Outputs, err, dump(h.eventsOf(t, e.ID)))
	}
	if _, err := h.runner.RunRecorded(ctx, e.ID, q); !errors.Is(err, ErrNotPending) {
		t.Errorf("RunRecorded again = %v, want ErrNotPending", err)
	}
	if _, err := h.runner.RunRecorded(ctx, "exec-nope", q); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RunRecorded of no execution = %v, want not found", err)
	}
}
