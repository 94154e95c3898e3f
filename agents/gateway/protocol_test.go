package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"hearth/agents/stream"
)

// The real keys of the test providers: each must reach only its own
// provider, and none the agent.
const (
	openaiKey    = "sk-proj-REAL-openai-key"
	geminiKey    = "AIzaREAL-gemini-key"
	anthropicKey = "sk-ant-REAL-anthropic-key"
)

// Test prices for the other providers: round numbers, USD per million.
var (
	openaiPrices = NewPrices(map[string]Price{
		"gpt-5":       {Input: 1, Output: 10, CacheRead: 0.1},
		"gpt-5-codex": {Input: 1, Output: 10, CacheRead: 0.1},
		"gpt-4.1":     {Input: 2, Output: 8, CacheRead: 0.5},
		"o4-mini":     {Input: 1, Output: 4, CacheRead: 0.25},
	})
	geminiPrices = NewPrices(map[string]Price{
		"gemini-2.5-pro":   {Input: 1, Output: 10, CacheRead: 0.1},
		"gemini-2.5-flash": {Input: 0.5, Output: 2, CacheRead: 0.05},
	})
)

// upstreamCall is a request as a provider received it.
type upstreamCall struct {
	Path, Query string
	Header      http.Header
	Body        []byte
}

// protoHarness is one gateway serving three providers, all played by one
// recording HTTP server that answers with recorded provider bytes.
type protoHarness struct {
	gw  *Gateway
	url string

	mu      sync.Mutex
	calls   []upstreamCall
	answer  func(w http.ResponseWriter, r *http.Request) // what the provider answers
	events  []stream.Event
	toAgent [][]byte
}

func newProtoHarness(t *testing.T) *protoHarness {
	t.Helper()
	h := &protoHarness{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.calls = append(h.calls, upstreamCall{r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body})
		answer := h.answer
		h.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(up.Close)
	gw, err := New(Config{
		Upstream: up.URL, APIKey: anthropicKey, Prices: testPrices,
		Providers: map[string]Provider{
			ProviderOpenAI: {Upstream: up.URL, APIKey: openaiKey, Prices: openaiPrices},
			ProviderGemini: {Upstream: up.URL, APIKey: geminiKey, Prices: geminiPrices},
		},
		OnEvent: func(e stream.Event) {
			h.mu.Lock()
			h.events = append(h.events, e)
			h.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.gw = gw
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

// serve makes the provider answer with a fixture file.
func (h *protoHarness) serve(t *testing.T, status int, contentType, fixture string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "protocols", fixture))
	if err != nil {
		t.Fatal(err)
	}
	h.serveBytes(status, contentType, b)
	return b
}

func (h *protoHarness) serveBytes(status int, contentType string, b []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.answer = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		w.Write(b)
	}
}

// send makes a call as an agent's CLI would: the token in the header its
// SDK uses for that path.
func (h *protoHarness) send(t *testing.T, token, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", h.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	switch {
	case strings.HasPrefix(path, "/v1beta/"):
		req.Header.Set("x-goog-api-key", token)
	case strings.HasPrefix(path, "/v1/messages"):
		req.Header.Set("x-api-key", token)
	default:
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.toAgent = append(h.toAgent, b)
	h.mu.Unlock()
	return resp.StatusCode, resp.Header, b
}

func (h *protoHarness) lastCall(t *testing.T) upstreamCall {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.calls) == 0 {
		t.Fatal("no call reached the provider")
	}
	return h.calls[len(h.calls)-1]
}

func (h *protoHarness) ncalls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.calls)
}

func (h *protoHarness) of(t *testing.T, typ stream.Type) []json.RawMessage {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []json.RawMessage
	for _, e := range h.events {
		if e.Type == typ {
			out = append(out, e.Payload)
		}
	}
	return out
}

