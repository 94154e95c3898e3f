package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// sonnet is a current model's price, per million tokens.
var sonnet = gateway.Price{Input: 3, Output: 15, CacheRead: 0.30, CacheWrite: 3.75}

// bigCall is a scripted call that costs a large share of a small budget:
// 30,000 input tokens (about what the CLI's 115 kB request counts) and
// 20,000 output tokens (as many as its max_tokens lets through), $0.39
// at sonnet's price.
func bigCall(step string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{bash("mkdir -p outputs && echo " + step + " >> outputs/part.md")},
		Usage: modeltest.Usage{InputTokens: 30_000, OutputTokens: 20_000}}
}

// runaway is an agent that never stops by itself: every answer is
// another large tool call.
func runaway() modeltest.Config {
	final := bigCall("again")
	return modeltest.Config{Turns: []modeltest.Turn{bigCall("one"), bigCall("two")}, Final: &final}
}

// TestRunHardCap: a runaway agent whose every call is large, at several
// limits: spend never passes the limit, the warning is in the stream
// before the stop, and the provider saw max_tokens lowered.
func TestRunHardCap(t *testing.T) {
	worst := 0.0
	for _, limit := range []float64{0.05, 0.60, 1.00, 2.20} {
		t.Run(fmt.Sprintf("$%.2f", limit), func(t *testing.T) {
			h := newHarnessWith(t, harnessOptions{model: runaway(), limits: Limits{USD: limit, WallTime: Duration(5 * time.Minute)}, price: sonnet})
			res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "Loop forever"})
			evs := h.eventsOf(t, res.Execution.ID)
			if err != nil {
				t.Fatalf("Run = %v\n%s", err, dump(evs))
			}
			e := res.Execution
			ratio := e.USD / limit
			worst = max(worst, ratio)
			t.Logf("limit $%.2f: spent $%.4f (%.1f%%) in %d calls, %s", limit, e.USD, 100*ratio, e.Turns, e.Status)
			if e.Status != store.BudgetExceeded || e.USD > limit {
				t.Errorf("execution %s, $%v of $%v: want budget_exceeded within the limit\n%s", e.Status, e.USD, limit, dump(evs))
			}
			warn, exceeded := -1, -1
			for i, ev := range evs {
				if ev.Type != stream.Budget {
					continue
				}
				if strings.Contains(string(ev.Payload), `"level":"warn"`) && warn < 0 {
					warn = i
				}
				if strings.Contains(string(ev.Payload), `"level":"exceeded"`) && exceeded < 0 {
					exceeded = i
				}
			}
			if warn < 0 || exceeded < 0 || warn > exceeded {
				t.Errorf("warn event at %d, exceeded at %d: want the warning first\n%s", warn, exceeded, dump(evs))
			}
			sum := 0.0
			for _, ev := range evs {
				var p gateway.ModelCallPayload
				if ev.Type == stream.ModelCall && json.Unmarshal(ev.Payload, &p) == nil {
					sum += p.USD
				}
			}
			if math.Abs(sum-e.USD) > 1e-9 {
				t.Errorf("model calls add up to $%v, the execution says $%v", sum, e.USD)
			}
			reqs := h.model.MessageRequests()
			lowered := false
			for _, r := range reqs {
				lowered = lowered || r.Messages.MaxTokens < 20_000
			}
			if len(reqs) > 0 && !lowered {
				t.Errorf("no call's max_tokens was lowered below the 20,000 tokens a call would use: %d calls", len(reqs))
			}
			if n := countType(evs, stream.File, `".home/`); n > 0 {
				t.Errorf("%d file events from the agent's private home, want none", n)
			}
			var p map[string]any
			json.Unmarshal(evs[len(evs)-1].Payload, &p)
			if evs[len(evs)-1].Type != stream.Status || p["status"] != "budget_exceeded" {
				t.Errorf("last event = %s %s, want the budget_exceeded status", evs[len(evs)-1].Type, evs[len(evs)-1].Payload)
			}
		})
	}
	t.Logf("largest spend/limit ratio: %.4f", worst)
	if worst > 1 {
		t.Errorf("largest spend/limit ratio %v, want at most 1", worst)
	}
}

