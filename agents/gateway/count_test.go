package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/modeltest"
)

// bigRequest is a call whose body is about size bytes (a long user
// message), as the CLI's first request is long for its tools and system
// prompt.
func bigRequest(size int, maxTokens string) string {
	head := `{"model":"claude-opus-4","max_tokens":` + maxTokens + `,"stream":true,"metadata":{"user_id":"u"},"system":"be brief","messages":[{"role":"user","content":"`
	return head + strings.Repeat("x", max(0, size-len(head)-4)) + `"}]}`
}

// countRequests are the count_tokens requests the provider received.
func (h *harness) countRequests() []modeltest.Request {
	var out []modeltest.Request
	for _, r := range h.up.Requests() {
		if r.Path == "/v1/messages/count_tokens" {
			out = append(out, r)
		}
	}
	return out
}

// syncBuffer is a log sink safe for the gateway's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var answer = modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("ok")}, Usage: modeltest.Usage{InputTokens: 3000, OutputTokens: 100}}

// TestCountUsed: a first call whose byte bound does not fit the budget
// is counted by the provider and goes on, bounded at the count and the
// margin; the count was asked without the message-only fields, and the
// model_call record says what bounded the call.
func TestCountUsed(t *testing.T) {
	h := newHarnessModel(t, modeltest.Config{Turns: []modeltest.Turn{answer}, Count: modeltest.Count{InputTokens: 3000}})
	// 120 kB at a token per byte is 121,024 tokens, $2.42 at the $20
	// cache-write price: more than $1. Counted: 3,000 tokens.
	budget := &Limits{USD: 1}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	resp := h.post(t, token, bigRequest(120_000, "1024"))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	counts := h.countRequests()
	if len(counts) != 1 {
		t.Fatalf("%d count requests, want 1", len(counts))
	}
	var sent map[string]json.RawMessage
	if err := json.Unmarshal(counts[0].Body, &sent); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"max_tokens", "stream", "metadata"} {
		if _, ok := sent[k]; ok {
			t.Errorf("the count was sent %s", k)
		}
	}
	for _, k := range []string{"model", "messages", "system"} {
		if _, ok := sent[k]; !ok {
			t.Errorf("the count was not sent %s", k)
		}
	}
	if got := counts[0].Header.Get("x-api-key"); got != realKey {
		t.Errorf("the count carried key %q, want the real one", got)
	}
	calls := h.modelCalls(t)
	if len(calls) != 1 {
		t.Fatalf("%d model calls, want 1", len(calls))
	}
	want := countedBound(3000, DefaultInputMargin) + int64(len(DefaultWrapUp)) + 64
	if c := calls[0]; c.InputBoundSource != BoundCounted || c.InputBound != want {
		t.Errorf("input bound %d from %q, want %d from counted", c.InputBound, c.InputBoundSource, want)
	}
	if usd, _ := budget.Spent(); usd > 1 || usd <= 0 {
		t.Errorf("spent $%v, want some of $1", usd)
	}
}

// TestCountFails: a count that fails (an error answer, a timeout) leaves
// the byte bound: the call is refused as before, a log line says why, and
// the agent sees the budget refusal, not the count's error.
func TestCountFails(t *testing.T) {
	for _, c := range []struct {
		name  string
		count modeltest.Count
	}{
		{"error answer", modeltest.Count{Error: &modeltest.APIError{Status: 500, Type: "api_error", Message: "boom"}}},
		{"timeout", modeltest.Count{InputTokens: 10, Delay: 3 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs syncBuffer
			h := newHarnessModel(t, modeltest.Config{Turns: []modeltest.Turn{answer}, Count: c.count}, func(cfg *Config) {
				cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
				cfg.CountTimeout = 200 * time.Millisecond
			})
			token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: &Limits{USD: 1}})
			resp := h.post(t, token, bigRequest(120_000, "1024"))
			body := string(readAll(t, resp))
			if resp.StatusCode != 400 || !strings.Contains(body, "Budget exceeded") || !strings.Contains(body, "121") {
				t.Errorf("status %d %s: want the budget refusal from the byte bound", resp.StatusCode, body)
			}
			if len(h.up.MessageRequests()) != 0 {
				t.Error("the call was forwarded on a failed count")
			}
			if !strings.Contains(logs.String(), "counting a call's input tokens failed") {
				t.Errorf("no log line for the failed count: %q", logs.String())
			}
		})
	}
}

