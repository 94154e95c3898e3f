package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/internal/money"
)

// waitFor is a shell loop that holds an agent's tool call until the test
// puts outputs/go in its session (release), then prints word; bounded
// below the CLI's two-minute tool timeout.
func waitFor(word string) modeltest.Block {
	return bash("mkdir -p outputs && echo partial > outputs/partial.md && for i in $(seq 500); do [ -e outputs/go ] && break; sleep 0.2; done; echo " + word)
}

// release lets the agent of session out of its waitFor.
func (h *harness) release(t *testing.T, session string) {
	t.Helper()
	uid := 1000 + h.runner.cfg.Driver.Capabilities().HostIDOffset
	if err := h.runner.cfg.Workspace.WriteFile(session, "outputs/go", strings.NewReader("go"), uid, uid); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits, at most a minute, until the stream of exec has an
// event of type typ whose payload contains s.
func (h *harness) waitEvent(t *testing.T, exec string, typ stream.Type, s string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for countType(h.eventsOf(t, exec), typ, s) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no %s event with %q in %s after a minute:\n%s", typ, s, exec, dump(h.eventsOf(t, exec)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitCharged waits, at most a minute, until the running exec has been
// charged usd (the gateway records a call before it charges it).
func (h *harness) waitCharged(t *testing.T, exec string, usd float64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		h.runner.mu.Lock()
		ru := h.runner.runs[exec]
		h.runner.mu.Unlock()
		if ru != nil {
			if spent, _ := ru.budget.Spent(); micros(spent) == micros(usd) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not charged $%v in a minute", exec, usd)
		}
	}
}

type ran struct {
	res Result
	err error
}

// start runs req in the background and returns its execution once the
// runner accepted it, and where its end arrives.
func (h *harness) start(t *testing.T, req TaskRequest) (store.Execution, <-chan ran) {
	t.Helper()
	accepted := make(chan store.Execution, 1)
	done := make(chan ran, 1)
	ctx := WithAccepted(context.Background(), func(e store.Execution) { accepted <- e })
	go func() {
		res, err := h.runner.Run(ctx, req)
		done <- ran{res, err}
	}()
	select {
	case e := <-accepted:
		return e, done
	case r := <-done:
		t.Fatalf("Run(%+v) ended before it was accepted: %v", req, r.err)
	case <-time.After(time.Minute):
		t.Fatalf("Run(%+v) not accepted after a minute", req)
	}
	return store.Execution{}, nil
}

func wait(t *testing.T, done <-chan ran, what string) Result {
	t.Helper()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.res
	case <-time.After(3 * time.Minute):
		t.Fatalf("%s has not ended after 3 minutes", what)
	}
	return Result{}
}

func micros(usd float64) int64 { return money.Micros(usd) }

// newDelegateHarness is newHarness for the delegation tests, whose
// children have limits of tens of cents: too little for the hard cap's
// bound of a first call at the toy price (about $117 at a token per
// byte). So the model is priced at $10 per million input tokens (a cent
// is 1,000 tokens, a dollar 100,000) and the scripted provider counts
// every body (count_tokens) at the most input any turn of the script
// bills: an honest count, never below what the call is billed. A first
// call is then bounded at that count, 1% of it, the gateway's default
// margin (1,024) and the wrap-up's room (157 tokens): 11,281 tokens
// ($0.11281) for a count of 10,000. A later call is bounded by the
// tokens billed for the call it continues plus the bytes it adds.
func newDelegateHarness(t *testing.T, turns []modeltest.Turn, limits Limits) *harness {
	t.Helper()
	most := 0
	for _, turn := range turns {
		most = max(most, turn.Usage.InputTokens+turn.Usage.CacheReadInputTokens+turn.Usage.CacheCreationInputTokens)
	}
	return newHarnessWith(t, harnessOptions{model: modeltest.Config{Turns: turns, Count: modeltest.Count{InputTokens: most}},
		limits: limits, price: gateway.Price{Input: 10}})
}

