package scriptedmodel

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	s := New(cfg)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// post sends a Messages API request with the headers the CLI sends.
func post(t *testing.T, s *Server, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", s.URL()+"/v1/messages?beta=true", strings.NewReader(body))
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

func body(stream bool, messages string) string {
	return fmt.Sprintf(`{"model":"claude-opus-4-8","max_tokens":1024,"stream":%v,"messages":%s}`, stream, messages)
}

const hello = `[{"role":"user","content":"hello"}]`

type sseEvent struct {
	Name string
	Data json.RawMessage
}

// readSSE parses an SSE stream strictly: every event has an event line
// and one data line of valid JSON whose type matches the event name.
func readSSE(r io.Reader) ([]sseEvent, error) {
	var events []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.Name == "" || cur.Data == nil {
				return events, fmt.Errorf("incomplete event %+v", cur)
			}
			var typed struct{ Type string }
			if err := json.Unmarshal(cur.Data, &typed); err != nil {
				return events, fmt.Errorf("event %s: data %q: %v", cur.Name, cur.Data, err)
			}
			if typed.Type != cur.Name {
				return events, fmt.Errorf("event %s has data type %q", cur.Name, typed.Type)
			}
			events, cur = append(events, cur), sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.Data = json.RawMessage(strings.TrimPrefix(line, "data: "))
		default:
			return events, fmt.Errorf("unexpected line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		return events, err
	}
	if cur.Name != "" || cur.Data != nil {
		return events, io.ErrUnexpectedEOF
	}
	return events, nil
}

func wantAPIError(t *testing.T, resp *http.Response, status int, typ, msg string) {
	t.Helper()
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	if resp.StatusCode != status || e.Type != "error" || e.Error.Type != typ || !strings.Contains(e.Error.Message, msg) {
		t.Errorf("got %d %s, want %d %s with message containing %q", resp.StatusCode, b, status, typ, msg)
	}
}

func TestValidation(t *testing.T) {
	s := start(t, Config{})
	tool := `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]}`
	cases := []struct {
		name string
		body string
		msg  string
	}{
		{"not json", `{"model":`, "JSON object"},
		{"array body", `[]`, "JSON object"},
		{"trailing data", body(false, hello) + `{}`, "unexpected data"},
		{"no model", `{"max_tokens":1,"messages":` + hello + `}`, "model: Field required"},
		{"model not string", `{"model":4,"max_tokens":1,"messages":` + hello + `}`, "model: Input should be"},
		{"no max_tokens", `{"model":"m","messages":` + hello + `}`, "max_tokens: Field required"},
		{"max_tokens zero", `{"model":"m","max_tokens":0,"messages":` + hello + `}`, "greater than or equal to 1"},
		{"max_tokens fraction", `{"model":"m","max_tokens":1.5,"messages":` + hello + `}`, "valid integer"},
		{"max_tokens string", `{"model":"m","max_tokens":"9","messages":` + hello + `}`, "valid integer"},
		{"no messages", `{"model":"m","max_tokens":1}`, "messages: Field required"},
		{"empty messages", body(false, `[]`), "at least one message"},
		{"messages not list", body(false, `{}`), "valid list"},
		{"bad role", body(false, `[{"role":"tool","content":"x"}]`), "'user', 'assistant' or 'system'"},
		{"system first", body(false, `[{"role":"system","content":"x"}]`), "messages.0: a system message must come immediately after a user message"},
		{"system after assistant", body(false, `[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"system","content":"z"}]`), "messages.2: a system message must come"},
		{"system message image", body(false, `[{"role":"user","content":"x"},{"role":"system","content":[{"type":"image","source":{}}]}]`), "messages.1.content.0.type: Input should be 'text'"},
		{"system on an older model", `{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"system","content":"y"}]}`, "messages.1.role: Input should be 'user' or 'assistant'"},
		{"no role", body(false, `[{"content":"x"}]`), "messages.0.role: Field required"},
		{"no content", body(false, `[{"role":"user"}]`), "messages.0.content: Field required"},
		{"content number", body(false, `[{"role":"user","content":3}]`), "string or list"},
		{"block without type", body(false, `[{"role":"user","content":[{"text":"x"}]}]`), "messages.0.content.0.type"},
		{"empty text block", body(false, `[{"role":"user","content":[{"type":"text","text":""}]}]`), "must be non-empty"},
		{"tool_use without input", body(false, `[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n"}]}]`), "input object"},
		{"tool_use unanswered", body(false, `[{"role":"user","content":"x"},`+tool+`,{"role":"user","content":"next"}]`), "without tool_result"},
		{"tool_result first", body(false, `[{"role":"user","content":"x"},`+tool+`,{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result","tool_use_id":"toolu_1","content":"ok"}]}]`), "must come first"},
		{"tool_result stray", body(false, `[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_9","content":"ok"}]}]`), "unexpected tool_use_id"},
		{"system number", `{"model":"m","max_tokens":1,"system":5,"messages":` + hello + `}`, "system"},
		{"system image", `{"model":"m","max_tokens":1,"system":[{"type":"image"}],"messages":` + hello + `}`, "system.0.type"},
		{"stream string", `{"model":"m","max_tokens":1,"stream":"yes","messages":` + hello + `}`, "stream: Input should be a valid boolean"},
		{"tools not list", `{"model":"m","max_tokens":1,"tools":{},"messages":` + hello + `}`, "tools: Input should be a valid list"},
		{"tool without name", `{"model":"m","max_tokens":1,"tools":[{"input_schema":{}}],"messages":` + hello + `}`, "tools.0.name"},
		{"tool without schema", `{"model":"m","max_tokens":1,"tools":[{"name":"x"}],"messages":` + hello + `}`, "tools.0.input_schema"},
		{"metadata list", `{"model":"m","max_tokens":1,"metadata":[],"messages":` + hello + `}`, "metadata"},
		{"temperature 2", `{"model":"m","max_tokens":1,"temperature":2,"messages":` + hello + `}`, "temperature"},
		{"tool_choice odd", `{"model":"m","max_tokens":1,"tool_choice":{"type":"maybe"},"messages":` + hello + `}`, "tool_choice.type"},
		{"thinking budget small", `{"model":"m","max_tokens":4000,"thinking":{"type":"enabled","budget_tokens":10},"messages":` + hello + `}`, "budget_tokens"},
		{"thinking over max", `{"model":"m","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":2000},"messages":` + hello + `}`, "greater than thinking.budget_tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantAPIError(t, post(t, s, tc.body), http.StatusBadRequest, "invalid_request_error", tc.msg)
		})
	}
	if n := len(s.MessageRequests()); n != 0 {
		t.Errorf("%d requests accepted, want 0", n)
	}
	if n := len(s.Requests()); n != len(cases) {
		t.Errorf("%d requests recorded, want %d", n, len(cases))
	}
}

