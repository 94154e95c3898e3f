package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/agents/stream"
)

// familyPrices has an entry of its own for claude-opus-4-8 and a family
// entry, claude-opus-4, that prices the other Opus 4 models.
var familyPrices = NewPrices(map[string]Price{
	"claude-opus-4":   {Input: 15, Output: 75, CacheRead: 1.5, CacheWrite: 18.75},
	"claude-opus-4-8": {Input: 5, Output: 25, CacheRead: 0.5, CacheWrite: 6.25},
})

func modelRequest(model string) string {
	return strings.Replace(request(true, hello), "claude-opus-4", model, 1)
}

// TestFallbackPriceWarning: a model priced only by its family's entry is
// forwarded at that price, and its execution gets one warning event
// naming the price used, however many calls it makes; a model with its
// own entry (dated or with a [1m] suffix) gets none.
func TestFallbackPriceWarning(t *testing.T) {
	usage := modeltest.Usage{InputTokens: 1000, OutputTokens: 100}
	turn := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("ok")}, Usage: usage}
	h := newHarness(t, []modeltest.Turn{turn, turn, turn, turn}, func(c *Config) { c.Prices = familyPrices })
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	for _, model := range []string{"claude-opus-4-9", "claude-opus-4-9", "claude-opus-4-8-20260101", "claude-opus-4-8[1m]"} {
		resp := h.post(t, token, modelRequest(model))
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
		}
	}
	warnings := h.eventsOf(stream.Warning)
	if len(warnings) != 1 {
		t.Fatalf("%d warning events, want 1 (for claude-opus-4-9, once)", len(warnings))
	}
	var w WarningPayload
	if err := json.Unmarshal(warnings[0].Payload, &w); err != nil {
		t.Fatal(err)
	}
	if w.Model != "claude-opus-4-9" || w.Pattern != "claude-opus-4" || w.PriceUsed == nil || w.PriceUsed.Input != 15 || w.PriceUsed.Output != 75 ||
		!strings.Contains(w.Message, `"claude-opus-4" entry`) || warnings[0].Execution != "e" {
		t.Errorf("warning = %+v %s, want claude-opus-4-9 priced by claude-opus-4 at $15/$75", w, warnings[0].Payload)
	}
	// The scripted provider answers with the requested model's name, so
	// each call is metered at the price its model resolves to:
	// 1000 input and 100 output tokens at $15/$75 = 0.015 + 0.0075 = $0.0225,
	// and at $5/$25 = 0.005 + 0.0025 = $0.0075.
	calls := h.modelCalls(t)
	want := []float64{0.0225, 0.0225, 0.0075, 0.0075}
	if len(calls) != len(want) {
		t.Fatalf("%d model calls, want %d", len(calls), len(want))
	}
	for i, c := range calls {
		if !approx(c.USD, want[i]) {
			t.Errorf("call %d (%s): $%v, want $%v", i, c.Model, c.USD, want[i])
		}
	}
	// Another execution is told again.
	other := h.gw.Register(Execution{Session: "s", ID: "e2"})
	readAll(t, h.post(t, other, modelRequest("claude-opus-4-9")))
	if n := len(h.eventsOf(stream.Warning)); n != 2 {
		t.Errorf("%d warning events after a second execution used the model, want 2", n)
	}
}