// awaitStatus waits (bounded) for an execution to reach status.
func awaitStatus(t *testing.T, h *harness, accepted <-chan store.Execution, status store.Status) store.Execution {
	t.Helper()
	var id string
	select {
	case e := <-accepted:
		id = e.ID
	case <-time.After(2 * time.Minute):
		t.Fatal("the execution was not accepted within 2 minutes")
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		e, err := h.store.GetExecution(context.Background(), id)
		if err == nil && e.Status == status {
			return e
		}
		if err == nil && e.Status.Terminal() {
			t.Fatalf("execution ended %s (%s) before it was %s\n%s", e.Status, e.Error, status, dump(h.eventsOf(t, id)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("execution %s not %s within 3 minutes\n%s", id, status, dump(h.eventsOf(t, id)))
	return store.Execution{}
}

// TestRunPauseTopUp: with on_budget = "pause" and credits on, the
// execution reaching its limit awaits budget (its call held, its machine
// paused); a top-up raises the limit and reserves the extra, the held
// call goes on, the CLI never sees an error, and the execution completes
// with exact totals: the calls' dollars and tokens, its own, and the
// ledger's.
func TestRunPauseTopUp(t *testing.T) {
	done := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("all done")}, Usage: modeltest.Usage{InputTokens: 31_000, OutputTokens: 100}}
	h := newHarnessWith(t, harnessOptions{
		model:  modeltest.Config{Turns: []modeltest.Turn{bigCall("one"), bigCall("two"), bigCall("three"), bigCall("four")}, Final: &done},
		limits: Limits{USD: 1, OnBudget: OnBudgetPause, WallTime: Duration(10 * time.Minute)}, price: sonnet})
	h.runner.cfg.Credits = true
	ctx := context.Background()
	if err := h.store.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan store.Execution, 1)
	type outcome struct {
		res Result
		err error
	}
	out := make(chan outcome, 1)
	go func() {
		res, err := h.runner.Run(WithAccepted(ctx, func(e store.Execution) { accepted <- e }), TaskRequest{Agent: "analyst", Prompt: "Work"})
		out <- outcome{res, err}
	}()
	paused := awaitStatus(t, h, accepted, store.AwaitingBudget)
	calls := len(h.model.MessageRequests())
	time.Sleep(500 * time.Millisecond) // held: nothing more reaches the provider
	if n := len(h.model.MessageRequests()); n != calls {
		t.Errorf("%d calls reached the provider while paused, want none", n-calls)
	}
	if _, err := h.runner.TopUp(ctx, paused.ID, math.Inf(1)); err == nil {
		t.Error("a top-up of +Inf dollars was taken")
	}
	e, err := h.runner.TopUp(ctx, paused.ID, 2)
	if err != nil || e.Limits.USD != 3 {
		t.Fatalf("TopUp = %+v, %v; want the limit at $3", e, err)
	}
	var o outcome
	select {
	case o = <-out:
	case <-time.After(5 * time.Minute):
		t.Fatal("the execution did not end within 5 minutes of the top-up")
	}
	evs := h.eventsOf(t, paused.ID)
	e = o.res.Execution
	if o.err != nil || e.Status != store.Completed || e.Result != "all done" {
		t.Fatalf("after the top-up: %+v, %v; want completed\n%s", e, o.err, dump(evs))
	}
	var usd float64
	var tokens store.Tokens
	n := 0
	for _, ev := range evs {
		var p gateway.ModelCallPayload
		if ev.Type != stream.ModelCall || json.Unmarshal(ev.Payload, &p) != nil {
			continue
		}
		n++
		usd += p.USD
		tokens.Input += p.InputTokens
		tokens.Output += p.OutputTokens
		if p.Status != 200 {
			t.Errorf("a call answered %d: %s", p.Status, p.Error)
		}
	}
	if math.Abs(usd-e.USD) > 1e-9 || tokens.Input != e.Tokens.Input || tokens.Output != e.Tokens.Output || n != e.Turns || n != len(h.model.MessageRequests()) {
		t.Errorf("calls: %d, $%v, %+v; execution: %d, $%v, %+v; provider saw %d calls", n, usd, tokens, e.Turns, e.USD, e.Tokens, len(h.model.MessageRequests()))
	}
	if e.USD <= 1 || e.USD > 3 {
		t.Errorf("spent $%v: want more than the first $1 (it went on) and at most the $3 after the top-up", e.USD)
	}
	avail, reserved, spent, err := h.store.Balance(ctx)
	if err != nil || reserved != 0 || math.Abs(spent-e.USD) > 1e-6 || math.Abs(avail-(10-e.USD)) > 1e-6 {
		t.Errorf("ledger: available %v, reserved %v, spent %v, %v; want %v, 0, %v", avail, reserved, spent, err, 10-e.USD, e.USD)
	}
	if n := countType(evs, stream.Text, "API Error"); n > 0 {
		t.Errorf("the CLI saw %d API errors, want none\n%s", n, dump(evs))
	}
	for _, want := range []string{`"status":"awaiting_budget"`, `"resumed":true`, `"status":"completed"`} {
		if countType(evs, stream.Status, want) != 1 {
			t.Errorf("want one status event with %s\n%s", want, dump(evs))
		}
	}
	if countType(evs, stream.Budget, `"level":"topped_up"`) != 1 || countType(evs, stream.Budget, `"level":"exceeded"`) != 0 {
		t.Errorf("want a topped_up budget event and no exceeded one\n%s", dump(evs))
	}
}

// TestRunPauseTimeout: no top-up comes within budget_wait: the execution
// ends budget_exceeded, saying so, its partial outputs kept.
func TestRunPauseTimeout(t *testing.T) {
	h := newHarnessWith(t, harnessOptions{model: runaway(), limits: Limits{USD: 1, OnBudget: OnBudgetPause, WallTime: Duration(10 * time.Minute)}, price: sonnet})
	h.runner.cfg.BudgetWait = 3 * time.Second
	start := time.Now()
	res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "Loop forever"})
	evs := h.eventsOf(t, res.Execution.ID)
	e := res.Execution
	if err != nil || e.Status != store.BudgetExceeded || !strings.Contains(e.Error, "no top-up came in 3s") || e.USD > 1 {
		t.Fatalf("after the wait: %+v, %v; want budget_exceeded within $1, saying no top-up came\n%s", e, err, dump(evs))
	}
	if strings.Join(res.Outputs, ",") != "outputs/part.md" {
		t.Errorf("outputs = %q, want the partial outputs/part.md kept", res.Outputs)
	}
	if countType(evs, stream.Status, `"status":"awaiting_budget"`) != 1 {
		t.Errorf("want one awaiting_budget status\n%s", dump(evs))
	}
	if time.Since(start) > 4*time.Minute {
		t.Errorf("took %v", time.Since(start))
	}
}