func TestValidRequestsAccepted(t *testing.T) {
	s := start(t, Config{})
	full := `{"model":"claude-opus-4-8","max_tokens":32000,"stream":true,
		"system":[{"type":"text","text":"You are Claude Code","cache_control":{"type":"ephemeral"}}],
		"tools":[{"name":"Bash","description":"run","input_schema":{"type":"object"}},{"type":"web_search_20250305","name":"web_search"}],
		"metadata":{"user_id":"u"},"temperature":1,"tool_choice":{"type":"auto"},
		"thinking":{"type":"enabled","budget_tokens":1024},"context_management":{"edits":[]},
		"messages":[{"role":"user","content":[{"type":"text","text":"go"}]},
		{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"a.txt"}]},{"type":"text","text":"more","cache_control":{"type":"ephemeral"}}]}]}`
	for _, b := range []string{body(false, hello), full} {
		resp := post(t, s, b)
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("POST %.60s... = %d, want 200", b, resp.StatusCode)
		}
	}
	reqs := s.MessageRequests()
	if len(reqs) != 2 {
		t.Fatalf("%d accepted requests, want 2", len(reqs))
	}
	m := reqs[1].Messages
	if m.Model != "claude-opus-4-8" || m.MaxTokens != 32000 || !m.Stream || len(m.Tools) != 2 || len(m.System) != 1 {
		t.Errorf("parsed %+v", m)
	}
	if got := reqs[1].LastUserText(); got != "a.txt\nmore" {
		t.Errorf("LastUserText() = %q, want %q", got, "a.txt\nmore")
	}
}