// TestDelegateTree: a parent (the real claude CLI, held in a tool call)
// delegates to two children at once, each with a USD limit carved out of
// the parent's; a third is refused (max children), a grandchild is
// refused (depth), a delegation asking more than the parent has left is
// refused; a third child's next call does not fit what is left of its
// carved budget: the hard cap refuses it before it is forwarded, so the
// child ends budget_exceeded having spent less than its limit, while the
// parent goes on. Every figure is exact: each
// execution's dollars and tokens, the parent's totals with its
// children's, the child events in its stream, and the credit ledger.
//
// At $10 per million (newDelegateHarness), a cent is 1,000 tokens; the
// provider counts every body at 10,000 tokens (the most a turn bills),
// so each first call is bounded at $0.11281 and fits each limit here.
func TestDelegateTree(t *testing.T) {
	// The parent's calls cost $0.10 and $0.05, a's $0.10 and $0.03, b's
	// $0.04 and $0.04, c's first $0.08.
	h := newDelegateHarness(t, []modeltest.Turn{
		{Match: modeltest.LastUserContains("PARENT-1"), Blocks: []modeltest.Block{waitFor("released-P")}, Usage: modeltest.Usage{InputTokens: 10_000}},
		{Match: modeltest.LastUserContains("released-P"), Blocks: []modeltest.Block{modeltest.Text("parent done")}, Usage: modeltest.Usage{InputTokens: 5_000}},
		{Match: modeltest.LastUserContains("CHILD-A"), Blocks: []modeltest.Block{waitFor("released-A")}, Usage: modeltest.Usage{InputTokens: 10_000}},
		{Match: modeltest.LastUserContains("released-A"), Blocks: []modeltest.Block{modeltest.Text("a done")}, Usage: modeltest.Usage{InputTokens: 3_000}},
		{Match: modeltest.LastUserContains("CHILD-B"), Blocks: []modeltest.Block{waitFor("released-B")}, Usage: modeltest.Usage{InputTokens: 4_000}},
		{Match: modeltest.LastUserContains("released-B"), Blocks: []modeltest.Block{modeltest.Text("b done")}, Usage: modeltest.Usage{InputTokens: 4_000}},
		{Match: modeltest.LastUserContains("CHILD-C"), Blocks: []modeltest.Block{bash("echo c-step")}, Usage: modeltest.Usage{InputTokens: 8_000}},
	}, Limits{USD: 10, Turns: 20, WallTime: Duration(10 * time.Minute)})
	h.runner.cfg.Credits, h.runner.cfg.MaxDepth, h.runner.cfg.MaxChildren = true, 1, 2
	ctx := context.Background()
	if err := h.store.AddCredits(ctx, 5, "test"); err != nil {
		t.Fatal(err)
	}
	parent, parentDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "PARENT-1",
		Limits: Limits{USD: 1, Turns: 10, WallTime: Duration(5 * time.Minute)}})
	h.waitEvent(t, parent.ID, stream.File, "outputs/partial.md")
	h.waitCharged(t, parent.ID, 0.1)

	// $1 - $0.10 spent: $0.90 left.
	_, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "too dear", Parent: parent.ID, Limits: Limits{USD: 0.95}})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "asked $0.95, the parent has $0.90 left") {
		t.Errorf("asking $0.95 of $0.90 left: %v, want refused saying so", err)
	}
	_, err = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "no limit", Parent: parent.ID})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "give a usd limit of at most $0.90") {
		t.Errorf("a child of a $10 agent asking no limit: %v, want refused with the most it may ask", err)
	}

	a, aDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "CHILD-A", Parent: parent.ID, Limits: Limits{USD: 0.3}})
	b, bDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "CHILD-B", Parent: parent.ID, Limits: Limits{USD: 0.2}})
	if a.Parent != parent.ID || a.Depth != 1 || a.Limits.USD != 0.3 || a.Limits.Turns != 9 ||
		a.Limits.WallTime > 5*time.Minute || a.Limits.WallTime < 4*time.Minute || a.Session == parent.Session {
		t.Errorf("child a = %+v; want parent %s, depth 1, $0.30, the parent's 9 turns left, under its 5m, a session of its own", a, parent.ID)
	}
	h.waitEvent(t, a.ID, stream.File, "outputs/partial.md")
	h.waitEvent(t, b.ID, stream.File, "outputs/partial.md")
	_, err = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "third", Parent: parent.ID, Limits: Limits{USD: 0.1}})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already has 2 children running") {
		t.Errorf("a third child with max_children 2: %v, want refused", err)
	}
	_, err = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "grandchild", Parent: a.ID, Limits: Limits{USD: 0.1}})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "depth 2") {
		t.Errorf("a grandchild with max_depth 1: %v, want refused", err)
	}
	h.release(t, a.Session) // one after the other: the ledger's order is theirs
	ra := wait(t, aDone, "child a")
	h.release(t, b.Session)
	rb := wait(t, bDone, "child b")
	for _, c := range []struct {
		e      store.Execution
		usd    float64
		tokens int64
	}{{ra.Execution, 0.13, 13_000}, {rb.Execution, 0.08, 8_000}} {
		if c.e.Status != store.Completed || micros(c.e.USD) != micros(c.usd) || c.e.Tokens.Input != c.tokens ||
			micros(c.e.TotalUSD) != micros(c.usd) {
			t.Errorf("child %s = %+v; want completed, $%v and %d tokens", c.e.ID, c.e, c.usd, c.tokens)
		}
	}

	// A child with $0.15: its first call (bounded at $0.11281) is
	// forwarded and costs $0.08; its next call is bounded at the 8,000
	// tokens billed for the first, the bytes it adds and the margins, more
	// than the $0.07 left, so the gateway refuses it before it is
	// forwarded: the child ends budget_exceeded with $0.08 spent, never
	// past its limit, the warning before the exceeded event, and the
	// parent goes on.
	rc, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "CHILD-C", Parent: parent.ID, Limits: Limits{USD: 0.15}})
	if err != nil || rc.Execution.Status != store.BudgetExceeded || micros(rc.Execution.USD) != micros(0.08) ||
		rc.Execution.Tokens.Input != 8_000 || rc.Execution.USD > rc.Execution.Limits.USD {
		t.Errorf("child c = %+v, %v; want budget_exceeded after $0.08", rc.Execution, err)
	}
	warned, exceeded := -1, -1
	for i, ev := range h.eventsOf(t, rc.Execution.ID) {
		if ev.Type == stream.Budget && strings.Contains(string(ev.Payload), `"level":"warn"`) && warned < 0 {
			warned = i
		}
		if ev.Type == stream.Budget && strings.Contains(string(ev.Payload), `"level":"exceeded"`) && exceeded < 0 {
			exceeded = i
		}
	}
	if warned < 0 || exceeded < 0 || warned > exceeded {
		t.Errorf("child c's budget events: warn at %d, exceeded at %d; want the warning first\n%s", warned, exceeded, dump(h.eventsOf(t, rc.Execution.ID)))
	}
	h.release(t, parent.Session)
	rp := wait(t, parentDone, "the parent")
	p := rp.Execution
	evs := h.eventsOf(t, p.ID)
	if p.Status != store.Completed || micros(p.USD) != micros(0.15) || p.Tokens.Input != 15_000 || p.Turns != 2 {
		t.Errorf("parent = %+v; want completed, its own $0.15, 15000 tokens, 2 turns\n%s", p, dump(evs))
	}
	if micros(p.TotalUSD) != micros(0.15+0.13+0.08+0.08) || p.TotalTokens.Input != 15_000+13_000+8_000+8_000 {
		t.Errorf("parent totals $%v, %d tokens; want $0.44 and 44000 (its own and its three children's)", p.TotalUSD, p.TotalTokens.Input)
	}
	var got []string
	for _, ev := range evs {
		if ev.Type != stream.Child {
			continue
		}
		var c ChildPayload
		if err := json.Unmarshal(ev.Payload, &c); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %d", c.Execution, c.Status, micros(c.USD)))
	}
	want := []string{a.ID + " pending 0", b.ID + " pending 0", a.ID + " completed 130000", b.ID + " completed 80000",
		rc.Execution.ID + " pending 0", rc.Execution.ID + " budget_exceeded 80000"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("child events in the parent's stream:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if kids, _ := h.store.Children(ctx, p.ID); len(kids) != 3 {
		t.Errorf("Children(parent) = %d, want 3", len(kids))
	}

	// The ledger: the root reserved $1 from the balance, each child's
	// limit moved to it and its unspent rest back (a: $0.30 - $0.13 =
	// $0.17; b: $0.20 - $0.08 = $0.12; c: $0.15 - $0.08 = $0.07), every
	// spend recorded once against the execution that made it, the root's
	// rest released: $1 - $0.10 - $0.30 - $0.20 + $0.17 + $0.12 - $0.15
	// + $0.07 - $0.05 = $0.56. Spent in all: $0.44 of the $5.
	avail, reserved, spent, err := h.store.Balance(ctx)
	if err != nil || micros(avail) != micros(5-0.44) || reserved != 0 || micros(spent) != micros(0.44) {
		t.Errorf("balance: available %v, reserved %v, spent %v; want 4.56, 0, 0.44", avail, reserved, spent)
	}
	ledger := func(exec string) string {
		entries, err := h.store.CreditEntries(ctx, exec)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, fmt.Sprintf("%s %d %s", e.Kind, micros(e.USD), e.Note))
		}
		return strings.Join(out, "; ")
	}
	for exec, want := range map[string]string{
		p.ID: "reserved 1000000 ; spent 100000 ; released 300000 moved to " + a.ID + "; released 200000 moved to " + b.ID +
			"; reserved 170000 moved from " + a.ID + "; reserved 120000 moved from " + b.ID + "; released 150000 moved to " + rc.Execution.ID +
			"; reserved 70000 moved from " + rc.Execution.ID + "; spent 50000 ; released 560000 ",
		a.ID:            "reserved 300000 moved from " + p.ID + "; spent 100000 ; spent 30000 ; released 170000 moved to " + p.ID,
		rc.Execution.ID: "reserved 150000 moved from " + p.ID + "; spent 80000 ; released 70000 moved to " + p.ID,
	} {
		if got := ledger(exec); got != want {
			t.Errorf("ledger of %s:\n%s\nwant\n%s", exec, got, want)
		}
	}
	// A finished execution delegates no more.
	if _, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "late", Parent: p.ID, Limits: Limits{USD: 0.1}}); !errors.Is(err, ErrNotFound) {
		t.Errorf("delegating from the ended parent: %v, want not found (not running)", err)
	}
}

