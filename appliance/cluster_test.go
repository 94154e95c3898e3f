package appliance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/internal/pgtest"
)

// clusterDaemons starts one daemon per node id on one PostgreSQL
// database, each with its own state directory, jail tier and scripted
// model server (the same script), credits on.
func clusterDaemons(t *testing.T, script modeltest.Config, capacity map[string]int) (map[string]*agentEnv, string) {
	t.Helper()
	_, dbURL := pgtest.Start(t, pgtest.Options{})
	envs := map[string]*agentEnv{}
	for _, id := range []string{"node-a", "node-b", "node-c"} {
		if capacity[id] == 0 {
			continue
		}
		envs[id] = startAgentDaemon(t, script, func(cfg *Config) {
			cfg.Credits.Enabled = true
			cfg.Cluster = ClusterConfig{Database: dbURL, Node: id, Capacity: capacity[id], DeadAfter: Duration(4 * time.Second)}
		})
	}
	return envs, dbURL
}

// TestClusterDispatch: tasks started through node A's API are queued and
// run on A and B (A takes one at a time), each adopted by the node that
// ran it; every one completes with exactly what the script metered, and
// the shared ledger holds the exact sum. A resume runs on the node that
// ran its session.
func TestClusterDispatch(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("sleep 2", modeltest.Usage{InputTokens: 2000, OutputTokens: 50}),
		textTurn("done"),
	}}
	envs, _ := clusterDaemons(t, script, map[string]int{"node-a": 1, "node-b": 2})
	a := envs["node-a"]
	ctx := context.Background()
	if _, err := a.c.AddCredits(ctx, 10, "cluster budget"); err != nil {
		t.Fatal(err)
	}
	const tasks = 4
	ids := make([]string, tasks)
	var wg sync.WaitGroup
	errs := make(chan error, tasks)
	for i := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := a.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: fmt.Sprintf("task %d", i), Limits: Limits{Usd: 1}, Wait: true})
			if err == nil && e.Status != "completed" {
				err = fmt.Errorf("task %d ended %s: %s", i, e.Status, e.Error)
			}
			ids[i] = e.Id
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ran := map[string]int{}
	var sum float64
	for _, id := range ids {
		e, err := a.d.agents.store.GetExecution(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		ran[e.Node]++
		sum += e.USD
		// Two calls: 2000+1000 input tokens, 50+100 output.
		if e.Tokens.Input != 3000 || e.Tokens.Output != 150 || e.Turns != 2 || e.USD <= 0 {
			t.Errorf("execution %s on %s: %+v tokens, %d turns, $%v; want 3000 in, 150 out, 2 turns", id, e.Node, e.Tokens, e.Turns, e.USD)
		}
	}
	if ran["node-b"] == 0 || ran["node-a"]+ran["node-b"] != tasks {
		t.Errorf("executions ran %v; want all %d, some on node-b", ran, tasks)
	}
	cr, err := envs["node-b"].c.Credits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cr.Reserved != 0 || fmt.Sprintf("%.6f", cr.Spent) != fmt.Sprintf("%.6f", sum) || fmt.Sprintf("%.6f", cr.Available) != fmt.Sprintf("%.6f", 10-sum) {
		t.Errorf("ledger seen from node-b: %+v; want $%.6f spent of 10, none reserved", cr, sum)
	}

	// A resume of a session runs where the session ran last.
	first, _ := a.d.agents.store.GetExecution(ctx, ids[0])
	e, err := a.c.Delegate(ctx, DelegateRequest{Session: first.Session, Prompt: "again", Limits: Limits{Usd: 1}, Wait: true})
	if err != nil || e.Status != "completed" {
		t.Fatalf("resume = %+v, %v", e, err)
	}
	if got, _ := a.d.agents.store.GetExecution(ctx, e.Id); got.Node != first.Node || got.Kind != store.Resume {
		t.Errorf("resume ran on %s as %s; want on %s, where session %s ran", got.Node, got.Kind, first.Node, first.Session)
	}
}