// TestCountSkipped: no count when it cannot change the decision: a call
// whose byte bound fits, a call without a dollar limit, and a call
// bounded from a recent counted one (few uncounted bytes).
func TestCountSkipped(t *testing.T) {
	turns := []modeltest.Turn{answer, answer, answer, answer}
	h := newHarnessModel(t, modeltest.Config{Turns: turns, Count: modeltest.Count{InputTokens: 3000}})
	// 20 kB: 21,024 tokens, $0.42 at $20: fits $10 with the 1,024 output
	// tokens asked.
	roomy := h.gw.Register(Execution{Session: "s", ID: "roomy", Budget: &Limits{USD: 10}})
	for range 2 {
		resp := h.post(t, roomy, bigRequest(20_000, "1024"))
		readAll(t, resp)
	}
	free := h.gw.Register(Execution{Session: "s", ID: "free"})
	readAll(t, h.post(t, free, bigRequest(120_000, "1024")))
	if n := len(h.countRequests()); n != 0 {
		t.Errorf("%d count requests for calls whose bound fits, want 0", n)
	}
	// A tight budget: the first call is counted; the second, the same
	// conversation with a little appended, is bounded from the first's
	// billed 3,000 tokens without a count.
	tight := h.gw.Register(Execution{Session: "s", ID: "tight", Budget: &Limits{USD: 1}})
	first := bigRequest(120_000, "1024")
	readAll(t, h.post(t, tight, first))
	second := strings.TrimSuffix(first, `}]}`) + `},{"role":"assistant","content":"ok"},{"role":"user","content":"more"}]}`
	resp := h.post(t, tight, second)
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("second call: status %d %s", resp.StatusCode, body)
	}
	if n := len(h.countRequests()); n != 1 {
		t.Errorf("%d count requests, want 1 (the tight budget's first call)", n)
	}
	calls := h.modelCalls(t)
	if got := calls[len(calls)-1].InputBoundSource; got != BoundPrefix {
		t.Errorf("second call bounded from %q, want prefix", got)
	}
	if got := calls[0].InputBoundSource; got != BoundBytes {
		t.Errorf("roomy call bounded from %q, want bytes", got)
	}
}

// FuzzParseCount: any answer from the provider is read as a count in
// range or refused, never a panic.
func FuzzParseCount(f *testing.F) {
	for _, s := range []string{`{"input_tokens":30000}`, `{"input_tokens":-1}`, `{"input_tokens":1e3}`, `{"input_tokens":"5"}`,
		`{"input_tokens":1.5}`, `[]`, `null`, `{"input_tokens":99999999999999999999}`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseCount(b)
		if err == nil && (n < 0 || n > 1<<40) {
			t.Fatalf("parseCount(%q) = %d", b, n)
		}
	})
}

// TestParseCount: the answers a provider can give.
func TestParseCount(t *testing.T) {
	for in, want := range map[string]int64{`{"input_tokens":30000}`: 30000, `{"input_tokens":0}`: 0, `{"input_tokens":1e3}`: 1000} {
		if n, err := parseCount([]byte(in)); err != nil || n != want {
			t.Errorf("parseCount(%s) = %d, %v; want %d", in, n, err, want)
		}
	}
	for _, in := range []string{`{"input_tokens":-1}`, `{"input_tokens":"5"}`, `{}`, `oops`, `{"input_tokens":1.5}`, `{"input_tokens":` + strings.Repeat("9", 20) + `}`,
		`{"x":"` + strings.Repeat("a", maxCountAnswer) + `","input_tokens":1}`} {
		if n, err := parseCount([]byte(in)); err == nil {
			t.Errorf("parseCount(%.40s) = %d, want an error", in, n)
		}
	}
}

// TestHostileCountedBody: an agent cannot have one thing counted and
// another billed: a counted call is forwarded with each top-level key
// once, the same fields the count was sent, whatever duplicate or
// escaped keys its body had.
func TestHostileCountedBody(t *testing.T) {
	h := newHarnessModel(t, modeltest.Config{Turns: []modeltest.Turn{answer, answer}, Count: modeltest.Count{InputTokens: 3000}})
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: &Limits{USD: 1}})
	huge := `[{"role":"user","content":"` + strings.Repeat("y", 120_000) + `"}]`
	for _, body := range []string{
		`{"model":"claude-opus-4","max_tokens":1024,"messages":` + huge + `,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"claude-opus-4","max_tokens":1024,"messages":[{"role":"user","content":"hi"}],"m\u0065ssages":` + huge + `,"system":"a","system":"` + strings.Repeat("z", 5000) + `"}`,
	} {
		resp := h.post(t, token, body)
		if b := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	counts, msgs := h.countRequests(), h.up.MessageRequests()
	if len(counts) != 2 || len(msgs) != 2 {
		t.Fatalf("%d counts and %d messages, want 2 and 2", len(counts), len(msgs))
	}
	for i := range msgs {
		for k, n := range topKeys(t, msgs[i].Body) {
			if n != 1 {
				t.Errorf("call %d forwarded with %d %q keys", i, n, k)
			}
		}
		var counted, billed map[string]json.RawMessage
		json.Unmarshal(counts[i].Body, &counted)
		json.Unmarshal(msgs[i].Body, &billed)
		for _, k := range []string{"messages", "system", "model"} {
			if !bytes.Equal(counted[k], billed[k]) {
				t.Errorf("call %d: %s counted %.60s, forwarded %.60s", i, k, counted[k], billed[k])
			}
		}
	}
}
