package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/agents/stream"
)

const realKey = "sk-ant-real-key"

// Test prices: round numbers, USD per million tokens.
var testPrices = NewPrices(map[string]Price{
	"claude-opus-4": {Input: 10, Output: 100, CacheRead: 1, CacheWrite: 20},
})

// harness is a scripted provider behind a gateway served on loopback.
type harness struct {
	up  *modeltest.Server
	gw  *Gateway
	url string
	tee *teeTransport

	mu     sync.Mutex
	events []stream.Event
}

func newHarness(t testing.TB, turns []modeltest.Turn, tweak ...func(*Config)) *harness {
	t.Helper()
	return newHarnessModel(t, modeltest.Config{Turns: turns}, tweak...)
}

// newHarnessModel is newHarness with the scripted provider's whole
// configuration (its key is set to realKey).
func newHarnessModel(t testing.TB, model modeltest.Config, tweak ...func(*Config)) *harness {
	t.Helper()
	model.Key = realKey
	h := &harness{up: modeltest.New(model), tee: &teeTransport{}}
	if err := h.up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.up.Close)
	cfg := Config{
		Upstream: h.up.URL(), APIKey: realKey, Prices: testPrices, Transport: h.tee,
		OnEvent: func(e stream.Event) {
			h.mu.Lock()
			h.events = append(h.events, e)
			h.mu.Unlock()
		},
	}
	for _, f := range tweak {
		f(&cfg)
	}
	gw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.gw = gw
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

// teeTransport keeps a copy of every upstream response body, as the
// gateway read it.
type teeTransport struct {
	mu     sync.Mutex
	bodies []*bytes.Buffer
}

func (tt *teeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	b := &bytes.Buffer{}
	tt.mu.Lock()
	tt.bodies = append(tt.bodies, b)
	tt.mu.Unlock()
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.TeeReader(resp.Body, lockedWriter{&tt.mu, b}), resp.Body}
	return resp, nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (tt *teeTransport) last() []byte {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return bytes.Clone(tt.bodies[len(tt.bodies)-1].Bytes())
}

