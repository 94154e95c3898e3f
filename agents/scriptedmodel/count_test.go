package scriptedmodel

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// postCount sends a count_tokens request with the headers the CLI sends.
func postCount(t *testing.T, s *Server, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", s.URL()+"/v1/messages/count_tokens?beta=true", strings.NewReader(body))
	req.Header.Set("x-api-key", s.Key())
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func countOf(t *testing.T, resp *http.Response) int {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var a map[string]int
	if resp.StatusCode != 200 || json.Unmarshal(b, &a) != nil || len(a) != 1 {
		t.Fatalf("count answer %d %s, want 200 {\"input_tokens\": N}", resp.StatusCode, b)
	}
	return a["input_tokens"]
}

// TestCountTokens: count_tokens answers a valid body with the scripted
// figure, or bytes/4 without one; it refuses what the API refuses
// (message-only fields, bad messages, server tools, no key) in the API's
// error shape; counts are recorded but are not message requests.
func TestCountTokens(t *testing.T) {
	valid := `{"model":"claude-opus-4-8","system":"be brief","tools":[{"name":"Bash","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto"},"thinking":{"type":"enabled","budget_tokens":2048},"messages":[{"role":"user","content":"hello"}]}`
	s := start(t, Config{})
	if got, want := countOf(t, postCount(t, s, valid)), (len(valid)+3)/4; got != want {
		t.Errorf("default count %d, want %d (bytes/4)", got, want)
	}
	for _, c := range []struct{ name, body, msg string }{
		{"max_tokens", `{"model":"m","max_tokens":5,"messages":` + hello + `}`, "max_tokens: Extra inputs are not permitted"},
		{"stream", `{"model":"m","stream":true,"messages":` + hello + `}`, "stream: Extra inputs"},
		{"metadata", `{"model":"m","metadata":{},"messages":` + hello + `}`, "metadata: Extra inputs"},
		{"no model", `{"messages":` + hello + `}`, "model: Field required"},
		{"no messages", `{"model":"m"}`, "messages: Field required"},
		{"bad message", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":""}]}]}`, "must be non-empty"},
		{"server tool", `{"model":"m","tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":` + hello + `}`, "tools.0: server tools"},
		{"not json", `{`, "JSON object"},
		{"image by url", `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`, "messages.0.content.0.source: url sources are not supported"},
		{"document by file in a tool result", `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"n","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"document","source":{"type":"file","file_id":"f"}}]}]}]}`, "messages.2.content.0.content.0.source: file sources"},
	} {
		wantAPIError(t, postCount(t, s, c.body), 400, "invalid_request_error", c.msg)
	}
	req, _ := http.NewRequest("POST", s.URL()+"/v1/messages/count_tokens", strings.NewReader(valid))
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wantAPIError(t, resp, 401, "authentication_error", "x-api-key")
	if n := len(s.MessageRequests()); n != 0 {
		t.Errorf("%d message requests, want 0: counts are not messages", n)
	}
	if n := len(s.Requests()); n != 12 {
		t.Errorf("%d requests recorded, want 12", n)
	}

	scripted := start(t, Config{Count: Count{InputTokens: 30_000}})
	if got := countOf(t, postCount(t, scripted, valid)); got != 30_000 {
		t.Errorf("scripted count %d, want 30000", got)
	}
	failing := start(t, Config{Count: Count{Error: Overloaded()}})
	wantAPIError(t, postCount(t, failing, valid), 529, "overloaded_error", "Overloaded")
}

// TestSystemMessages: a system message right after a user message, with
// text content, is accepted on the models that take one (Claude Opus 4.8
// on), in a message and in a count.
func TestSystemMessages(t *testing.T) {
	s := start(t, Config{})
	msgs := `[{"role":"user","content":"go"},{"role":"system","content":[{"type":"text","text":"today is Thursday"}]},{"role":"assistant","content":"ok"},{"role":"user","content":"more"},{"role":"system","content":"still Thursday"}]`
	resp := post(t, s, body(false, msgs))
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	if got := countOf(t, postCount(t, s, `{"model":"claude-opus-4-8","messages":`+msgs+`}`)); got <= 0 {
		t.Errorf("count %d", got)
	}
	m := s.MessageRequests()[0].Messages
	if len(m.Messages) != 5 || m.Messages[1].Role != "system" || m.Messages[1].Content[0].Text != "today is Thursday" {
		t.Errorf("parsed %+v", m.Messages)
	}
	if got := s.MessageRequests()[0].LastUserText(); got != "more" {
		t.Errorf("LastUserText() = %q, want the user's, not the system message", got)
	}
	for _, model := range []string{"claude-opus-4-7", "claude-sonnet-4-5-20250929", "claude-opus-4", "claude-haiku-4-5"} {
		b := `{"model":"` + model + `","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"system","content":"y"}]}`
		wantAPIError(t, post(t, s, b), 400, "invalid_request_error", "not supported on this model")
	}
}