func (h *protoHarness) lastModelCall(t *testing.T) ModelCallPayload {
	t.Helper()
	calls := h.of(t, stream.ModelCall)
	if len(calls) == 0 {
		t.Fatal("no model_call event")
	}
	var p ModelCallPayload
	if err := json.Unmarshal(calls[len(calls)-1], &p); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	responsesPath = "/v1/responses"
	chatPath      = "/v1/chat/completions"
	geminiPro     = "/v1beta/models/gemini-2.5-pro:generateContent"
	geminiStream  = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
	geminiArray   = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
)

const (
	responsesBody = `{"model":"gpt-5","instructions":"You are Codex.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"write outputs/a.txt"}]}],"tools":[],"stream":false,"store":false}`
	chatBody      = `{"model":"gpt-4.1","messages":[{"role":"system","content":"You are OpenCode."},{"role":"user","content":"write outputs/a.txt"}]}`
	geminiBody    = `{"contents":[{"role":"user","parts":[{"text":"write outputs/a.txt"}]}],"systemInstruction":{"parts":[{"text":"You are Gemini CLI."}]},"generationConfig":{"temperature":0,"maxOutputTokens":8192}}`
)

// TestProtocolMetering: each protocol, streamed and not, metered exact to
// the token from the provider's recorded bytes: cached input at the
// cached price, reasoning as output; the bytes reach the agent unchanged.
func TestProtocolMetering(t *testing.T) {
	h := newProtoHarness(t)
	cases := []struct {
		name, path, body, ctype, fixture string
		model                            string
		want                             Usage
		usd                              float64
	}{
		// 2,400 input of which 1,920 cached, 350 output of which 256 reasoning:
		// 480×$1 + 1,920×$0.1 + 350×$10 per million.
		{"responses", responsesPath, responsesBody, "application/json", "responses.json", "gpt-5-2025-08-07",
			Usage{InputTokens: 480, CacheReadTokens: 1920, OutputTokens: 350, ReasoningTokens: 256}, (480 + 192 + 3500) / 1e6},
		{"responses streamed", responsesPath, strings.Replace(responsesBody, `"stream":false`, `"stream":true`, 1), "text/event-stream", "responses.sse", "gpt-5-codex",
			Usage{InputTokens: 1024, CacheReadTokens: 4096, OutputTokens: 812, ReasoningTokens: 640}, (1024 + 409.6 + 8120) / 1e6},
		{"chat", chatPath, chatBody, "application/json", "chat.json", "gpt-4.1-2025-04-14",
			Usage{InputTokens: 93, CacheReadTokens: 1024, OutputTokens: 46}, (93*2 + 1024*0.5 + 46*8) / 1e6},
		{"chat streamed", chatPath, strings.Replace(chatBody, `"model":"gpt-4.1"`, `"model":"o4-mini","stream":true,"stream_options":{"include_usage":true}`, 1), "text/event-stream", "chat.sse", "o4-mini-2025-04-16",
			Usage{InputTokens: 952, CacheReadTokens: 2048, OutputTokens: 700, ReasoningTokens: 512}, (952 + 2048*0.25 + 700*4) / 1e6},
		{"gemini", geminiPro, geminiBody, "application/json", "gemini.json", "gemini-2.5-pro",
			Usage{InputTokens: 1200, CacheReadTokens: 3000, OutputTokens: 420, ReasoningTokens: 300}, (1200 + 300 + 4200) / 1e6},
		{"gemini streamed", geminiStream, geminiBody, "text/event-stream", "gemini.sse", "gemini-2.5-flash",
			Usage{InputTokens: 388, CacheReadTokens: 512, OutputTokens: 257, ReasoningTokens: 200}, (388*0.5 + 512*0.05 + 257*2) / 1e6},
		{"gemini streamed as a JSON array", geminiArray, geminiBody, "application/json", "gemini_array.json", "gemini-2.5-flash",
			Usage{InputTokens: 388, CacheReadTokens: 512, OutputTokens: 257, ReasoningTokens: 200}, (388*0.5 + 512*0.05 + 257*2) / 1e6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			token := h.gw.Register(Execution{Session: "s", ID: c.name}) // each its own: a message id is metered once
			sent := h.serve(t, 200, c.ctype, c.fixture)
			status, _, got := h.send(t, token, c.path, c.body)
			if status != 200 || !bytes.Equal(got, sent) {
				t.Fatalf("the agent got %d %q, want 200 and the provider's bytes", status, got)
			}
			p := h.lastModelCall(t)
			u := Usage{InputTokens: p.InputTokens, OutputTokens: p.OutputTokens, CacheReadTokens: p.CacheReadTokens, CacheCreationTokens: p.CacheCreationTokens, ReasoningTokens: p.ReasoningTokens}
			if u != c.want || p.Model != c.model || p.Status != 200 || p.Error != "" || p.MessageID == "" {
				t.Errorf("model_call %+v, want %+v of %s, status 200", p, c.want, c.model)
			}
			if math.Abs(p.USD-c.usd) > 1e-12 {
				t.Errorf("usd = %.10f, want %.10f", p.USD, c.usd)
			}
		})
	}
	if errs := h.of(t, stream.Error); len(errs) > 0 {
		t.Errorf("error events: %s", errs)
	}
}

