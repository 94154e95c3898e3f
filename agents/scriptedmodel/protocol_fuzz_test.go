package scriptedmodel

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The request parsers read untrusted bytes: whatever a client (an agent
// CLI driven by a hostile agent) sends. Each fuzz target checks that a
// parser never panics, refuses in the provider's terms, parses the same
// bytes the same way twice, accepts only well-paired conversations, and
// that whatever it accepts is answered with well-formed JSON whose
// output tokens respect the request's cap.

// fuzzTurn is played to every accepted request: text, a tool call and
// more output tokens than any cap.
var fuzzTurn = Turn{Blocks: []Block{Text("ok <&>"), ToolUse("f", map[string]any{"a": "ü"})},
	Usage: Usage{InputTokens: 3, OutputTokens: 1 << 30, ReasoningTokens: 1 << 29, CacheReadInputTokens: 2}}

// playAnswer plays fuzzTurn for rec over p and returns the JSON
// documents of the answer (one, or one per SSE data line).
func playAnswer(t *testing.T, p protocol, rec *Request) []string {
	w := httptest.NewRecorder()
	p.play(New(Config{}), w, rec, fuzzTurn)
	if w.Code != 200 {
		t.Fatalf("answer status %d", w.Code)
	}
	body := w.Body.String()
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		if !json.Valid([]byte(body)) {
			t.Fatalf("answer %q is not JSON", body)
		}
		return []string{body}
	}
	var docs []string
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" {
			if !json.Valid([]byte(d)) {
				t.Fatalf("event data %q is not JSON", d)
			}
			docs = append(docs, d)
		}
	}
	return docs
}

// outputWithin checks that every figure named field in docs is at most
// limit (when there is a limit).
func outputWithin(t *testing.T, docs []string, field string, limit int) {
	if limit == 0 {
		return
	}
	for _, d := range docs {
		for _, part := range strings.Split(d, `"`+field+`":`)[1:] {
			var n int
			if json.Unmarshal([]byte(strings.TrimRight(strings.SplitN(part, ",", 2)[0], "}")), &n) == nil && n > limit {
				t.Fatalf("%s %d over the cap %d in %s", field, n, limit, d)
			}
		}
	}
}

// clientRequests are the captured requests of real CLIs whose file
// names start with one of the patterns (testdata/clients).
func clientRequests(f *testing.F, patterns ...string) [][]byte {
	var out [][]byte
	for _, p := range patterns {
		files, _ := filepath.Glob(filepath.Join("testdata", "clients", p+"*.json"))
		for _, name := range files {
			b, err := os.ReadFile(name)
			if err != nil {
				f.Fatal(err)
			}
			out = append(out, b)
		}
	}
	return out
}

func addClientSeeds(f *testing.F, patterns ...string) {
	for _, b := range clientRequests(f, patterns...) {
		f.Add(b)
	}
}

func wantRefusal(t *testing.T, e *protoError, body []byte) {
	if e.Status != http.StatusBadRequest && e.Status != http.StatusForbidden || e.Message == "" || e.Type == "" && e.Status != 400 {
		t.Fatalf("%q refused with %+v", body, e)
	}
}

func FuzzResponsesRequest(f *testing.F) {
	for _, b := range []string{
		responsesBody(true, responsesHello), responsesBody(false, `"hi"`),
		`{"model":"m","input":[{"role":"user","content":"a"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}],"max_output_tokens":16}`,
		`{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`,
		`{"model":"m","input":[{"type":"custom_tool_call","call_id":"c","name":"p","input":"x"},{"type":"custom_tool_call_output","call_id":"c","output":[{"type":"input_text","text":"t"}]}],"stream":true}`,
		`{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":null}],"temperature":null}`,
		`{"model":"m","input":[{"type":"reasoning","summary":[]}],"max_output_tokens":1e2}`, `{"model":"m","previous_response_id":"r"}`, `{}`, `[]`, `{"model":"m"}{}`,
		`{"model":"m","tools":[{"type":"tool_search","execution":"client"}],"input":[{"role":"user","content":"a"},{"type":"tool_search_call","call_id":"s","execution":"client","arguments":{"query":"q"}},{"type":"tool_search_output","call_id":"s","execution":"client","tools":[{"type":"namespace","name":"mcp__x","tools":[{"type":"function","name":"f"}]}]},{"type":"function_call","namespace":"mcp__x","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}]}`,
	} {
		f.Add([]byte(b))
	}
	addClientSeeds(f, "codex-", "opencode-*-responses-")
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := parseResponses(body)
		if e != nil {
			wantRefusal(t, e, body)
			if e.Type != "invalid_request_error" {
				t.Fatalf("refusal type %q", e.Type)
			}
			return
		}
		again, _ := parseResponses(body)
		if !reflect.DeepEqual(req, again) {
			t.Fatalf("%q parsed two ways", body)
		}
		if req.MaxOutputTokens != 0 && req.MaxOutputTokens < 16 {
			t.Fatalf("max_output_tokens %d accepted", req.MaxOutputTokens)
		}
		calls := map[string]string{}
		for _, it := range req.Input {
			if out, ok := responsesCallOutputs[it.Type]; ok {
				calls[it.CallID] = out
			}
			if strings.HasSuffix(it.Type, "_output") && it.CallID != "" && calls[it.CallID] != it.Type {
				t.Fatalf("%q: %s %s accepted before its call", body, it.Type, it.CallID)
			}
		}
		docs := playAnswer(t, responsesProtocol{}, &Request{Responses: req})
		outputWithin(t, docs, "output_tokens", req.MaxOutputTokens)
	})
}

