package gateway

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"hearth/agents/modeltest"
	"hearth/agents/stream"
)

// TestRecord: with Config.Record, each call's start is recorded before
// the provider sees it, its finish (same call id) before the budget is
// charged, and a call whose start cannot be recorded is refused with a
// retryable 529 without reaching the provider.
func TestRecord(t *testing.T) {
	var (
		mu       sync.Mutex
		recorded []ModelCallPayload
		failing  bool
		h        *harness
		seenAt   []int // provider requests seen when each record was written
	)
	h = newHarness(t, []modeltest.Turn{{Blocks: []modeltest.Block{modeltest.Text("hi")}, Usage: modeltest.Usage{InputTokens: 10, OutputTokens: 5}}},
		func(c *Config) {
			c.Record = func(ev stream.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if failing {
					return errors.New("disk full")
				}
				var p ModelCallPayload
				if ev.Type != stream.ModelCall || json.Unmarshal(ev.Payload, &p) != nil || ev.Execution != "e" {
					t.Errorf("recorded %+v", ev)
				}
				recorded = append(recorded, p)
				seenAt = append(seenAt, len(h.up.Requests()))
				return nil
			}
		})
	budget := &Limits{}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	const first = `{"model":"claude-opus-4","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
	readAll(t, h.post(t, token, first))
	mu.Lock()
	if len(recorded) != 2 || recorded[0].Phase != PhaseStart || recorded[1].Phase != "" || recorded[0].Call == "" ||
		recorded[0].Call != recorded[1].Call || recorded[1].OutputTokens != 5 || seenAt[0] != 0 || seenAt[1] != 1 {
		t.Errorf("records %+v written with %v provider requests seen; want a start before the call and its finish after", recorded, seenAt)
	}
	// 1000 output tokens at $100/M, and a token per byte of the body
	// plus the margin at the cache-write price, $20/M.
	if p, want := recorded[0], (1000*100+float64(len(first)+DefaultInputMargin)*20)/1e6; !approx(p.MaxUSD, want) {
		t.Errorf("start record max_usd %v, want %v", p.MaxUSD, want)
	}
	failing = true
	mu.Unlock()
	if n := len(h.modelCalls(t)); n != 0 {
		t.Errorf("%d model_call events went to OnEvent too, want 0: Record stored them", n)
	}

	resp := h.post(t, token, request(true, hello))
	readAll(t, resp)
	if resp.StatusCode != 529 || resp.Header.Get("x-should-retry") != "true" {
		t.Errorf("a call whose start could not be recorded: %d, want a retryable 529", resp.StatusCode)
	}
	if n := len(h.up.Requests()); n != 1 {
		t.Errorf("%d calls reached the provider, want 1", n)
	}
	if usd, turns := budget.Spent(); turns != 1 || !approx(usd, (10*10+5*100)/1e6) {
		t.Errorf("charged $%v for %d turns, want the one call", usd, turns)
	}
	if n := len(h.eventsOf(stream.Error)); n != 1 {
		t.Errorf("%d error events, want 1 saying the start could not be recorded", n)
	}
}