// TestRunPauseStopsTheClock: the wall-time limit does not run while the
// execution awaits a top-up: paused for longer than its whole wall time,
// it still completes after the top-up.
func TestRunPauseStopsTheClock(t *testing.T) {
	done := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("all done")}, Usage: modeltest.Usage{InputTokens: 31_000, OutputTokens: 100}}
	h := newHarnessWith(t, harnessOptions{
		model:  modeltest.Config{Turns: []modeltest.Turn{bigCall("one"), bigCall("two"), bigCall("three"), bigCall("four")}, Final: &done},
		limits: Limits{USD: 1, OnBudget: OnBudgetPause, WallTime: Duration(40 * time.Second)}, price: sonnet})
	ctx := context.Background()
	accepted := make(chan store.Execution, 1)
	out := make(chan Result, 1)
	go func() {
		res, _ := h.runner.Run(WithAccepted(ctx, func(e store.Execution) { accepted <- e }), TaskRequest{Agent: "analyst", Prompt: "Work"})
		out <- res
	}()
	paused := awaitStatus(t, h, accepted, store.AwaitingBudget)
	time.Sleep(45 * time.Second) // longer than the whole wall time
	if e, err := h.store.GetExecution(ctx, paused.ID); err != nil || e.Status != store.AwaitingBudget {
		t.Fatalf("after 45 s paused: %+v, %v; want still awaiting budget", e, err)
	}
	if _, err := h.runner.TopUp(ctx, paused.ID, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-out:
		if res.Execution.Status != store.Completed {
			t.Errorf("after the top-up: %+v; want completed, its wall time not spent while paused\n%s", res.Execution, dump(h.eventsOf(t, paused.ID)))
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("no end within 3 minutes of the top-up")
	}
}