func (h *harness) post(t testing.TB, token, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", h.url+"/v1/messages?beta=true", strings.NewReader(body))
	req.Header.Set("x-api-key", token)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func (h *harness) eventsOf(typ stream.Type) []stream.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []stream.Event
	for _, e := range h.events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

func (h *harness) modelCalls(t testing.TB) []ModelCallPayload {
	var out []ModelCallPayload
	for _, e := range h.eventsOf(stream.ModelCall) {
		var p ModelCallPayload
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func (h *harness) budgetEvents(t testing.TB) []BudgetPayload {
	var out []BudgetPayload
	for _, e := range h.eventsOf(stream.Budget) {
		var p BudgetPayload
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func request(stream bool, messages string) string {
	return fmt.Sprintf(`{"model":"claude-opus-4","max_tokens":1024,"stream":%v,"messages":%s}`, stream, messages)
}

const hello = `[{"role":"user","content":"hello"}]`

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return b
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPassThroughIntact(t *testing.T) {
	turn := modeltest.Turn{
		Blocks: []modeltest.Block{modeltest.Text("Here — the plan."), modeltest.ToolUse("Bash", map[string]string{"command": "ls -la"})},
		Usage:  modeltest.Usage{InputTokens: 1200, OutputTokens: 80},
	}
	h := newHarness(t, []modeltest.Turn{turn, turn})
	token := h.gw.Register(Execution{Session: "s1", ID: "e1"})
	for _, streamed := range []bool{true, false} {
		resp := h.post(t, token, request(streamed, hello))
		got := readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("stream=%v: status %d: %s", streamed, resp.StatusCode, got)
		}
		if want := h.tee.last(); !bytes.Equal(got, want) || len(got) == 0 {
			t.Errorf("stream=%v: the agent got\n%s\nthe provider sent\n%s", streamed, got, want)
		}
		wantCT := map[bool]string{true: "text/event-stream; charset=utf-8", false: "application/json"}[streamed]
		if ct := resp.Header.Get("Content-Type"); ct != wantCT {
			t.Errorf("stream=%v: Content-Type %q, want %q", streamed, ct, wantCT)
		}
	}
}

func TestFirstByteBeforeUpstreamEnds(t *testing.T) {
	const delay = 40 * time.Millisecond
	h := newHarness(t, []modeltest.Turn{{Blocks: []modeltest.Block{modeltest.Text("slow words arriving")}, Delay: delay}})
	token := h.gw.Register(Execution{Session: "s1", ID: "e1"})
	resp := h.post(t, token, request(true, hello))
	r := bufio.NewReader(resp.Body)
	first, err := r.ReadString('\n')
	if err != nil || first != "event: message_start\n" {
		t.Fatalf("first line %q, %v", first, err)
	}
	firstAt := time.Now()
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	// message_start is followed by ping, 3 blocks events, 3 deltas,
	// message_delta and message_stop, each after a delay.
	if gap := time.Since(firstAt); gap < 6*delay {
		t.Errorf("the rest of the stream came %v after the first line; want >= %v (the first event was held back)", gap, 6*delay)
	}
	if !bytes.HasSuffix(rest, []byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")) {
		t.Errorf("stream ends %q", rest[max(0, len(rest)-80):])
	}
}

func TestMetering(t *testing.T) {
	usage := modeltest.Usage{InputTokens: 1000, OutputTokens: 200, CacheReadInputTokens: 5000, CacheCreationInputTokens: 300}
	turns := []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.Text("a")}, Usage: usage},
		{Blocks: []modeltest.Block{modeltest.Text("b")}, Usage: usage, Model: "claude-opus-4-8-20260101"},
	}
	h := newHarness(t, turns)
	budget := &Limits{}
	token := h.gw.Register(Execution{Session: "s1", ID: "e1", Budget: budget})
	readAll(t, h.post(t, token, request(true, hello)))
	readAll(t, h.post(t, token, request(false, hello)))

	calls := h.modelCalls(t)
	if len(calls) != 2 {
		t.Fatalf("%d model_call events, want 2", len(calls))
	}
	wantUSD := (1000*10 + 200*100 + 5000*1 + 300*20) / 1e6
	for i, c := range calls {
		if c.InputTokens != 1000 || c.OutputTokens != 200 || c.CacheReadTokens != 5000 || c.CacheCreationTokens != 300 ||
			!approx(c.USD, wantUSD) || c.Status != 200 || c.Error != "" || !strings.HasPrefix(c.MessageID, "msg_") {
			t.Errorf("call %d: %+v, want the scripted usage at $%v", i, c, wantUSD)
		}
	}
	if calls[0].Model != "claude-opus-4" || calls[1].Model != "claude-opus-4-8-20260101" {
		t.Errorf("models %q %q: want the model the provider named", calls[0].Model, calls[1].Model)
	}
	if usd, n := budget.Spent(); !approx(usd, 2*wantUSD) || n != 2 {
		t.Errorf("charged $%v for %d turns, want $%v for 2", usd, n, 2*wantUSD)
	}
	e := h.eventsOf(stream.ModelCall)[0]
	if e.Session != "s1" || e.Execution != "e1" || e.Time.IsZero() {
		t.Errorf("event %+v: want session s1, execution e1, a time", e)
	}
}

// TestOncePerMessageID: a provider that answers twice with the same
// message id is metered once.
func TestOncePerMessageID(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sampleSSE)
	}))
	t.Cleanup(upstream.Close)
	var mu sync.Mutex
	var calls []ModelCallPayload
	gw, err := New(Config{Upstream: upstream.URL, APIKey: realKey, Prices: NewPrices(map[string]Price{"claude-opus-4-8": {Input: 1, Output: 1}}),
		OnEvent: func(e stream.Event) {
			var p ModelCallPayload
			json.Unmarshal(e.Payload, &p)
			mu.Lock()
			calls = append(calls, p)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	budget := &Limits{}
	h := &harness{url: srv.URL}
	token := gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	for range 2 {
		readAll(t, h.post(t, token, `{"model":"claude-opus-4-8","max_tokens":5,"stream":true,"messages":[]}`))
	}
	if len(calls) != 2 || calls[0].OutputTokens != 25 || calls[0].Duplicate || calls[1].OutputTokens != 0 || !calls[1].Duplicate {
		t.Errorf("model_call events %+v: want msg_01 metered once (output 25, the last running total), then a duplicate", calls)
	}
	if usd, n := budget.Spent(); !approx(usd, (1200+25)/1e6) || n != 1 {
		t.Errorf("charged $%v for %d turns, want one message", usd, n)
	}
}

func TestTokens(t *testing.T) {
	h := newHarness(t, nil)
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	other := h.gw.Register(Execution{Session: "s", ID: "e2"})
	h.gw.Unregister(other)

	for _, tc := range []struct{ name, token string }{{"unknown", "sk-guess"}, {"none", ""}, {"unregistered", other}, {"the real key", realKey}} {
		resp := h.post(t, tc.token, request(true, hello))
		var e struct{ Error apiError }
		json.Unmarshal(readAll(t, resp), &e)
		if resp.StatusCode != 401 || e.Error.Type != "authentication_error" {
			t.Errorf("%s token: %d %+v, want 401 authentication_error", tc.name, resp.StatusCode, e)
		}
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Errorf("%d requests reached the provider, want 0", n)
	}

	// Bearer tokens work too; the token is never forwarded, the real key is.
	req, _ := http.NewRequest("POST", h.url+"/v1/messages?beta=true", strings.NewReader(request(true, hello)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	resp.Body.Close()
	readAll(t, h.post(t, token, request(false, hello)))
	reqs := h.up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests reached the provider, want 2", len(reqs))
	}
	for _, r := range reqs {
		if r.Status != 200 || r.Header.Get("X-Api-Key") != realKey || r.Header.Get("Authorization") != "" || r.Query != "beta=true" {
			t.Errorf("provider got %d, key %q, authorization %q, query %q", r.Status, r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"), r.Query)
		}
		for k, vs := range r.Header {
			if strings.Contains(strings.Join(vs, " "), token) {
				t.Errorf("the token was forwarded in header %s", k)
			}
		}
		if bytes.Contains(r.Body, []byte(token)) {
			t.Error("the token was forwarded in the body")
		}
	}
}

func TestRoutes(t *testing.T) {
	h := newHarness(t, nil)
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	resp, err := http.Get(h.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("GET / = %d, want 404", resp.StatusCode)
	}
	// count_tokens is forwarded (the scripted provider has no such route)
	// and not metered.
	req, _ := http.NewRequest("POST", h.url+"/v1/messages/count_tokens", strings.NewReader(request(false, hello)))
	req.Header.Set("x-api-key", token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reqs := h.up.Requests()
	if len(reqs) != 1 || reqs[0].Path != "/v1/messages/count_tokens" || reqs[0].Header.Get("X-Api-Key") != realKey {
		t.Errorf("count_tokens reached the provider as %+v", reqs)
	}
	if n := len(h.eventsOf(stream.ModelCall)); n != 0 {
		t.Errorf("%d model_call events for count_tokens, want 0", n)
	}
}

// TestWrapUpAndDeny: a $1.00 limit; calls cost $0.50, $0.30 (at 80%),
// then the third, whose worst case could pass 90%, carries the wrap-up
// and the warn event; at 90% the fourth goes with its max_tokens lowered
// to what is left, and the fifth, which cannot fit a minimal answer, is
// refused: spend never passes the limit.
func TestWrapUpAndDeny(t *testing.T) {
	cost := func(usd float64) modeltest.Usage { return modeltest.Usage{InputTokens: int(usd * 1e6 / 10)} }
	tool := modeltest.ToolUse("Bash", map[string]string{"command": "make report"})
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{tool}, Usage: cost(0.50)},
		{Blocks: []modeltest.Block{modeltest.ToolUse("Bash", map[string]string{"command": "ls"})}, Usage: cost(0.30)},
		{Match: modeltest.LastUserContains("Budget nearly used up"), Blocks: []modeltest.Block{modeltest.Text("Wrapping up.")}, Usage: cost(0.10)},
		{Blocks: []modeltest.Block{modeltest.Text("more")}, Usage: cost(0.05)},
	})
	budget := &Limits{USD: 1}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})

	history := `[{"role":"user","content":"write the report"},
		{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"done"}]}]`
	for i, body := range []string{request(true, hello), request(true, hello), request(true, history), request(true, hello)} {
		if resp := h.post(t, token, body); resp.StatusCode != 200 {
			t.Fatalf("call %d: status %d: %s", i+1, resp.StatusCode, readAll(t, resp))
		} else {
			readAll(t, resp)
		}
	}
	reqs := h.up.MessageRequests()
	if len(reqs) != 4 {
		t.Fatalf("%d calls reached the provider, want 4", len(reqs))
	}
	if strings.Contains(reqs[1].LastUserText(), DefaultWrapUp) {
		t.Error("call 2 (at 50%) carried the wrap-up instruction")
	}
	last := reqs[2].Messages.Messages[2].Content
	if len(last) != 2 || last[0].Type != "tool_result" || last[1].Type != "text" || last[1].Text != DefaultWrapUp {
		t.Errorf("call 3 (at 80%%, could pass 90%%): last user message %+v, want the tool result then the wrap-up text", last)
	}
	if got := h.budgetEvents(t); len(got) != 1 || got[0].Limit != "usd" || got[0].Level != "warn" || !approx(got[0].Used, 0.80) || got[0].Max != 1 {
		t.Errorf("budget events after the warned call: %+v, want one usd warn at 0.80", got)
	}
	// Call 4, at 90%: $0.10 left; its input is bounded at a token per
	// byte plus the margins, at the cache-write price, and max_tokens is
	// lowered to what the rest pays at $100/M (less a token against
	// float rounding).
	in := int64(len(request(true, hello))) + DefaultInputMargin + int64(len(DefaultWrapUp)) + 64
	want := int64(math.Floor((0.10-float64(in)*20/1e6)*1e6/100)) - 1
	if got := int64(reqs[3].Messages.MaxTokens); got < want-1 || got > want || want >= 1024 {
		t.Errorf("call 4 max_tokens %d, want it lowered to %d", got, want)
	}

	// Now at $0.95: $0.05 cannot pay the input bound and 256 output
	// tokens: refused before the provider, with an error the CLI does
	// not retry.
	resp := h.post(t, token, request(true, hello))
	var e struct{ Error apiError }
	json.Unmarshal(readAll(t, resp), &e)
	if resp.StatusCode != 400 || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, "Budget exceeded: usd limit") ||
		resp.Header.Get("x-should-retry") != "false" {
		t.Errorf("call 5: %d %+v x-should-retry %q; want 400 invalid_request_error, Budget exceeded, false", resp.StatusCode, e, resp.Header.Get("x-should-retry"))
	}
	if n := len(h.up.Requests()); n != 4 {
		t.Errorf("%d calls reached the provider, want 4", n)
	}
	got := h.budgetEvents(t)
	if len(got) != 2 || got[1].Level != "exceeded" || got[1].Limit != "usd" || !approx(got[1].Used, 0.95) {
		t.Errorf("budget events %+v: want warn then usd exceeded at 0.95", got)
	}
	if usd, turns := budget.Spent(); usd > 1 || turns != 4 {
		t.Errorf("spent $%v in %d turns, want at most the $1 limit in 4", usd, turns)
	}
}