// TestUnpricedRefuse: with Unpriced "refuse", a call for a model priced
// only by a fallback entry never reaches the provider; the agent gets a
// 400 that says why and what to do, and the stream an error event. A
// model with its own entry still runs.
func TestUnpricedRefuse(t *testing.T) {
	turn := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("ok")}, Usage: modeltest.Usage{InputTokens: 10}}
	h := newHarness(t, []modeltest.Turn{turn}, func(c *Config) { c.Prices = familyPrices; c.Unpriced = UnpricedRefuse })
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	resp := h.post(t, token, modelRequest("claude-opus-4-9"))
	var e struct{ Error apiError }
	json.Unmarshal(readAll(t, resp), &e)
	if resp.StatusCode != 400 || e.Error.Type != "invalid_request_error" ||
		!strings.Contains(e.Error.Message, `unpriced = "refuse"`) || !strings.Contains(e.Error.Message, "add the model to the price file") {
		t.Errorf("fallback-priced model with refuse: %d %+v", resp.StatusCode, e)
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Errorf("%d refused calls reached the provider", n)
	}
	errs := h.eventsOf(stream.Error)
	if len(errs) != 1 || !strings.Contains(string(errs[0].Payload), "claude-opus-4-9") {
		t.Errorf("error events %v, want one naming the model", errs)
	}
	if n := len(h.eventsOf(stream.Warning)); n != 0 {
		t.Errorf("%d warning events for a refused call, want 0", n)
	}
	resp = h.post(t, token, modelRequest("claude-opus-4-8"))
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Errorf("a model with its own price, with refuse: %d %s", resp.StatusCode, b)
	}
	if _, err := New(Config{Upstream: "http://x", APIKey: "k", Prices: familyPrices, Unpriced: "warn"}); err == nil || !strings.Contains(err.Error(), `"fallback" or "refuse"`) {
		t.Errorf("New(Unpriced: warn) = %v, want an error naming the choices", err)
	}
}

// TestHostileModelNames: an agent that names a new model in every call,
// or a huge one, cannot make the gateway write a warning event (and log
// line) per call or echo its name whole: at most maxPriceWarnings
// models are warned of, one more event says the rest are not, and every
// name in the stream is cut to maxModelName bytes. The calls are still
// metered, at the fallback price.
func TestHostileModelNames(t *testing.T) {
	var turns []modeltest.Turn
	for range 30 {
		turns = append(turns, modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("ok")}, Usage: modeltest.Usage{InputTokens: 1000}})
	}
	prices := NewPrices(map[string]Price{"claude-opus-4": {Input: 15, Output: 75}, DefaultModel: {Input: 100, Output: 100}})
	h := newHarness(t, turns, func(c *Config) { c.Prices = prices })
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	huge := "claude-opus-4-" + strings.Repeat("9", 100_000)
	for i := range 29 {
		model := fmt.Sprintf("made-up-%d", i)
		if i == 3 {
			model = huge
		}
		resp := h.post(t, token, modelRequest(model))
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%d: %d %s", i, resp.StatusCode, b)
		}
	}
	warnings := h.eventsOf(stream.Warning)
	if len(warnings) != maxPriceWarnings+1 {
		t.Errorf("%d warning events for 29 fallback-priced models, want %d", len(warnings), maxPriceWarnings+1)
	}
	for _, w := range warnings {
		if len(w.Payload) > 2*maxModelName+500 {
			t.Errorf("a warning event of %d bytes: the model's name was not cut", len(w.Payload))
		}
	}
	if last := string(warnings[len(warnings)-1].Payload); !strings.Contains(last, "without a warning each") {
		t.Errorf("last warning %s, want the one that says the rest are not warned of", last)
	}
	// 1000 input tokens at the default $100 per million = $0.10 each;
	// the huge name is priced by claude-opus-4 at $15: $0.015.
	var usd float64
	for _, c := range h.modelCalls(t) {
		usd += c.USD
	}
	if !approx(usd, 28*0.1+0.015) {
		t.Errorf("metered $%v, want $%v", usd, 28*0.1+0.015)
	}
	// A huge unpriced name refused is cut too.
	refusing := newHarness(t, nil, func(c *Config) { c.Prices = NewPrices(map[string]Price{"claude-opus-4": {Input: 1, Output: 1}}) })
	tok := refusing.gw.Register(Execution{Session: "s", ID: "e"})
	resp := refusing.post(t, tok, modelRequest("gpt-"+strings.Repeat("x", 100_000)))
	if b := readAll(t, resp); resp.StatusCode != 400 || len(b) > 1000 {
		t.Errorf("huge unpriced model: %d, %d bytes of answer; want 400 naming the model cut", resp.StatusCode, len(b))
	}
	if errs := refusing.eventsOf(stream.Error); len(errs) != 1 || len(errs[0].Payload) > 1000 {
		t.Errorf("error events %d, first %d bytes; want one, the model cut", len(errs), len(errs[0].Payload))
	}
}