// TestDelegateCancel: cancelling a parent stops its running child first:
// the child ends cancelled, saying why, with its partial outputs kept;
// then the parent ends cancelled.
//
// At $10 per million (newDelegateHarness) the parent's first call costs
// $0.01 and the child's $0.02; both are counted at 2,000 tokens.
func TestDelegateCancel(t *testing.T) {
	h := newDelegateHarness(t, []modeltest.Turn{
		{Match: modeltest.LastUserContains("PARENT-2"), Blocks: []modeltest.Block{waitFor("released-P")}, Usage: modeltest.Usage{InputTokens: 1_000}},
		{Match: modeltest.LastUserContains("CHILD-D"), Blocks: []modeltest.Block{waitFor("released-D")}, Usage: modeltest.Usage{InputTokens: 2_000}},
	}, Limits{USD: 10, Turns: 20})
	parent, parentDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "PARENT-2", Limits: Limits{USD: 1}})
	h.waitEvent(t, parent.ID, stream.File, "outputs/partial.md")
	d, dDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "CHILD-D", Parent: parent.ID, Limits: Limits{USD: 0.5}})
	h.waitEvent(t, d.ID, stream.File, "outputs/partial.md")
	if err := h.runner.Cancel(parent.ID); err != nil {
		t.Fatal(err)
	}
	rp, rd := wait(t, parentDone, "the parent"), wait(t, dDone, "the child")
	if rd.Execution.Status != store.Cancelled || !strings.Contains(rd.Execution.Error, "its parent "+parent.ID) ||
		!strings.Contains(strings.Join(rd.Outputs, ","), "outputs/partial.md") {
		t.Errorf("child = %+v, outputs %v; want cancelled by its parent, outputs/partial.md kept", rd.Execution, rd.Outputs)
	}
	if rp.Execution.Status != store.Cancelled || rd.Execution.Ended.After(rp.Execution.Ended) {
		t.Errorf("parent = %+v; want cancelled, ended after its child (%v)", rp.Execution, rd.Execution.Ended)
	}
	if micros(rp.Execution.TotalUSD) != micros(0.03) {
		t.Errorf("parent total $%v, want $0.03 (its $0.01 and the child's $0.02)", rp.Execution.TotalUSD)
	}
	if countType(h.eventsOf(t, parent.ID), stream.Child, `"status":"cancelled"`) != 1 {
		t.Errorf("no child event for the cancelled child in the parent's stream:\n%s", dump(h.eventsOf(t, parent.ID)))
	}
}