func TestWrapUpStringContentAndTurns(t *testing.T) {
	h := newHarness(t, nil, func(c *Config) { c.WrapUp = "WRAP IT UP" })
	budget := &Limits{Turns: 3}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	for range 4 {
		readAll(t, h.post(t, token, request(false, hello)))
	}
	reqs := h.up.MessageRequests()
	if len(reqs) != 3 {
		t.Fatalf("%d calls reached the provider, want 3", len(reqs))
	}
	for i, r := range reqs {
		warned := strings.Contains(r.LastUserText(), "WRAP IT UP")
		if warned != (i == 2) {
			t.Errorf("call %d: wrap-up %v (user text %q), want only on the third", i+1, warned, r.LastUserText())
		}
	}
	if c := reqs[2].Messages.Messages[0].Content; len(c) != 2 || c[0].Text != "hello" {
		t.Errorf("string content became %+v, want [hello, wrap-up]", c)
	}
	want := []BudgetPayload{{"turns", 2, 3, "warn"}, {"turns", 3, 3, "exceeded"}}
	if got := h.budgetEvents(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("budget events %+v, want %+v", got, want)
	}
}

// TestOneCallInFlight: concurrent calls of one execution run one at a
// time, so the budget stops them as soon as a limit is reached.
func TestOneCallInFlight(t *testing.T) {
	turn := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("x")}, Usage: modeltest.Usage{InputTokens: 40_000}, Delay: 5 * time.Millisecond}
	h := newHarness(t, []modeltest.Turn{turn, turn, turn, turn, turn, turn})
	budget := &Limits{USD: 1} // each call costs $0.40
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	var wg sync.WaitGroup
	statuses := make(chan int, 6)
	for range 6 {
		wg.Go(func() {
			resp := h.post(t, token, request(true, hello))
			io.Copy(io.Discard, resp.Body)
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[200] != 3 || count[400] != 3 {
		t.Errorf("statuses %v, want 3 calls (0, 0.40, 0.80 spent before them) and 3 refusals", count)
	}
	if usd, _ := budget.Spent(); !approx(usd, 1.2) {
		t.Errorf("spent $%v, want $1.20: over the limit by one call", usd)
	}
}

func TestUpstreamErrors(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Error: modeltest.Overloaded()},
		{Error: &modeltest.APIError{Status: 500, Type: "api_error", Message: "Internal server error"}},
	})
	budget := &Limits{USD: 1, Turns: 10}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	for _, want := range []int{529, 500} {
		resp := h.post(t, token, request(true, hello))
		body := readAll(t, resp)
		if resp.StatusCode != want || !bytes.Equal(body, h.tee.last()) {
			t.Errorf("status %d body %s, want %d and the provider's body", resp.StatusCode, body, want)
		}
	}
	calls := h.modelCalls(t)
	if len(calls) != 2 || calls[0].Status != 529 || calls[1].Status != 500 ||
		!strings.HasPrefix(calls[0].Error, "overloaded_error") || calls[0].USD != 0 || calls[0].InputTokens != 0 {
		t.Errorf("model_call events %+v: want 529 and 500, metered as zero", calls)
	}
	if usd, turns := budget.Spent(); usd != 0 || turns != 0 {
		t.Errorf("errors charged $%v and %d turns, want nothing", usd, turns)
	}
}