func TestHTTPChecks(t *testing.T) {
	s := start(t, Config{Key: "sk-right"})
	send := func(method, path string, h map[string]string) *http.Response {
		req, _ := http.NewRequest(method, s.URL()+path, strings.NewReader(body(false, hello)))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	good := map[string]string{"x-api-key": "sk-right", "anthropic-version": "2023-06-01", "Content-Type": "application/json"}
	with := func(k, v string) map[string]string {
		h := map[string]string{}
		for k, v := range good {
			h[k] = v
		}
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	cases := []struct {
		name, method, path string
		h                  map[string]string
		status             int
		typ, msg           string
	}{
		{"probe", "GET", "/", nil, 404, "not_found_error", "Not Found"},
		{"other path", "POST", "/v1/complete", good, 404, "not_found_error", "Not Found"},
		{"GET messages", "GET", "/v1/messages", good, 405, "invalid_request_error", "Method"},
		{"odd query", "POST", "/v1/messages?beta=false", good, 400, "invalid_request_error", "query"},
		{"no key", "POST", "/v1/messages", with("x-api-key", ""), 401, "authentication_error", "required"},
		{"wrong key", "POST", "/v1/messages", with("x-api-key", "sk-wrong"), 401, "authentication_error", "invalid x-api-key"},
		{"wrong bearer", "POST", "/v1/messages", with("x-api-key", ""), 401, "authentication_error", ""},
		{"no version", "POST", "/v1/messages", with("anthropic-version", ""), 400, "invalid_request_error", "anthropic-version"},
		{"text body", "POST", "/v1/messages", with("Content-Type", "text/plain"), 400, "invalid_request_error", "Content-Type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "wrong bearer" {
				tc.h["Authorization"] = "Bearer sk-wrong"
			}
			wantAPIError(t, send(tc.method, tc.path, tc.h), tc.status, tc.typ, tc.msg)
		})
	}
	bearer := with("x-api-key", "")
	bearer["Authorization"] = "Bearer sk-right"
	if resp := send("POST", "/v1/messages", bearer); resp.StatusCode != 200 {
		t.Errorf("bearer key: status %d, want 200", resp.StatusCode)
	}
}

func TestStream(t *testing.T) {
	s := start(t, Config{Turns: []Turn{{
		Blocks: []Block{Text("Writing the file now — ünïcode."), ToolUse("Bash", map[string]string{"command": "echo hi > out.txt"})},
		Usage:  Usage{InputTokens: 1200, OutputTokens: 80, CacheReadInputTokens: 300, CacheCreationInputTokens: 40},
	}}})
	resp := post(t, s, body(true, hello))
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	events, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range events {
		if len(names) == 0 || names[len(names)-1] != e.Name {
			names = append(names, e.Name)
		}
	}
	want := "message_start ping content_block_start content_block_delta content_block_stop content_block_start content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("event order:\n got %s\nwant %s", got, want)
	}
	var text, input strings.Builder
	var start struct {
		Message struct {
			ID, Model string
			Usage     Usage
		}
	}
	var delta struct {
		Delta struct {
			StopReason string `json:"stop_reason"`
		}
		Usage Usage
	}
	deltas := 0
	for _, e := range events {
		switch e.Name {
		case "message_start":
			json.Unmarshal(e.Data, &start)
		case "message_delta":
			json.Unmarshal(e.Data, &delta)
		case "content_block_delta":
			deltas++
			var d struct {
				Delta struct {
					Type, Text  string
					PartialJSON string `json:"partial_json"`
				}
			}
			json.Unmarshal(e.Data, &d)
			text.WriteString(d.Delta.Text)
			input.WriteString(d.Delta.PartialJSON)
		}
	}
	if !strings.HasPrefix(start.Message.ID, "msg_") || start.Message.Model != "claude-opus-4-8" {
		t.Errorf("message_start %+v", start)
	}
	if u := start.Message.Usage; u.InputTokens != 1200 || u.CacheReadInputTokens != 300 || u.CacheCreationInputTokens != 40 || u.OutputTokens != 1 {
		t.Errorf("message_start usage %+v", u)
	}
	if delta.Delta.StopReason != "tool_use" || delta.Usage.OutputTokens != 80 {
		t.Errorf("message_delta %+v", delta)
	}
	if text.String() != "Writing the file now — ünïcode." || input.String() != `{"command":"echo hi > out.txt"}` {
		t.Errorf("text %q, input %q", text.String(), input.String())
	}
	if deltas < 5 {
		t.Errorf("%d deltas, want text and input in a few pieces each", deltas)
	}
}

