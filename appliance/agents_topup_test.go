package appliance

import (
	"context"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
)

// bigTurn costs $0.39 at the built-in Sonnet price: 30,000 input tokens
// (about what the CLI's request counts) and 20,000 output tokens.
func bigTurn(step string) modeltest.Turn {
	return bashTurn("mkdir -p outputs && echo "+step+" >> outputs/part.md", modeltest.Usage{InputTokens: 30_000, OutputTokens: 20_000})
}

// awaitExecStatus polls an execution, bounded, until it has status.
func awaitExecStatus(t *testing.T, c *Client, id, status string) Execution {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		e, err := c.Execution(context.Background(), id)
		if err == nil && string(e.Status) == status {
			return e
		}
		if err == nil && Ended(e) {
			t.Fatalf("execution %s ended %s (%s) before it was %s\n%s", id, e.Status, e.Error, status, eventDump(allEvents(t, c, id)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("execution %s not %s within 3 minutes\n%s", id, status, eventDump(allEvents(t, c, id)))
	return Execution{}
}

// TestAgentsPauseTopUp: with [agents] on_budget = "pause" and credits
// on, an execution at its $1 limit awaits budget (the API says
// awaiting_budget); a top-up through the API reserves $2 more and it
// completes, charged exactly what was metered. A second one, paused, is
// cancelled by the daemon stopping: the next daemon shows it cancelled
// with its partial outputs, not lost.
func TestAgentsPauseTopUp(t *testing.T) {
	done := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("all done")}, Usage: modeltest.Usage{InputTokens: 31_000, OutputTokens: 100}}
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true,
		Turns: []modeltest.Turn{bigTurn("one"), bigTurn("two"), bigTurn("three"), bigTurn("four")}, Final: &done},
		func(cfg *Config) { cfg.Credits.Enabled = true; cfg.Agents.OnBudget = "pause" })
	ctx := context.Background()
	c := env.c
	if _, err := c.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	e, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "work", Limits: Limits{Usd: 1}})
	if err != nil {
		t.Fatal(err)
	}
	paused := awaitExecStatus(t, c, e.Id, "awaiting_budget")
	if paused.Usd > 1 {
		t.Errorf("spent $%v of $1 before the pause", paused.Usd)
	}
	_, err = c.TopUp(ctx, e.Id, 0.0000001)
	wantCode(t, err, "bad_request", 400)
	up, err := c.TopUp(ctx, e.Id, 2)
	if err != nil || up.Limits.Usd != 3 {
		t.Fatalf("TopUp = %+v, %v; want the limit at $3", up, err)
	}
	end := awaitExecStatus(t, c, e.Id, "completed")
	if end.Result != "all done" || end.Usd <= 1 || end.Usd > 3 {
		t.Errorf("after the top-up: %+v", end)
	}
	cr, err := c.Credits(ctx)
	if err != nil || cr.Reserved != 0 || cr.Spent < end.Usd-1e-6 || cr.Spent > end.Usd+1e-6 || cr.Available < 10-end.Usd-1e-6 || cr.Available > 10-end.Usd+1e-6 {
		t.Errorf("credits %+v, %v; want $%v spent, the rest available", cr, err, end.Usd)
	}
	if n := countEvents(allEvents(t, c, e.Id), "text", "API Error"); n > 0 {
		t.Errorf("the CLI saw %d API errors", n)
	}

	// Paused, then the daemon stops.
	second, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "work again", Limits: Limits{Usd: 1}})
	if err != nil {
		t.Fatal(err)
	}
	awaitExecStatus(t, c, second.Id, "awaiting_budget")
	closed := make(chan error, 1)
	go func() { closed <- env.d.Close() }()
	select {
	case <-closed:
	case <-time.After(2 * time.Minute):
		t.Fatal("the daemon did not stop within 2 minutes with an execution awaiting budget")
	}
	_, c2 := startSandboxDaemon(t, env.cfg)
	got, err := c2.Execution(ctx, second.Id)
	if err != nil || got.Status != "cancelled" || !strings.Contains(strings.Join(got.Outputs, ","), "outputs/part.md") {
		t.Errorf("after the daemon stopped: %+v, %v; want cancelled with outputs/part.md", got, err)
	}
	if cr, err := c2.Credits(ctx); err != nil || cr.Reserved != 0 {
		t.Errorf("credits after: %+v, %v; want nothing left reserved", cr, err)
	}
}

// TestAgentsPauseLeave: a daemon stopped under on_shutdown = "leave"
// while an execution awaits budget answers its held call with a
// retryable 529 and leaves it running; the next start takes it up, the
// agent's retried call is held again (awaiting_budget: the task's own
// on_budget = "pause", kept with the execution, not the appliance's
// default "stop"), and a top-up there completes it, nothing lost and the
// ledger exact.
func TestAgentsPauseLeave(t *testing.T) {
	done := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("all done")}, Usage: modeltest.Usage{InputTokens: 31_000, OutputTokens: 100}}
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true,
		Turns: []modeltest.Turn{bigTurn("one"), bigTurn("two"), bigTurn("three"), bigTurn("four")}, Final: &done},
		func(cfg *Config) {
			cfg.Credits.Enabled, cfg.Agents.OnShutdown = true, OnShutdownLeave // on_budget: the default, stop
		})
	ctx := context.Background()
	if _, err := env.c.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "work", Limits: Limits{Usd: 1, OnBudget: "pause"}})
	if err != nil {
		t.Fatal(err)
	}
	if e.Limits.OnBudget != "pause" {
		t.Errorf("limits.on_budget = %q in the execution view, want pause", e.Limits.OnBudget)
	}
	awaitExecStatus(t, env.c, e.Id, "awaiting_budget")
	t0 := time.Now()
	if err := env.d.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 30*time.Second {
		t.Errorf("Close took %v with an execution awaiting budget", took)
	}
	_, c := startSandboxDaemon(t, env.cfg)
	if again := awaitExecStatus(t, c, e.Id, "awaiting_budget"); again.Limits.OnBudget != "pause" {
		t.Errorf("limits.on_budget = %q after the restart, want pause", again.Limits.OnBudget)
	}
	if _, err := c.TopUp(ctx, e.Id, 2); err != nil {
		t.Fatal(err)
	}
	got := awaitExecStatus(t, c, e.Id, "completed")
	evs := allEvents(t, c, e.Id)
	if got.Result != "all done" || got.Usd <= 1 || got.Usd > 3 || countEvents(evs, "status", `"reattached":true`) != 1 {
		t.Errorf("after the next start: %+v\n%s", got, eventDump(evs))
	}
	cr, _ := c.Credits(ctx)
	if cr.Reserved != 0 || cr.Spent < got.Usd-1e-6 || cr.Spent > got.Usd+1e-6 {
		t.Errorf("credits after the run: %+v, want $%.4f spent and nothing reserved", cr, got.Usd)
	}
}