func TestBrokenUpstream(t *testing.T) {
	usage := modeltest.Usage{InputTokens: 1000, OutputTokens: 50}
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.Text("cut short")}, Usage: usage, Break: modeltest.Cut},
		{Blocks: []modeltest.Block{modeltest.Text("overloaded mid-way")}, Usage: usage, Break: modeltest.ErrorEvent},
		{Blocks: []modeltest.Block{modeltest.Text("bad line")}, Usage: usage, Break: modeltest.Malformed},
	})
	budget := &Limits{}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})

	resp := h.post(t, token, request(true, hello))
	got, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut stream: the agent read %d bytes and %v, want unexpected EOF", len(got), err)
	}
	readAll(t, h.post(t, token, request(true, hello)))
	readAll(t, h.post(t, token, request(true, hello)))

	calls := h.modelCalls(t)
	if len(calls) != 3 {
		t.Fatalf("%d model_call events, want 3", len(calls))
	}
	// The stream broke after its first delta ("cut" of "cut short"): the
	// call says it is cut and its output estimated from that delta.
	if c := calls[0]; c.Status != 502 || !strings.Contains(c.Error, "broke") || c.InputTokens != 1000 || c.OutputTokens < 1 ||
		!c.Cut || !c.OutputEstimated || !strings.Contains(c.Error, "1 content deltas") || !approx(c.USD, (1000*10+float64(c.OutputTokens)*100)/1e6) {
		t.Errorf("cut stream: %+v, want 502, cut, with the input seen before the cut and output estimated from one delta", c)
	}
	if c := calls[2]; c.Cut || c.OutputEstimated {
		t.Errorf("a whole message with a malformed line: %+v, want neither cut nor estimated", c)
	}
	if c := calls[1]; c.Status != 529 || !strings.HasPrefix(c.Error, "overloaded_error") {
		t.Errorf("error event: %+v, want 529 overloaded_error", c)
	}
	if c := calls[2]; c.Status != 200 || c.OutputTokens != 50 {
		t.Errorf("malformed content line: %+v, want 200 with full usage (the line carries no usage)", c)
	}
	if _, turns := budget.Spent(); turns != 3 {
		t.Errorf("%d turns charged, want 3 (each started a message)", turns)
	}
}