// TestHostileDelegation: what an agent might try through delegation
// (its MCP server passes the caller's own execution as the parent, but
// the runner does not rely on it): naming a parent that is not running
// here, or a session of another tree, and getting more turns, wall time
// or dollars through a child than it has itself. Each is refused and
// nothing is recorded for it.
//
// At $10 per million (newDelegateHarness) the parent's first call costs
// $0.10, leaving it $0.40 of its $0.50.
func TestHostileDelegation(t *testing.T) {
	h := newDelegateHarness(t, []modeltest.Turn{
		{Match: modeltest.LastUserContains("PARENT-3"), Blocks: []modeltest.Block{waitFor("released-P")}, Usage: modeltest.Usage{InputTokens: 10_000}},
		{Match: modeltest.LastUserContains("released-P"), Blocks: []modeltest.Block{modeltest.Text("done")}},
	}, Limits{USD: 10, Turns: 20, WallTime: Duration(10 * time.Minute)})
	ctx := context.Background()
	parent, parentDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "PARENT-3",
		Limits: Limits{USD: 0.5, Turns: 3, WallTime: Duration(2 * time.Minute)}})
	h.waitEvent(t, parent.ID, stream.File, "outputs/partial.md")
	h.waitCharged(t, parent.ID, 0.1)
	before, _ := h.store.ListExecutions(ctx, store.ExecutionFilter{})
	for _, tc := range []struct {
		name string
		req  TaskRequest
		want string
	}{
		{"unknown parent", TaskRequest{Parent: "exec-00000000", Limits: Limits{USD: 0.1}}, "not running here"},
		{"another session", TaskRequest{Parent: parent.ID, Session: parent.Session, Limits: Limits{USD: 0.1}}, "new session of its own"},
		{"more turns", TaskRequest{Parent: parent.ID, Limits: Limits{USD: 0.1, Turns: 5}}, "asked 5 turns, the parent has 2 left"},
		{"more wall time", TaskRequest{Parent: parent.ID, Limits: Limits{USD: 0.1, WallTime: Duration(5 * time.Minute)}}, "asked a wall time of 5m0s"},
		{"more dollars", TaskRequest{Parent: parent.ID, Limits: Limits{USD: 0.45}}, "asked $0.45, the parent has $0.40 left"},
		{"a parent's own limits", TaskRequest{Parent: parent.ID, Limits: Limits{USD: 0.5}}, "the parent has $0.40 left"},
	} {
		tc.req.Agent, tc.req.Prompt = "analyst", "escape"
		_, err := h.runner.Run(ctx, tc.req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.want)
		}
	}
	after, _ := h.store.ListExecutions(ctx, store.ExecutionFilter{})
	if len(after) != len(before) {
		t.Errorf("%d executions recorded for refused delegations, want none", len(after)-len(before))
	}
	h.release(t, parent.Session)
	if rp := wait(t, parentDone, "the parent"); rp.Execution.Status != store.Completed {
		t.Errorf("parent = %+v, want completed", rp.Execution)
	}
	// Its tree is over: a delegation naming it is refused as well.
	if _, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "late", Parent: parent.ID, Limits: Limits{USD: 0.1}}); err == nil {
		t.Errorf("delegating from an ended execution succeeded")
	}
}

