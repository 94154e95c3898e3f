package appliance

import (
	"context"
	"errors"
	"testing"
	"time"

	"hearth/agents"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/cluster"
)

// TestHostileClusterJob: jobs a node (or anyone writing to the shared
// database) forged are refused by the node that takes them: an execution
// that does not exist creates nothing; another node's running execution
// is left to it (not adopted, not run twice); a payload that does not
// decode strictly, or whose inputs or outputs climb out of the session,
// ends its pending execution interrupted without running it. A bogus job
// enqueued for real through River is refused the same way.
func TestHostileClusterJob(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("sleep 6", modeltest.Usage{InputTokens: 2000, OutputTokens: 50}),
		textTurn("done"),
	}}
	envs, _ := clusterDaemons(t, script, map[string]int{"node-a": 1, "node-b": 1})
	ctx := context.Background()
	a := envs["node-a"]
	st := a.d.agents.store

	if err := a.d.agents.cluster.run(ctx, cluster.Assignment{Execution: "exec-nope", Payload: []byte(`{"queued":{}}`)}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("job for no execution: %v; want not found", err)
	}
	if list, _ := st.ListExecutions(ctx, store.ExecutionFilter{}); len(list) != 0 {
		t.Errorf("a job for no execution made %d executions", len(list))
	}

	if _, err := a.c.AddCredits(ctx, 10, "budget"); err != nil {
		t.Fatal(err)
	}
	e, err := a.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "long", Limits: Limits{Usd: 1}})
	if err != nil {
		t.Fatal(err)
	}
	running := waitExecution(t, st, e.Id, time.Minute, func(e store.Execution) bool { return e.Status == store.Running })
	other := envs["node-a"]
	if running.Node == "node-a" {
		other = envs["node-b"]
	}
	err = other.d.agents.cluster.run(ctx, cluster.Assignment{Execution: e.Id, Payload: []byte(`{"queued":{}}`)})
	if !errors.Is(err, agents.ErrNotPending) {
		t.Errorf("job for %s's running execution taken by the other node: %v; want refused as not pending", running.Node, err)
	}
	if got, _ := st.GetExecution(ctx, e.Id); got.Node != running.Node || got.Status != store.Running {
		t.Errorf("after the forged job: %s on %s; want still running on %s", got.Status, got.Node, running.Node)
	}

	for _, payload := range []string{
		`{"queued":{"inputs":{"../../etc/cron.d/x":"eA=="}}}`,
		`{"queued":{"outputs":["../../../etc/*"]}}`,
		`{"queued":{},"node":"node-b"}`,
		`{"queued":{}} {"queued":{}}`,
		`not json`,
	} {
		pending, _, err := a.d.agents.runner.Record(ctx, agents.TaskRequest{Agent: "analyst", Prompt: "forged", Limits: agents.Limits{USD: 1}})
		if err != nil {
			t.Fatal(err)
		}
		err = a.d.agents.cluster.run(ctx, cluster.Assignment{Execution: pending.ID, Payload: []byte(payload)})
		got, _ := st.GetExecution(ctx, pending.ID)
		if !errors.Is(err, errBadJob) || got.Status != store.Interrupted || got.Started != (time.Time{}) {
			t.Errorf("payload %s: %v, execution %s started %v; want refused as a bad job, the execution interrupted unrun", payload, err, got.Status, got.Started)
		}
	}

	m, err := a.d.agents.cluster.current()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Enqueue(ctx, cluster.Job{Execution: "exec-forged", Image: "claude-code", Payload: []byte(`{"queued":{}}`)}); err != nil {
		t.Fatal(err)
	}
	if got := waitExecution(t, st, e.Id, time.Minute, func(e store.Execution) bool { return e.Status.Terminal() }); got.Status != store.Completed {
		t.Errorf("the execution forged jobs named ended %s: %s; want completed", got.Status, got.Error)
	}
	if _, err := st.GetExecution(ctx, "exec-forged"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the forged job's execution: %v; want none made", err)
	}
}