func FuzzChatRequest(f *testing.F) {
	for _, b := range []string{
		chatBody(true, `[{"role":"user","content":"x"}]`), chatBody(false, `[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"}]}]`),
		`{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"max_completion_tokens":5}`,
		`{"model":"m","messages":[{"role":"tool","tool_call_id":"c","content":"ok"}]}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":""}}]}]}`,
		`{"model":"m","messages":[],"n":2}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"developer","content":"d"}]}`, `{}`, `null`,
	} {
		f.Add([]byte(b))
	}
	addClientSeeds(f, "opencode-*-chat-")
	f.Fuzz(func(t *testing.T, body []byte) {
		req, e := parseChat(body)
		if e != nil {
			wantRefusal(t, e, body)
			return
		}
		again, _ := parseChat(body)
		if !reflect.DeepEqual(req, again) {
			t.Fatalf("%q parsed two ways", body)
		}
		if len(req.Messages) == 0 || req.MaxTokens < 0 {
			t.Fatalf("%q accepted: %d messages, cap %d", body, len(req.Messages), req.MaxTokens)
		}
		open := map[string]bool{}
		for _, m := range req.Messages {
			if m.Role == "tool" {
				if _, ok := open[m.ToolCallID]; !ok {
					t.Fatalf("%q: tool message %s accepted without its call", body, m.ToolCallID)
				}
				open[m.ToolCallID] = false
				continue
			}
			for id, waiting := range open {
				if waiting {
					t.Fatalf("%q: call %s accepted unanswered", body, id)
				}
			}
			open = map[string]bool{}
			for _, c := range m.ToolCalls {
				open[c.ID] = true
			}
		}
		docs := playAnswer(t, chatProtocol{}, &Request{Chat: req})
		outputWithin(t, docs, "completion_tokens", req.MaxTokens)
	})
}

func FuzzGeminiRequest(f *testing.F) {
	for _, b := range []string{
		geminiBody(`[{"role":"user","parts":[{"text":"x"}]}]`),
		`{"contents":[{"role":"user","parts":[{"text":"x"}]},{"role":"model","parts":[{"functionCall":{"name":"f","args":{}}}]},{"role":"user","parts":[{"functionResponse":{"name":"f","response":{}}}]}],"generation_config":{"max_output_tokens":9}}`,
		`{"contents":[{"role":"user","parts":[{"functionResponse":{"name":"f","response":{}}}]}]}`,
		`{"contents":[{"parts":[{"text":"x","thought":true,"thoughtSignature":"s"}]}],"generationConfig":{"thinkingConfig":{"thinkingBudget":0}}}`,
		`{"contents":[{"parts":[{}]}]}`, `{"contents":[]}`, `{"contents":[{"role":"tool","parts":[{"text":"x"}]}]}`, `{}`, `{"contents":[{"parts":[{"text":"x"}]}]} `,
	} {
		f.Add([]byte(b), true)
	}
	for _, b := range clientRequests(f, "gemini-cli-") {
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, body []byte, sse bool) {
		req, e := parseGemini(body)
		if e != nil {
			wantRefusal(t, e, body)
			return
		}
		again, _ := parseGemini(body)
		if !reflect.DeepEqual(req, again) {
			t.Fatalf("%q parsed two ways", body)
		}
		if len(req.Contents) == 0 || req.MaxOutputTokens < 0 {
			t.Fatalf("%q accepted: %d contents, cap %d", body, len(req.Contents), req.MaxOutputTokens)
		}
		prevCalls := 0
		for i, c := range req.Contents {
			if len(c.Parts) == 0 {
				t.Fatalf("%q: content %d accepted without parts", body, i)
			}
			calls, responses := 0, 0
			for _, p := range c.Parts {
				if p.FunctionCall != nil {
					calls++
				}
				if p.FunctionResponse != nil {
					responses++
				}
			}
			if i == 0 && calls > 0 {
				t.Fatalf("%q: contents opening with a function call accepted", body)
			}
			if responses > 0 && responses != prevCalls {
				t.Fatalf("%q: %d responses accepted after %d calls", body, responses, prevCalls)
			}
			prevCalls = calls
		}
		req.Model, req.Method, req.SSE = "gemini-x", "streamGenerateContent", sse
		docs := playAnswer(t, geminiProtocol{}, &Request{Gemini: req})
		outputWithin(t, docs, "candidatesTokenCount", req.MaxOutputTokens)
	})
}