// TestDelegateDetachReattach: a runner that detaches leaves a parent and
// its child running; taken up again (the child first), they are a tree
// again: the parent's budget holds the child's limit (a delegation asking
// more than is left is refused) and cancelling the parent stops the
// child first.
//
// At $10 per million (newDelegateHarness) the parent's first call costs
// $0.10 and the child's $0.05.
func TestDelegateDetachReattach(t *testing.T) {
	h := newDelegateHarness(t, []modeltest.Turn{
		{Match: modeltest.LastUserContains("PARENT-4"), Blocks: []modeltest.Block{waitFor("released-P")}, Usage: modeltest.Usage{InputTokens: 10_000}},
		{Match: modeltest.LastUserContains("CHILD-E"), Blocks: []modeltest.Block{waitFor("released-E")}, Usage: modeltest.Usage{InputTokens: 5_000}},
	}, Limits{USD: 10, Turns: 20})
	ctx := context.Background()
	parent, parentDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "PARENT-4", Limits: Limits{USD: 1}})
	h.waitEvent(t, parent.ID, stream.File, "outputs/partial.md")
	kid, kidDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "CHILD-E", Parent: parent.ID, Limits: Limits{USD: 0.3}})
	h.waitEvent(t, kid.ID, stream.File, "outputs/partial.md")
	h.waitCharged(t, parent.ID, 0.1)
	h.waitCharged(t, kid.ID, 0.05)
	h.runner.Detach()
	for _, done := range []<-chan ran{kidDone, parentDone} {
		select {
		case r := <-done:
			if !errors.Is(r.err, ErrDetached) {
				t.Fatalf("Run after Detach: %v, want ErrDetached", r.err)
			}
		case <-time.After(time.Minute):
			t.Fatal("Run did not return a minute after Detach")
		}
	}
	reattach := func(id string) <-chan ran {
		m, err := h.runner.cfg.Driver.Recover(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan ran, 1)
		go func() {
			res, err := h.runner.Reattach(ctx, id, m)
			done <- ran{res, err}
		}()
		h.waitEvent(t, id, stream.Status, `"reattached":true`)
		return done
	}
	kidDone = reattach(kid.ID)
	parentDone = reattach(parent.ID)
	var err error
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		_, err = h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "more", Parent: parent.ID, Limits: Limits{USD: 0.65}})
		if err == nil || !strings.Contains(err.Error(), "not running its agent") || time.Now().After(deadline) {
			break
		}
	}
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "asked $0.65, the parent has $0.60 left") {
		t.Errorf("after the take-up, asking $0.65: %v; want refused with $0.60 left ($1 - $0.10 spent - the child's $0.30)", err)
	}
	if err := h.runner.Cancel(parent.ID); err != nil {
		t.Fatal(err)
	}
	rp, rk := wait(t, parentDone, "the parent"), wait(t, kidDone, "the child")
	if rk.Execution.Status != store.Cancelled || !strings.Contains(rk.Execution.Error, "its parent "+parent.ID) {
		t.Errorf("child = %s %q; want cancelled by its parent", rk.Execution.Status, rk.Execution.Error)
	}
	if rp.Execution.Status != store.Cancelled || micros(rp.Execution.TotalUSD) != micros(0.15) || rk.Execution.Ended.After(rp.Execution.Ended) {
		t.Errorf("parent = %s, total $%v, ended %v (child %v); want cancelled after its child, $0.15", rp.Execution.Status,
			rp.Execution.TotalUSD, rp.Execution.Ended, rk.Execution.Ended)
	}
}