// TestChatStreamUsage: a streamed Chat Completions call is made to report
// its usage (stream_options.include_usage added, or turned on), and a
// stream that still ends without it is metered at the call's bound, with
// an error event saying so.
func TestChatStreamUsage(t *testing.T) {
	h := newProtoHarness(t)
	budget := &Limits{USD: 10}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	for _, body := range []string{
		`{"model":"o4-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"o4-mini","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"o4-mini","stream":true,"stream_options":null,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		h.serve(t, 200, "text/event-stream", "chat.sse")
		if status, _, b := h.send(t, token, chatPath, body); status != 200 {
			t.Fatalf("%s: %d %s", body, status, b)
		}
		var sent struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(h.lastCall(t).Body, &sent); err != nil || !sent.StreamOptions.IncludeUsage {
			t.Errorf("%s was forwarded as %s: no include_usage", body, h.lastCall(t).Body)
		}
	}
	budget = &Limits{USD: 10}
	token = h.gw.Register(Execution{Session: "s", ID: "e2", Budget: budget}) // a new execution: the fixtures share a message id
	before, _ := budget.Spent()
	h.serve(t, 200, "text/event-stream", "chat_nousage.sse")
	body := `{"model":"o4-mini","stream":true,"max_completion_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`
	if status, _, b := h.send(t, token, chatPath, body); status != 200 {
		t.Fatalf("%d %s", status, b)
	}
	p := h.lastModelCall(t)
	if p.OutputTokens != 1000 || p.InputTokens < int64(len(body)) || !p.OutputEstimated || !strings.Contains(p.Error, "without its usage") {
		t.Errorf("a stream without usage was metered %+v; want its bound (>= %d input, 1000 output)", p, len(body))
	}
	after, _ := budget.Spent()
	want := (float64(p.InputTokens)*1 + 1000*4) / 1e6
	if math.Abs(after-before-want) > 1e-12 || math.Abs(p.USD-want) > 1e-12 {
		t.Errorf("charged $%v (event $%v), want the bound $%v", after-before, p.USD, want)
	}
	errs := h.of(t, stream.Error)
	if len(errs) != 1 || !bytes.Contains(errs[0], []byte("could not be metered")) {
		t.Errorf("error events %s, want one saying the call was metered at its bound", errs)
	}
}

// TestProtocolCap: under a dollar limit each protocol's own output cap
// is lowered (or set, where the request named none) to what the dollars
// left pay, and the recorded worst case uses it.
func TestProtocolCap(t *testing.T) {
	h := newProtoHarness(t)
	// $0.05 left: at $10 per million output (gpt-5, gemini-2.5-pro) well
	// under 5,000 output tokens fit once the input is paid.
	cases := []struct {
		name, path, body, ctype, fixture string
		read                             func(b []byte) (int64, int)
	}{
		{"responses, none asked", responsesPath, responsesBody, "application/json", "responses.json", field("max_output_tokens")},
		{"responses, too many asked", responsesPath, strings.Replace(responsesBody, `"store":false`, `"store":false,"max_output_tokens":128000`, 1), "application/json", "responses.json", field("max_output_tokens")},
		{"chat, max_completion_tokens", chatPath, strings.Replace(chatBody, `"model":"gpt-4.1"`, `"model":"gpt-5","max_completion_tokens":100000`, 1), "application/json", "chat.json", field("max_completion_tokens")},
		{"chat, legacy max_tokens", chatPath, strings.Replace(chatBody, `"model":"gpt-4.1"`, `"model":"gpt-5","max_tokens":100000`, 1), "application/json", "chat.json", field("max_tokens")},
		{"chat, none asked", chatPath, strings.Replace(chatBody, `"model":"gpt-4.1"`, `"model":"gpt-5"`, 1), "application/json", "chat.json", field("max_completion_tokens")},
		{"gemini", geminiPro, strings.Replace(geminiBody, `8192`, `65536`, 1), "application/json", "gemini.json", geminiCap},
		{"gemini, no generationConfig", geminiPro, `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`, "application/json", "gemini.json", geminiCap},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			token := h.gw.Register(Execution{Session: "s", ID: c.name, Budget: &Limits{USD: 0.05}})
			h.serve(t, 200, c.ctype, c.fixture)
			if status, _, b := h.send(t, token, c.path, c.body); status != 200 {
				t.Fatalf("%d %s", status, b)
			}
			n, count := c.read(h.lastCall(t).Body)
			// The input bound: bytes + margin, at $1 per million; the rest
			// at $10 per million output, below the 90% mark.
			in := float64(len(c.body) + DefaultInputMargin)
			most := int64((0.05*WarnAt - in/1e6) * 1e6 / 10)
			if count != 1 || n < DefaultMinOutput || n > most {
				t.Errorf("forwarded %s: cap %d (%d times), want one in [%d, %d]", h.lastCall(t).Body, n, count, DefaultMinOutput, most)
			}
		})
	}
}