// TestRetryUSD: a retry runs with its execution's USD limit, but a limit
// a top-up raised past the agent's starts again from the agent's.
func TestRetryUSD(t *testing.T) {
	def := &Definition{Limits: Limits{USD: 5}}
	for _, c := range []struct{ old, want float64 }{{2, 2}, {5, 5}, {6.5, 5}} {
		if got := RetryUSD(def, c.old); got != c.want {
			t.Errorf("RetryUSD(agent $5, $%v) = %v, want %v", c.old, got, c.want)
		}
	}
	if got := RetryUSD(&Definition{}, 6.5); got != 6.5 {
		t.Errorf("RetryUSD(agent without a limit, $6.50) = %v, want 6.5", got)
	}
}

// TestDelegateTopUpChild: a delegated child paused at its dollar limit
// is topped up out of what its parent has left, never from the balance:
// a top-up beyond the parent's rest is refused (ErrRefused, "top up the
// parent first") and changes nothing; one within it moves the extra from
// the parent's reservation to the child's, the held call goes on and the
// child completes. The ledger is exact: the child's reservations, spends
// and what went back to its parent, and the balance.
func TestDelegateTopUpChild(t *testing.T) {
	done := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("child done")}, Usage: modeltest.Usage{InputTokens: 31_000, OutputTokens: 100}}
	h := newHarnessWith(t, harnessOptions{price: sonnet, limits: Limits{USD: 10, Turns: 20, WallTime: Duration(10 * time.Minute)},
		model: modeltest.Config{Turns: []modeltest.Turn{
			{Match: modeltest.LastUserContains("PARENT-6"), Blocks: []modeltest.Block{waitFor("released-P")}, Usage: modeltest.Usage{InputTokens: 100}},
			{Match: modeltest.LastUserContains("released-P"), Blocks: []modeltest.Block{modeltest.Text("parent done")}, Usage: modeltest.Usage{InputTokens: 50}},
			bigCall("one"), bigCall("two"), bigCall("three"), bigCall("four"),
		}, Final: &done}})
	h.runner.cfg.Credits = true
	ctx := context.Background()
	if err := h.store.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	parent, parentDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "PARENT-6", Limits: Limits{USD: 3}})
	h.waitEvent(t, parent.ID, stream.File, "outputs/partial.md")
	h.waitCharged(t, parent.ID, 0.0003) // its first call: 100 tokens at $3 per million
	child, childDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "CHILD-T", Parent: parent.ID,
		Limits: Limits{USD: 1, OnBudget: OnBudgetPause}})
	accepted := make(chan store.Execution, 1)
	accepted <- child
	awaitStatus(t, h, accepted, store.AwaitingBudget)
	balance := func() string {
		avail, reserved, spent, err := h.store.Balance(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("available %d, reserved %d, spent %d", micros(avail), micros(reserved), micros(spent))
	}
	before := balance()

	// $3 - $0.0003 spent - $1 held for the child: $1.9997 left.
	_, err := h.runner.TopUp(ctx, child.ID, 2)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "top up the parent first") || !strings.Contains(err.Error(), "$2.00 left") {
		t.Errorf("a $2 top-up with $1.9997 left in the parent: %v, want refused, saying to top up the parent", err)
	}
	if got := balance(); got != before {
		t.Errorf("the refused top-up changed the balance: %s, was %s", got, before)
	}
	if e, _ := h.store.GetExecution(ctx, child.ID); e.Limits.USD != 1 || e.Status != store.AwaitingBudget {
		t.Errorf("after the refused top-up the child is %s with $%v, want still awaiting budget at $1", e.Status, e.Limits.USD)
	}
	e, err := h.runner.TopUp(ctx, child.ID, 1.5)
	if err != nil || e.Limits.USD != 2.5 {
		t.Fatalf("a $1.50 top-up within what the parent has left = %+v, %v; want the limit at $2.50", e, err)
	}
	if got := balance(); got != before {
		t.Errorf("the top-up took from the balance: %s, was %s; want it moved within the parent's reservation", got, before)
	}
	// The parent's rest is now $0.4997: a child may not ask more.
	if _, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "more", Parent: parent.ID, Limits: Limits{USD: 0.5}}); !errors.Is(err, ErrRefused) {
		t.Errorf("a second child asking $0.50 of the $0.4997 left: %v, want refused", err)
	}
	rc := wait(t, childDone, "the topped-up child")
	c := rc.Execution
	if c.Status != store.Completed || c.Result != "child done" || c.USD <= 1 || c.USD > 2.5 {
		t.Fatalf("child = %+v; want completed past its first $1, within $2.50\n%s", c, dump(h.eventsOf(t, child.ID)))
	}
	h.release(t, parent.Session)
	rp := wait(t, parentDone, "the parent")
	p := rp.Execution
	if p.Status != store.Completed || micros(p.TotalUSD) != micros(p.USD)+micros(c.USD) {
		t.Errorf("parent = %+v; want completed, its total its own $%v and the child's $%v", p, p.USD, c.USD)
	}

	entries, err := h.store.CreditEntries(ctx, child.ID)
	if err != nil {
		t.Fatal(err)
	}
	var reserved, spent, released int64
	var kinds []string
	for _, en := range entries {
		switch en.Kind {
		case store.CreditReserved:
			reserved += micros(en.USD)
			if !strings.Contains(en.Note, "moved from "+parent.ID) {
				t.Errorf("a reservation of the child not from its parent: %+v", en)
			}
			kinds = append(kinds, fmt.Sprintf("reserved %d", micros(en.USD)))
		case store.CreditSpent:
			spent += micros(en.USD)
		case store.CreditReleased:
			released += micros(en.USD)
			kinds = append(kinds, fmt.Sprintf("released %d", micros(en.USD)))
		}
	}
	if reserved != 2_500_000 || spent != micros(c.USD) || released != 2_500_000-micros(c.USD) ||
		strings.Join(kinds, ", ") != fmt.Sprintf("reserved 1000000, reserved 1500000, released %d", 2_500_000-micros(c.USD)) {
		t.Errorf("child's ledger: %s, spent %d; want $1 and $1.50 from the parent, %d spent, the rest back", strings.Join(kinds, ", "), spent, micros(c.USD))
	}
	avail, res, sp, err := h.store.Balance(ctx)
	if err != nil || res != 0 || micros(sp) != micros(p.TotalUSD) || micros(avail) != micros(10)-micros(p.TotalUSD) {
		t.Errorf("balance: available %v, reserved %v, spent %v, %v; want 10 - %v, 0, %v", avail, res, sp, err, p.TotalUSD, p.TotalUSD)
	}
}