func TestJSONAnswer(t *testing.T) {
	s := start(t, Config{Turns: []Turn{{
		Blocks: []Block{Text("done")}, StopReason: "max_tokens", Usage: Usage{InputTokens: 10, OutputTokens: 20},
	}}})
	var m struct {
		ID, Type, Role, Model string
		StopReason            string `json:"stop_reason"`
		Content               []struct{ Type, Text string }
		Usage                 Usage
	}
	resp := post(t, s, body(false, hello))
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m.Type != "message" || m.Role != "assistant" || m.StopReason != "max_tokens" || len(m.Content) != 1 ||
		m.Content[0].Text != "done" || m.Usage.OutputTokens != 20 || !strings.HasPrefix(m.ID, "msg_") {
		t.Errorf("answer %+v", m)
	}
}

func TestScriptOrderMatchAndFinal(t *testing.T) {
	final := Turn{Blocks: []Block{Text("the end")}}
	s := start(t, Config{Final: &final, Turns: []Turn{
		{Blocks: []Block{Text("one")}},
		{Match: LastUserContains("WRAP UP"), Blocks: []Block{Text("wrapping")}},
		{Blocks: []Block{Text("two")}},
		{Error: Overloaded()},
	}})
	answer := func(msg string) string {
		resp := post(t, s, body(false, fmt.Sprintf(`[{"role":"user","content":%q}]`, msg)))
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		var m struct{ Content []struct{ Text string } }
		json.Unmarshal(b, &m)
		return m.Content[0].Text
	}
	got := []string{answer("a"), answer("b WRAP UP"), answer("WRAP UP again"), answer("c"), answer("d")}
	want := []string{"one", "wrapping", "two", `529 {"error":{"message":"Overloaded","type":"overloaded_error"},"type":"error"}`, "the end"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("answer %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func TestBrokenStreams(t *testing.T) {
	turn := func(b Break) Turn { return Turn{Blocks: []Block{Text("some text to break")}, Break: b} }
	s := start(t, Config{Turns: []Turn{turn(Cut), turn(Malformed), turn(ErrorEvent), turn(Cut)}})

	events, err := readSSE(post(t, s, body(true, hello)).Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut stream: err %v after %d events, want unexpected EOF", err, len(events))
	}
	if _, err := readSSE(post(t, s, body(true, hello)).Body); err == nil || !strings.Contains(err.Error(), "content_block_delta") {
		t.Errorf("malformed stream: err %v, want a bad content_block_delta", err)
	}
	events, err = readSSE(post(t, s, body(true, hello)).Body)
	if err != nil || events[len(events)-1].Name != "error" {
		t.Errorf("error event: err %v, last event %+v", err, events[len(events)-1])
	}
	if _, err := io.ReadAll(post(t, s, body(false, hello)).Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut JSON answer: err %v, want unexpected EOF", err)
	}
}

func TestRecordingConcurrent(t *testing.T) {
	s := start(t, Config{})
	const n = 20
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp := post(t, s, body(i%2 == 0, fmt.Sprintf(`[{"role":"user","content":"req %d"}]`, i)))
			b, _ := io.ReadAll(resp.Body)
			i := bytes.Index(b, []byte(`"id":"msg_`))
			ids <- string(b[i : i+30])
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		if seen[id] {
			t.Errorf("message id %s answered twice", id)
		}
		seen[id] = true
	}
	reqs := s.Requests()
	if len(reqs) != n {
		t.Fatalf("%d recorded, want %d", len(reqs), n)
	}
	texts := map[string]bool{}
	for _, r := range reqs {
		if r.Method != "POST" || r.Path != "/v1/messages" || r.Query != "beta=true" || r.Status != 200 ||
			r.Header.Get("anthropic-version") != "2023-06-01" || r.Messages == nil || len(r.Body) == 0 {
			t.Errorf("recorded %+v", r)
			continue
		}
		texts[r.LastUserText()] = true
	}
	if len(texts) != n {
		t.Errorf("%d distinct bodies recorded, want %d", len(texts), n)
	}
}