func field(name string) func([]byte) (int64, int) {
	return func(b []byte) (int64, int) {
		raw, n := scanKey(b, name)
		v, _ := wholeNumber(raw)
		return v, n
	}
}

func geminiCap(b []byte) (int64, int) {
	raw, n := scanKey(b, "generationConfig")
	if n != 1 {
		return 0, n
	}
	return field("maxOutputTokens")(raw)
}

// TestProtocolRefusals: a call the budget refuses, one for a model of
// another provider's table, a bad cap and a drain are answered in the
// protocol's own error shape, and never reach the provider.
func TestProtocolRefusals(t *testing.T) {
	h := newProtoHarness(t)
	spent := &Limits{USD: 1}
	spent.Charge(1, 0)
	broke := h.gw.Register(Execution{Session: "s", ID: "broke", Budget: spent})
	rich := h.gw.Register(Execution{Session: "s", ID: "rich", Budget: &Limits{USD: 100}})
	h.serve(t, 200, "application/json", "responses.json")
	type openaiShape struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Code    any     `json:"code"`
		} `json:"error"`
	}
	type geminiShape struct {
		Error *struct {
			Code    *int    `json:"code"`
			Message *string `json:"message"`
			Status  *string `json:"status"`
		} `json:"error"`
	}
	cases := []struct {
		name, token, path, body string
		status                  int
		says                    string
	}{
		{"responses, budget", broke, responsesPath, responsesBody, 400, "Budget exceeded"},
		{"chat, budget", broke, chatPath, chatBody, 400, "Budget exceeded"},
		{"gemini, budget", broke, geminiPro, geminiBody, 400, "Budget exceeded"},
		{"a Claude model of OpenAI", rich, responsesPath, strings.Replace(responsesBody, "gpt-5", "claude-opus-4", 1), 400, "no price in the openai price table"},
		{"a Gemini model of OpenAI", rich, chatPath, strings.Replace(chatBody, "gpt-4.1", "gemini-2.5-pro", 1), 400, "no price in the openai price table"},
		{"a GPT model of Gemini", rich, "/v1beta/models/gpt-5:generateContent", geminiBody, 400, "no price in the gemini price table"},
		{"a GPT model of Anthropic", rich, "/v1/messages", `{"model":"gpt-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, 400, "no price in the anthropic price table"},
		{"chat, several choices", rich, chatPath, strings.Replace(chatBody, `"model":"gpt-4.1"`, `"model":"gpt-4.1","n":4`, 1), 400, "one answer per call"},
		{"gemini, several candidates", rich, geminiPro, strings.Replace(geminiBody, `"temperature":0`, `"candidateCount":3`, 1), 400, "one answer per call"},
		{"gemini, snake_case config", rich, geminiPro, `{"contents":[],"generation_config":{"max_output_tokens":999999}}`, 400, "generationConfig"},
		{"gemini, snake_case cap", rich, geminiPro, `{"contents":[],"generationConfig":{"maxOutputTokens":10,"max_output_tokens":999999}}`, 400, "camelCase"},
		{"responses, a string cap", rich, responsesPath, `{"model":"gpt-5","input":"hi","max_output_tokens":"9999999"}`, 400, "max_output_tokens: must be a positive integer"},
		{"responses, stored input", rich, responsesPath, `{"model":"gpt-5","input":"go on","previous_response_id":"resp_1"}`, 400, "previous_response_id: under a dollar limit"},
		{"responses, a conversation", rich, responsesPath, `{"model":"gpt-5","input":"go on","conversation":"conv_1"}`, 400, "conversation: under a dollar limit"},
		{"gemini, cached content", rich, geminiPro, `{"contents":[],"cachedContent":"cachedContents/abc"}`, 400, "cachedContent: under a dollar limit"},
		{"an unknown token", "hearth-nope", responsesPath, responsesBody, 401, "not a token of a running execution"},
		{"an unknown Gemini method", rich, "/v1beta/models/gemini-2.5-pro:embedContent", geminiBody, 404, "Not Found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := h.ncalls()
			status, hdr, b := h.send(t, c.token, c.path, c.body)
			if status != c.status || !bytes.Contains(b, []byte(c.says)) || hdr.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s, want %d saying %q", status, b, c.status, c.says)
			}
			if h.ncalls() != n {
				t.Errorf("the refused call reached the provider")
			}
			switch {
			case strings.HasPrefix(c.path, "/v1beta/"):
				var e geminiShape
				if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Code == nil || *e.Error.Code != status || e.Error.Status == nil || *e.Error.Status == "" || e.Error.Message == nil {
					t.Errorf("not Gemini's error shape: %s", b)
				}
			case strings.HasPrefix(c.path, "/v1/messages"):
				if !bytes.HasPrefix(b, []byte(`{"error":{"type":"invalid_request_error"`)) && !bytes.Contains(b, []byte(`"type":"error"`)) {
					t.Errorf("not Anthropic's error shape: %s", b)
				}
			default:
				var e openaiShape
				if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Message == nil || e.Error.Type == nil || bytes.Contains(b, []byte(`"type":"error"`)) {
					t.Errorf("not OpenAI's error shape: %s", b)
				}
			}
		})
	}
	// A drain: 503 in both shapes, retryable.
	if err := h.gw.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{responsesPath, geminiPro} {
		status, hdr, b := h.send(t, rich, path, geminiBody)
		if status != 503 || hdr.Get("Retry-After") == "" || !bytes.Contains(b, []byte("restarting")) {
			t.Errorf("%s while draining: %d %s", path, status, b)
		}
	}
}

// TestProtocolWrapUp: the call that could pass 90% carries the wrap-up
// text in the protocol's own message format, at the end (the prompt
// cache's prefix untouched) for OpenAI, in systemInstruction for Gemini.
func TestProtocolWrapUp(t *testing.T) {
	h := newProtoHarness(t)
	cases := []struct {
		name, path, body, fixture string
		check                     func(b []byte) bool
	}{
		{"responses", responsesPath, responsesBody, "responses.json", func(b []byte) bool {
			var r struct {
				Instructions string `json:"instructions"`
				Input        []struct {
					Role    string `json:"role"`
					Content any    `json:"content"`
				} `json:"input"`
			}
			json.Unmarshal(b, &r)
			last := r.Input[len(r.Input)-1]
			return len(r.Input) == 2 && last.Role == "developer" && last.Content == DefaultWrapUp && r.Instructions == "You are Codex."
		}},
		{"responses, string input", responsesPath, `{"model":"gpt-5","input":"write it"}`, "responses.json", func(b []byte) bool {
			var r struct {
				Input []struct{ Role, Content string } `json:"input"`
			}
			json.Unmarshal(b, &r)
			return len(r.Input) == 2 && r.Input[0].Role == "user" && r.Input[0].Content == "write it" && r.Input[1].Role == "developer" && r.Input[1].Content == DefaultWrapUp
		}},
		{"chat", chatPath, chatBody, "chat.json", func(b []byte) bool {
			var r struct {
				Messages []struct{ Role, Content string } `json:"messages"`
			}
			json.Unmarshal(b, &r)
			n := len(r.Messages)
			return n == 3 && r.Messages[0].Content == "You are OpenCode." && r.Messages[n-1].Role == "system" && r.Messages[n-1].Content == DefaultWrapUp
		}},
		{"gemini", geminiPro, geminiBody, "gemini.json", func(b []byte) bool {
			var r struct {
				SystemInstruction struct {
					Parts []struct{ Text string } `json:"parts"`
				} `json:"systemInstruction"`
				Contents []any `json:"contents"`
			}
			json.Unmarshal(b, &r)
			p := r.SystemInstruction.Parts
			return len(p) == 2 && p[0].Text == "You are Gemini CLI." && p[1].Text == DefaultWrapUp && len(r.Contents) == 1
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			budget := &Limits{USD: 1}
			budget.Charge(0.95, 0) // past 90%
			token := h.gw.Register(Execution{Session: "s", ID: c.name, Budget: budget})
			h.serve(t, 200, "application/json", c.fixture)
			if status, _, b := h.send(t, token, c.path, c.body); status != 200 {
				t.Fatalf("%d %s", status, b)
			}
			if got := h.lastCall(t).Body; !c.check(got) {
				t.Errorf("forwarded %s: no wrap-up where the protocol reads it", got)
			}
		})
	}
}

// TestHostileProviderKeys: whichever header (or URL) an agent puts its
// token in, each provider receives its own real key in its own header
// and nothing else of the agent's, and no real key reaches the agent,
// even in a provider's error that quotes the request.
func TestHostileProviderKeys(t *testing.T) {
	h := newProtoHarness(t)
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	h.mu.Lock()
	h.answer = func(w http.ResponseWriter, r *http.Request) {
		// A provider that echoes the request's headers and URL back, as
		// some error messages do.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": "echo " + r.URL.String(), "type": "invalid_request_error", "code": 400, "status": "INVALID_ARGUMENT"}})
	}
	h.mu.Unlock()
	cases := []struct {
		path      string
		headers   map[string]string
		wantHdr   string
		wantValue string
	}{
		{responsesPath, map[string]string{"Authorization": "Bearer " + token, "x-goog-api-key": token, "x-api-key": "junk"}, "Authorization", "Bearer " + openaiKey},
		{chatPath, map[string]string{"x-api-key": token, "x-goog-api-key": "junk"}, "Authorization", "Bearer " + openaiKey},
		{geminiPro + "?key=" + token, map[string]string{"x-goog-api-key": token, "Authorization": "Bearer junk"}, "X-Goog-Api-Key", geminiKey},
		{geminiStream + "&key=" + token, map[string]string{"x-goog-api-key": token}, "X-Goog-Api-Key", geminiKey},
		{"/v1/messages", map[string]string{"x-goog-api-key": token, "Authorization": "Bearer junk"}, "X-Api-Key", anthropicKey},
		{"/v1beta/models/gemini-2.5-pro:countTokens", map[string]string{"x-goog-api-key": token}, "X-Goog-Api-Key", geminiKey},
	}
	bodies := map[string]string{responsesPath: responsesBody, chatPath: chatBody}
	for _, c := range cases {
		body, ok := bodies[c.path]
		switch {
		case ok:
		case strings.HasPrefix(c.path, "/v1/messages"):
			body = `{"model":"claude-opus-4","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
		default:
			body = geminiBody
		}
		req, _ := http.NewRequest("POST", h.url+c.path, strings.NewReader(body))
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%s: %d %s; want the provider's 400", c.path, resp.StatusCode, got)
		}
		up := h.lastCall(t)
		if v := up.Header.Get(c.wantHdr); v != c.wantValue {
			t.Errorf("%s: the provider got %s: %q, want %q", c.path, c.wantHdr, v, c.wantValue)
		}
		all, _ := json.Marshal(up)
		for _, other := range []string{openaiKey, geminiKey, anthropicKey, token, "junk"} {
			if strings.HasSuffix(c.wantValue, other) {
				continue
			}
			if bytes.Contains(all, []byte(other)) {
				t.Errorf("%s: the provider got %q: %s", c.path, other, all)
			}
		}
		for _, key := range []string{openaiKey, geminiKey, anthropicKey} {
			if bytes.Contains(got, []byte(key)) || strings.Contains(strings.Join(headerValues(resp.Header), " "), key) {
				t.Errorf("%s: a real key reached the agent: %s", c.path, got)
			}
		}
	}
}

// TestHostileKeyInURL: a token only in the URL (?key=, which Google's
// API accepts and logs keep) is not read: the call is refused 401.
func TestHostileKeyInURL(t *testing.T) {
	h := newProtoHarness(t)
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	h.serve(t, 200, "application/json", "gemini.json")
	resp, err := http.Post(h.url+geminiPro+"?key="+token, "application/json", strings.NewReader(geminiBody))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !bytes.Contains(b, []byte(`"status":"UNAUTHENTICATED"`)) || h.ncalls() != 0 {
		t.Errorf("a token in the URL: %d %s (%d calls forwarded), want 401 in Gemini's shape", resp.StatusCode, b, h.ncalls())
	}
}

func headerValues(h http.Header) []string {
	var out []string
	for k, vs := range h {
		out = append(out, k)
		out = append(out, vs...)
	}
	return out
}

// TestProtocolProviderErrors: a provider's own error (HTTP and in a
// stream) is passed on as it came, metered at nothing, and its type and
// message reach the model_call event.
func TestProtocolProviderErrors(t *testing.T) {
	h := newProtoHarness(t)
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	cases := []struct {
		name, path, body, ctype string
		status                  int
		answer                  string
		want                    string
	}{
		{"openai 429", responsesPath, responsesBody, "application/json", 429,
			`{"error":{"message":"Rate limit reached for gpt-5","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, "rate_limit_exceeded: Rate limit reached for gpt-5"},
		{"responses failed mid-stream", responsesPath, responsesBody, "text/event-stream", 200,
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"model\":\"gpt-5\",\"usage\":null}}\n\n" +
				"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"model\":\"gpt-5\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"The model failed\"},\"usage\":{\"input_tokens\":10,\"output_tokens\":0}}}\n\n",
			"server_error: The model failed"},
		{"chat error chunk", chatPath, chatBody, "text/event-stream", 200,
			"data: {\"id\":\"c1\",\"model\":\"gpt-4.1\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\",\"code\":null}}\n\n",
			"server_error: overloaded"},
		{"gemini 503", geminiPro, geminiBody, "application/json", 503,
			`{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}`, "UNAVAILABLE: The model is overloaded"},
		{"gemini error in an array", geminiArray, geminiBody, "application/json", 500,
			`[{"error":{"code":500,"message":"Internal error encountered.","status":"INTERNAL"}}]`, "INTERNAL: Internal error"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.serveBytes(c.status, c.ctype, []byte(c.answer))
			status, _, b := h.send(t, token, c.path, c.body)
			if status != c.status || string(b) != c.answer {
				t.Fatalf("the agent got %d %s, want the provider's answer", status, b)
			}
			p := h.lastModelCall(t)
			if !strings.Contains(p.Error, c.want) {
				t.Errorf("model_call error %q, want %q", p.Error, c.want)
			}
			if c.status >= 400 && p.USD != 0 {
				t.Errorf("an error answer cost $%v", p.USD)
			}
		})
	}
}

// TestUnreportedUsage: an OpenAI or Gemini answer that ends without its
// usage, however it ended (a stream cut short, a whole body that does not
// parse), is charged at the call's bound: its input bound and its output
// cap, never nothing.
func TestUnreportedUsage(t *testing.T) {
	h := newProtoHarness(t)
	cases := []struct {
		name, path, body, ctype, answer string
		cap                             int64
	}{
		{"responses stream cut", responsesPath, strings.Replace(responsesBody, `"store":false`, `"store":false,"max_output_tokens":700`, 1), "text/event-stream",
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_cut\",\"model\":\"gpt-5\",\"usage\":null}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hel\"}\n\n", 700},
		{"responses body malformed", responsesPath, strings.Replace(responsesBody, `"store":false`, `"store":false,"max_output_tokens":900`, 1), "application/json", `{"id":"resp_x","object":"response","usage":{"input_tokens":`, 900},
		{"gemini stream without its end", geminiStream, geminiBody, "text/event-stream",
			"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}],\"role\":\"model\"}}],\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":1},\"responseId\":\"g_cut\"}\r\n\r\n", 8192},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			budget := &Limits{USD: 100}
			token := h.gw.Register(Execution{Session: "s", ID: c.name, Budget: budget})
			h.serveBytes(200, c.ctype, []byte(c.answer))
			h.send(t, token, c.path, c.body)
			p := h.lastModelCall(t)
			if p.OutputTokens != c.cap || p.InputTokens < int64(len(c.body)) || !p.OutputEstimated || !strings.Contains(p.Error, "without its usage") {
				t.Errorf("metered %+v; want the bound: >= %d input, %d output", p, len(c.body), c.cap)
			}
			if spent, _ := budget.Spent(); spent <= 0 || math.Abs(spent-p.USD) > 1e-12 {
				t.Errorf("charged $%v, event $%v", spent, p.USD)
			}
		})
	}
}

// TestGeminiPrepareRepeatedResponse: prepare drops only a functionResponse
// part identical to the one before it in its turn, and leaves a body
// without one as it is, byte for byte.
func TestGeminiPrepareRepeatedResponse(t *testing.T) {
	resp := func(id, out string) string {
		return `{"functionResponse":{"name":"run_shell_command","response":{"output":"` + out + `"},"id":"` + id + `"}}`
	}
	call := func(id string) string {
		return `{"functionCall":{"name":"run_shell_command","args":{},"id":"` + id + `"}}`
	}
	body := func(parts ...string) string {
		return `{"contents":[{"role":"user","parts":[{"text":"go"}]},{"role":"model","parts":[` + call("a") + `,` + call("b") +
			`]},{"role":"user","parts":[` + strings.Join(parts, ",") + `]}]}`
	}
	for _, tc := range []struct {
		name, in string
		want     int // functionResponse parts left
		same     bool
	}{
		{"two calls, two answers", body(resp("a", "x"), resp("b", "x")), 2, true},
		{"the same id, other output", body(resp("a", "x"), resp("a", "y")), 2, true},
		{"a repeat", body(resp("a", "x"), resp("a", "x"), resp("b", "z")), 2, false},
		{"repeats apart", body(resp("a", "x"), resp("b", "z"), resp("a", "x")), 3, true},
		{"one", body(resp("a", "x")), 1, true},
		{"not JSON", `{"contents":[` + resp("a", "x") + resp("a", "x"), 2, true},
	} {
		got, err := geminiProto{}.prepare([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if n := strings.Count(string(got), `"functionResponse"`); n != tc.want || (string(got) == tc.in) != tc.same {
			t.Errorf("%s: %d responses left (want %d), unchanged %v (want %v):\n%s", tc.name, n, tc.want, string(got) == tc.in, tc.same, got)
		}
		if !tc.same && !json.Valid(got) {
			t.Errorf("%s: not JSON: %s", tc.name, got)
		}
	}
}
