package agents

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// opus45 is the price of Claude Opus 4.5 and later, per million tokens.
var opus45 = gateway.Price{Input: 5, Output: 25, CacheRead: 0.50, CacheWrite: 6.25}

// modelCalls are the model_call events of evs that reached the provider.
func modelCalls(t *testing.T, evs []stream.Event) []gateway.ModelCallPayload {
	t.Helper()
	var out []gateway.ModelCallPayload
	for _, ev := range evs {
		var p gateway.ModelCallPayload
		if ev.Type == stream.ModelCall && json.Unmarshal(ev.Payload, &p) == nil && p.MessageID != "" {
			out = append(out, p)
		}
	}
	return out
}

// TestRunCountedFirstCall: with the real claude CLI, a limit below what
// the first request bounds at a token per byte ($0.20 on Sonnet: its
// ~115 kB bound at $3.75 per million is about $0.43) now makes its first
// call, its input counted by the provider, and a runaway agent still ends
// within the limit, warned before it is stopped.
func TestRunCountedFirstCall(t *testing.T) {
	model := runaway()
	model.Count = modeltest.Count{InputTokens: 30_000} // what the scripted calls bill
	const limit = 0.20
	h := newHarnessWith(t, harnessOptions{model: model, limits: Limits{USD: limit, WallTime: Duration(5 * time.Minute)}, price: sonnet})
	res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "Loop forever"})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil {
		t.Fatalf("Run = %v\n%s", err, dump(evs))
	}
	e := res.Execution
	calls := modelCalls(t, evs)
	t.Logf("limit $%.2f: spent $%.4f in %d calls, %s", limit, e.USD, len(calls), e.Status)
	if len(calls) == 0 {
		t.Fatalf("no model call reached the provider\n%s", dump(evs))
	}
	first := calls[0]
	t.Logf("first call: input bound %d tokens (%s), $%.4f", first.InputBound, first.InputBoundSource, first.USD)
	if first.InputBoundSource != gateway.BoundCounted || first.InputBound > 40_000 || first.USD <= 0 {
		t.Errorf("first call bounded at %d from %q for $%v: want the count's ~31,500 tokens", first.InputBound, first.InputBoundSource, first.USD)
	}
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
	if n := len(h.model.MessageRequests()); n != len(calls) {
		t.Errorf("the provider answered %d calls, the stream has %d", n, len(calls))
	}
}

// TestRunOpus48: the CLI's default model, claude-opus-4-8, for which it
// sends a system message inside messages, runs to completion against the
// scripted provider, under a limit ($0.50) below its first request's byte
// bound at Opus 4.5 prices (about $0.73).
func TestRunOpus48(t *testing.T) {
	done := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("all done")}, Usage: modeltest.Usage{InputTokens: 30_000, OutputTokens: 100}}
	model := modeltest.Config{Turns: []modeltest.Turn{{Blocks: []modeltest.Block{bash("mkdir -p outputs && echo hi > outputs/a.md")},
		Usage: modeltest.Usage{InputTokens: 30_000, OutputTokens: 200}}}, Final: &done, Count: modeltest.Count{InputTokens: 30_000}}
	h := newHarnessWith(t, harnessOptions{model: model, limits: Limits{USD: 0.50, WallTime: Duration(5 * time.Minute)}, price: opus45, agentModel: "claude-opus-4-8"})
	res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "Write outputs/a.md"})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil {
		t.Fatalf("Run = %v\n%s", err, dump(evs))
	}
	e := res.Execution
	calls := modelCalls(t, evs)
	t.Logf("claude-opus-4-8: %s, $%.4f in %d calls", e.Status, e.USD, len(calls))
	if e.Status != store.Completed || len(calls) < 2 || e.USD > 0.50 {
		t.Errorf("execution %s, %d calls, $%v: want completed in 2 calls or more within $0.50\n%s", e.Status, len(calls), e.USD, dump(evs))
	}
	system := 0
	for _, r := range h.model.Requests() {
		if r.Status != 200 {
			t.Errorf("the provider refused %s: %d %s", r.Path, r.Status, r.Error)
		}
		if r.Messages != nil {
			for _, m := range r.Messages.Messages {
				if m.Role == "system" {
					system++
				}
			}
		}
	}
	t.Logf("system messages inside messages: %d", system)
}
