package agents

import (
	"context"
	"encoding/json"
	"testing"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// TestRunRetryShown: the provider answers the real claude CLI's first
// call 529 overloaded_error; the CLI retries, and its api_retry line is a
// retry event in the stream, before the call that succeeds. The run
// completes with exact totals: the 529 is metered as a call that cost
// nothing and counts no model call (no message came), the retry as the
// one model call, 300 input tokens at $1000 per million = $0.30.
func TestRunRetryShown(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Error: modeltest.Overloaded()},
		{Blocks: []modeltest.Block{modeltest.Text("done after a retry")}, Usage: modeltest.Usage{InputTokens: 300, OutputTokens: 7}},
	}, Limits{USD: 500, Turns: 5}) // the dollars are not what is checked: room for the hard cap's bound of each attempt (about $117 at a token per byte: harnessOptions.price)
	res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "say done"})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil {
		t.Fatalf("Run = %v\nevents:\n%s", err, dump(evs))
	}
	e := res.Execution
	if e.Status != store.Completed || e.Turns != 1 || e.Tokens.Input != 300 || e.Tokens.Output != 7 ||
		e.USD < 0.2999999 || e.USD > 0.3000001 || e.Result != "done after a retry" {
		t.Errorf("execution = %+v, want completed after 1 model call, 300/7 tokens, $0.30\nevents:\n%s", e, dump(evs))
	}
	var retry, calls []int // indexes in the stream
	for i, ev := range evs {
		switch ev.Type {
		case stream.Retry:
			retry = append(retry, i)
			var raw map[string]any
			json.Unmarshal(ev.Payload, &raw)
			if raw["attempt"] != 1.0 || raw["status"] != 529.0 || raw["max_retries"] == nil || raw["delay_ms"] == nil {
				t.Errorf("retry event %s: want attempt 1, status 529, max_retries and delay_ms", ev.Payload)
			}
			t.Logf("retry event: %s", ev.Payload)
		case stream.ModelCall:
			var p gateway.ModelCallPayload
			json.Unmarshal(ev.Payload, &p)
			if p.Phase == gateway.PhaseStart {
				continue
			}
			calls = append(calls, i)
			want := map[int]float64{0: 529, 1: 200}[len(calls)-1]
			if float64(p.Status) != want || (p.Status == 529 && (p.USD != 0 || p.InputTokens != 0)) {
				t.Errorf("model call %d: %s; want status %v, a 529 costing nothing", len(calls), ev.Payload, want)
			}
		}
	}
	if len(retry) != 1 || len(calls) != 2 || !(calls[0] < retry[0] && retry[0] < calls[1]) {
		t.Errorf("retry events at %v, model calls at %v: want one retry between the 529 and the call that succeeded\nevents:\n%s", retry, calls, dump(evs))
	}
}