// TestDelegatePausedChildEnds: a child paused at its dollar limit
// (on_budget = "pause", awaiting_budget, its model call held at the
// gateway) whose parent ends is cancelled like any child: its held call
// is let go with a refusal (the provider sees no more calls), the child
// ends cancelled, saying why, its partial outputs kept, before the
// parent's end is recorded; nothing waits for the day-long budget wait.
func TestDelegatePausedChildEnds(t *testing.T) {
	final := bigCall("again")
	h := newHarnessWith(t, harnessOptions{price: sonnet, limits: Limits{USD: 10, Turns: 20, WallTime: Duration(10 * time.Minute)},
		model: modeltest.Config{Turns: []modeltest.Turn{
			{Match: modeltest.LastUserContains("PARENT-5"), Blocks: []modeltest.Block{waitFor("released-P")}, Usage: modeltest.Usage{InputTokens: 100}},
			{Match: modeltest.LastUserContains("released-P"), Blocks: []modeltest.Block{modeltest.Text("parent done")}, Usage: modeltest.Usage{InputTokens: 50}},
			bigCall("one"), bigCall("two"), bigCall("three"),
		}, Final: &final}})
	h.runner.cfg.BudgetWait = 24 * time.Hour
	parent, parentDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "PARENT-5", Limits: Limits{USD: 5}})
	h.waitEvent(t, parent.ID, stream.File, "outputs/partial.md")
	child, childDone := h.start(t, TaskRequest{Agent: "analyst", Prompt: "CHILD-P", Parent: parent.ID,
		Limits: Limits{USD: 1, OnBudget: OnBudgetPause}})
	accepted := make(chan store.Execution, 1)
	accepted <- child
	paused := awaitStatus(t, h, accepted, store.AwaitingBudget)
	if paused.Limits.OnBudget != OnBudgetPause {
		t.Errorf("the child's stored on_budget = %q, want pause", paused.Limits.OnBudget)
	}
	calls := len(h.model.MessageRequests())

	h.release(t, parent.Session) // the parent goes on to its end
	rp, rc := wait(t, parentDone, "the parent"), wait(t, childDone, "the paused child")
	evs := h.eventsOf(t, child.ID)
	if rc.Execution.Status != store.Cancelled || !strings.Contains(rc.Execution.Error, "its parent "+parent.ID) ||
		!strings.Contains(strings.Join(rc.Outputs, ","), "outputs/part.md") {
		t.Errorf("child = %+v, outputs %v; want cancelled by its parent, outputs/part.md kept\n%s", rc.Execution, rc.Outputs, dump(evs))
	}
	if rp.Execution.Status != store.Completed || rp.Execution.Result != "parent done" || rc.Execution.Ended.After(rp.Execution.Ended) {
		t.Errorf("parent = %+v; want completed, ended after its child (%v)", rp.Execution, rc.Execution.Ended)
	}
	// The parent's own two calls, and nothing more of the child's.
	if n := len(h.model.MessageRequests()); n != calls+1 {
		t.Errorf("the provider saw %d calls after the pause, want only the parent's last one", n-calls)
	}
	held := -1
	for i, ev := range evs {
		if ev.Type == stream.Status && strings.Contains(string(ev.Payload), `"status":"awaiting_budget"`) {
			held = i
		}
		if held >= 0 && i > held && ev.Type == stream.Budget && strings.Contains(string(ev.Payload), `"level":"exceeded"`) {
			held = -2 // the held call was refused after the pause
			break
		}
	}
	if held != -2 {
		t.Errorf("no refusal (budget exceeded) of the held call after the pause\n%s", dump(evs))
	}
	if rc.Execution.USD > 1 || micros(rp.Execution.TotalUSD) != micros(rp.Execution.USD+rc.Execution.USD) {
		t.Errorf("child $%v of $1; parent $%v, total $%v: want the child within its limit and in the parent's total",
			rc.Execution.USD, rp.Execution.USD, rp.Execution.TotalUSD)
	}
	if countType(h.eventsOf(t, parent.ID), stream.Child, `"status":"cancelled"`) != 1 {
		t.Errorf("no child event for the cancelled child in the parent's stream:\n%s", dump(h.eventsOf(t, parent.ID)))
	}
}