func TestUnreachableUpstream(t *testing.T) {
	h := newHarness(t, nil)
	h.up.Close()
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	resp := h.post(t, token, request(true, hello))
	readAll(t, resp)
	calls := h.modelCalls(t)
	if resp.StatusCode != 502 || len(calls) != 1 || calls[0].Status != 502 || !strings.HasPrefix(calls[0].Error, "upstream:") {
		t.Errorf("status %d, events %+v; want 502 and one 502 model_call", resp.StatusCode, calls)
	}
	// The execution is not stuck: its slot was given back.
	resp = h.post(t, token, request(true, hello))
	readAll(t, resp)
	if n := len(h.modelCalls(t)); n != 2 {
		t.Errorf("%d model_call events after a second call, want 2", n)
	}
}

func TestRefusedModels(t *testing.T) {
	h := newHarness(t, nil)
	token := h.gw.Register(Execution{Session: "s", ID: "e", Models: []string{"claude-opus-4"}})
	cases := []struct{ name, model, msg string }{
		{"not allowed", "claude-sonnet-4-5", "not allowed"},
		{"prefix without a word boundary", "claude-opus-4x", "not allowed"},
		{"not json", "", "JSON object"},
	}
	open := h.gw.Register(Execution{Session: "s", ID: "e2"})
	for _, tc := range cases {
		body := strings.Replace(request(true, hello), "claude-opus-4", tc.model, 1)
		if tc.model == "" {
			body = "{"
		}
		resp := h.post(t, token, body)
		var e struct{ Error apiError }
		json.Unmarshal(readAll(t, resp), &e)
		if resp.StatusCode != 400 || !strings.Contains(e.Error.Message, tc.msg) {
			t.Errorf("%s: %d %+v, want 400 %q", tc.name, resp.StatusCode, e, tc.msg)
		}
	}
	resp := h.post(t, open, strings.Replace(request(true, hello), "claude-opus-4", "gpt-5", 1))
	var e struct{ Error apiError }
	json.Unmarshal(readAll(t, resp), &e)
	if resp.StatusCode != 400 || !strings.Contains(e.Error.Message, `"gpt-5" has no price`) {
		t.Errorf("unpriced model: %d %+v", resp.StatusCode, e)
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Errorf("%d refused calls reached the provider", n)
	}
	if n := len(h.eventsOf(stream.Error)); n != 3 {
		t.Errorf("%d error events, want 3 (two refused models, one unpriced)", n)
	}
}

func TestInjectWrapUp(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"string content", `{"model":"m","messages":[{"role":"user","content":"hi <b>"}]}`,
			`{"messages":[{"content":[{"text":"hi <b>","type":"text"},{"text":"W","type":"text"}],"role":"user"}],"model":"m"}`},
		{"last user, not prefill", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":"b"}]}`,
			`{"messages":[{"content":[{"type":"text","text":"a"},{"text":"W","type":"text"}],"role":"user"},{"content":"b","role":"assistant"}]}`},
		{"no user: system string", `{"system":"S","messages":[{"role":"assistant","content":"b"}]}`,
			`{"messages":[{"role":"assistant","content":"b"}],"system":[{"text":"S","type":"text"},{"text":"W","type":"text"}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := injectWrapUp([]byte(tc.in), "W")
			if err != nil || string(got) != tc.want {
				t.Errorf("injectWrapUp(%s) =\n%s, %v\nwant\n%s", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestAnswered: the Answered hook runs once a call, when the provider's
// answer arrives and before any of it reaches the agent (the agent's
// request is still waiting while the hook runs), and what it returns is
// the call's model_call Snapshot.
func TestAnswered(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.Text("one")}},
		{Blocks: []modeltest.Block{modeltest.Text("two")}},
	})
	entered, release := make(chan int, 2), make(chan struct{})
	n := 0
	token := h.gw.Register(Execution{Session: "s1", ID: "e1", Answered: func() string {
		n++
		entered <- n
		select { // bounded: a hook run at the wrong time must not hang the test
		case <-release:
		case <-time.After(15 * time.Second):
		}
		return fmt.Sprintf("snap-%d", n)
	}})
	for i := 1; i <= 2; i++ {
		got := make(chan *http.Response, 1)
		go func() { // not h.post: no t.Fatal off the test's goroutine
			req, _ := http.NewRequest("POST", h.url+"/v1/messages?beta=true", strings.NewReader(request(true, hello)))
			req.Header.Set("x-api-key", token)
			req.Header.Set("anthropic-version", "2023-06-01")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				resp = &http.Response{StatusCode: 0, Body: io.NopCloser(strings.NewReader(err.Error()))}
			}
			got <- resp
		}()
		select {
		case k := <-entered:
			if k != i {
				t.Fatalf("call %d entered the hook as %d", i, k)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d: the hook never ran", i)
		}
		select {
		case <-got:
			t.Fatalf("call %d: the agent had the answer's headers while the hook ran", i)
		case <-time.After(100 * time.Millisecond):
		}
		release <- struct{}{}
		select {
		case resp := <-got:
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
			}
			readAll(t, resp)
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d: no answer after the hook returned", i)
		}
	}
	calls := h.modelCalls(t)
	if len(calls) != 2 || calls[0].Snapshot != "snap-1" || calls[1].Snapshot != "snap-2" {
		t.Errorf("model_call records %+v, want snapshots snap-1 and snap-2", calls)
	}
}
