package scriptedmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func postResponses(t *testing.T, s *Server, body string) *http.Response {
	t.Helper()
	return send(t, s, "POST", "/v1/responses", openAIHeaders(s), body)
}

// responsesBody is a request as Codex sends it, with input items.
func responsesBody(stream bool, input string) string {
	return fmt.Sprintf(`{"model":"gpt-5-codex","instructions":"You are Codex.","input":%s,"tools":[{"type":"function","name":"shell","description":"run","strict":false,"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}}}}],"tool_choice":"auto","parallel_tool_calls":false,"reasoning":{"effort":"medium","summary":"auto"},"store":false,"stream":%v,"include":["reasoning.encrypted_content"],"prompt_cache_key":"thread-1"}`, input, stream)
}

const responsesHello = `[{"type":"message","role":"user","content":[{"type":"input_text","text":"list the files"}]}]`

// argText is a function call's arguments (a JSON string) or, for a tool
// search, the arguments object's JSON text.
type argText string

func (a *argText) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*a = argText(s)
		return nil
	}
	*a = argText(b)
	return nil
}

type responseObject struct {
	ID, Object, Status, Model string
	IncompleteDetails         *struct{ Reason string } `json:"incomplete_details"`
	Output                    []struct {
		ID, Type, Status, Role, Name string
		Arguments                    argText
		Namespace                    string
		CallID                       string `json:"call_id"`
		Content                      []struct{ Type, Text string }
	}
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int `json:"total_tokens"`
	}
}

// readResponsesStream reads a Responses stream strictly (event names
// match data types, sequence numbers count from 0) and rebuilds the
// final response from the deltas, checking it against the completed
// event's.
func readResponsesStream(t *testing.T, resp *http.Response) (final responseObject, names []string) {
	t.Helper()
	events, err := readSSE(resp.Body)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	texts, args := map[int]string{}, map[int]string{}
	for i, e := range events {
		names = append(names, e.Name)
		var d struct {
			Seq         int    `json:"sequence_number"`
			OutputIndex int    `json:"output_index"`
			Delta       string `json:"delta"`
			Response    json.RawMessage
		}
		if err := json.Unmarshal(e.Data, &d); err != nil || d.Seq != i {
			t.Fatalf("event %d %s: sequence %d (%v)", i, e.Data, d.Seq, err)
		}
		switch e.Name {
		case "response.output_text.delta":
			texts[d.OutputIndex] += d.Delta
		case "response.function_call_arguments.delta":
			args[d.OutputIndex] += d.Delta
		case "response.completed", "response.incomplete":
			if err := json.Unmarshal(d.Response, &final); err != nil {
				t.Fatal(err)
			}
		}
	}
	if names[0] != "response.created" || names[1] != "response.in_progress" {
		t.Errorf("stream starts %v", names[:2])
	}
	for i, o := range final.Output {
		switch o.Type {
		case "message":
			if texts[i] != o.Content[0].Text {
				t.Errorf("output %d: deltas %q, done %q", i, texts[i], o.Content[0].Text)
			}
		case "function_call":
			if args[i] != string(o.Arguments) {
				t.Errorf("output %d: argument deltas %q, done %q", i, args[i], o.Arguments)
			}
		}
	}
	return final, names
}

func TestResponsesConversation(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			s := start(t, Config{Turns: []Turn{
				{Blocks: []Block{Text("Looking."), ToolUse("shell", map[string]any{"command": []string{"ls"}})}, Usage: usageTurn},
				{Match: LastUserContains("a.txt"), Blocks: []Block{Text("There is a.txt — ünïcode.")}, Usage: Usage{InputTokens: 50, OutputTokens: 7}},
			}})
			get := func(body string) responseObject {
				resp := postResponses(t, s, body)
				if resp.StatusCode != 200 {
					b, _ := io.ReadAll(resp.Body)
					t.Fatalf("status %d %s", resp.StatusCode, b)
				}
				if !stream {
					var r responseObject
					decode(t, resp, 200, &r)
					return r
				}
				r, _ := readResponsesStream(t, resp)
				return r
			}
			first := get(responsesBody(stream, responsesHello))
			if first.Object != "response" || first.Status != "completed" || !strings.HasPrefix(first.ID, "resp_") || first.Model != "gpt-5-codex" || len(first.Output) != 2 {
				t.Fatalf("first answer %+v", first)
			}
			msg, call := first.Output[0], first.Output[1]
			if msg.Type != "message" || msg.Role != "assistant" || msg.Content[0].Type != "output_text" || msg.Content[0].Text != "Looking." {
				t.Errorf("message item %+v", msg)
			}
			if call.Type != "function_call" || call.Name != "shell" || call.Arguments != `{"command":["ls"]}` || !strings.HasPrefix(call.CallID, "call_") || !strings.HasPrefix(call.ID, "fc_") {
				t.Errorf("function_call item %+v", call)
			}
			u := first.Usage
			if u.InputTokens != 1500 || u.InputTokensDetails.CachedTokens != 400 || u.OutputTokens != 300 || u.OutputTokensDetails.ReasoningTokens != 120 || u.TotalTokens != 1800 {
				t.Errorf("usage %+v, want input 1500 (400 cached), output 300 (120 reasoning), total 1800", u)
			}
			input := `[{"type":"message","role":"user","content":[{"type":"input_text","text":"list the files"}]},
				{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"xyz"},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."}]},
				{"type":"function_call","name":"shell","arguments":"{\"command\":[\"ls\"]}","call_id":"` + call.CallID + `"},
				{"type":"function_call_output","call_id":"` + call.CallID + `","output":"a.txt\n"}]`
			second := get(responsesBody(stream, input))
			if len(second.Output) != 1 || second.Output[0].Content[0].Text != "There is a.txt — ünïcode." || second.Usage.InputTokens != 50 || second.Usage.OutputTokens != 7 {
				t.Errorf("second answer %+v", second)
			}
			reqs := s.Requests()
			if len(reqs) != 2 || reqs[1].Responses == nil || len(reqs[1].Responses.Input) != 5 || reqs[1].Responses.Input[4].CallID != call.CallID {
				t.Fatalf("recorded %+v", reqs)
			}
			if got := reqs[1].LastUserText(); got != "a.txt\n" {
				t.Errorf("LastUserText() = %q", got)
			}
		})
	}
}

func TestResponsesOutputCapped(t *testing.T) {
	s := start(t, Config{Turns: []Turn{
		{Blocks: []Block{Text("long")}, Usage: Usage{InputTokens: 10, OutputTokens: 5000, ReasoningTokens: 4000}},
		{Blocks: []Block{Text("cut")}, StopReason: "max_tokens", Usage: Usage{InputTokens: 10, OutputTokens: 5000}},
	}})
	var r responseObject
	decode(t, postResponses(t, s, `{"model":"gpt-5","input":"hi","max_output_tokens":64}`), 200, &r)
	if r.Usage.OutputTokens != 64 || r.Usage.OutputTokensDetails.ReasoningTokens != 64 || r.Usage.TotalTokens != 74 {
		t.Errorf("usage %+v, want output capped at 64", r.Usage)
	}
	got, names := readResponsesStream(t, postResponses(t, s, `{"model":"gpt-5","input":"hi","max_output_tokens":64,"stream":true}`))
	if got.Status != "incomplete" || got.IncompleteDetails == nil || got.IncompleteDetails.Reason != "max_output_tokens" ||
		got.Usage.OutputTokens != 64 || names[len(names)-1] != "response.incomplete" {
		t.Errorf("truncated answer %+v, events %v", got, names)
	}
}

func TestResponsesValidation(t *testing.T) {
	s := start(t, Config{})
	call := `{"type":"function_call","call_id":"call_1","name":"shell","arguments":"{}"}`
	out := `{"type":"function_call_output","call_id":"call_1","output":"ok"}`
	user := `{"role":"user","content":"hi"}`
	in := func(items ...string) string { return `{"model":"m","input":[` + strings.Join(items, ",") + `]}` }
	cases := []struct {
		name, body, param, code, msg string
	}{
		{"not json", `{"model":`, "", "", "could not parse the JSON body"},
		{"array body", `[]`, "", "", "could not parse"},
		{"trailing data", `{"model":"m"}{}`, "", "", "could not parse"},
		{"unknown field", `{"model":"m","input":"x","max_tokens":5}`, "max_tokens", "unknown_parameter", "Unknown parameter: 'max_tokens'."},
		{"no model", `{"input":"x"}`, "model", "missing_required_parameter", "Missing required parameter: 'model'."},
		{"model number", `{"model":5,"input":"x"}`, "model", "invalid_type", "expected a string"},
		{"stream string", `{"model":"m","input":"x","stream":"yes"}`, "stream", "invalid_type", "a boolean"},
		{"cap below 16", `{"model":"m","input":"x","max_output_tokens":8}`, "max_output_tokens", "integer_below_min_value", ">= 16"},
		{"cap fraction", `{"model":"m","input":"x","max_output_tokens":20.5}`, "max_output_tokens", "invalid_type", "an integer"},
		{"temperature 3", `{"model":"m","input":"x","temperature":3}`, "temperature", "decimal_out_of_range", "between 0 and 2"},
		{"top_p 2", `{"model":"m","input":"x","top_p":2}`, "top_p", "decimal_out_of_range", "between 0 and 1"},
		{"instructions list", `{"model":"m","input":"x","instructions":[]}`, "instructions", "invalid_type", "a string"},
		{"previous response", `{"model":"m","input":"x","previous_response_id":"resp_1"}`, "previous_response_id", "previous_response_not_found", "not found"},
		{"stream_options without stream", `{"model":"m","input":"x","stream_options":{}}`, "stream_options", "", "only allowed when 'stream' is true"},
		{"store string", `{"model":"m","input":"x","store":"no"}`, "store", "invalid_type", "a boolean"},
		{"include object", `{"model":"m","input":"x","include":{}}`, "include", "invalid_type", "array of strings"},
		{"input number", `{"model":"m","input":5}`, "input", "invalid_type", "a string or an array"},
		{"item not object", in(`"x"`), "input[0]", "invalid_type", "an object"},
		{"item without type or role", in(`{"content":"x"}`), "input[0].type", "missing_required_parameter", "Missing required"},
		{"item odd type", in(`{"type":"thought"}`), "input[0].type", "invalid_value", "Invalid value: 'thought'"},
		{"message odd role", in(`{"role":"tool","content":"x"}`), "input[0].role", "invalid_value", "'tool'"},
		{"message without content", in(`{"role":"user"}`), "input[0].content", "missing_required_parameter", "Missing"},
		{"user output_text", in(`{"role":"user","content":[{"type":"output_text","text":"x"}]}`), "input[0].content[0].type", "invalid_value", "'output_text'"},
		{"assistant input_text", in(user, `{"role":"assistant","content":[{"type":"input_text","text":"x"}]}`), "input[1].content[0].type", "invalid_value", "Supported values are: 'output_text', 'refusal'"},
		{"text part without text", in(`{"role":"user","content":[{"type":"input_text"}]}`), "input[0].content[0].text", "missing_required_parameter", "Missing"},
		{"call without call_id", in(user, `{"type":"function_call","name":"shell","arguments":"{}"}`), "input[1].call_id", "missing_required_parameter", "Missing"},
		{"call without arguments", in(user, `{"type":"function_call","call_id":"c","name":"shell"}`), "input[1].arguments", "missing_required_parameter", "Missing"},
		{"output without output", in(user, call, `{"type":"function_call_output","call_id":"call_1"}`), "input[2].output", "missing_required_parameter", "Missing"},
		{"output number", in(user, call, `{"type":"function_call_output","call_id":"call_1","output":5}`), "input[2].output", "invalid_type", "a string or an array"},
		{"stray output", in(user, `{"type":"function_call_output","call_id":"call_9","output":"ok"}`), "input", "", "No tool call found for function call output with call_id call_9."},
		{"output before its call", in(user, out, call), "input", "", "No tool call found for function call output with call_id call_1."},
		{"unanswered call", in(user, call, user), "input", "", "No tool output found for function call call_1."},
		{"output of another kind", in(user, call, `{"type":"custom_tool_call_output","call_id":"call_1","output":"ok"}`), "input", "", "No tool call found for custom tool call output"},
		{"reasoning without summary", in(user, `{"type":"reasoning","id":"rs"}`), "input[1].summary", "missing_required_parameter", "Missing"},
		{"arguments object", in(user, `{"type":"function_call","call_id":"c","name":"shell","arguments":{}}`), "input[1].arguments", "invalid_type", "a string"},
		{"search without execution", in(user, `{"type":"tool_search_call","call_id":"s","arguments":{}}`), "input[1].execution", "missing_required_parameter", "Missing"},
		{"search odd execution", in(user, `{"type":"tool_search_call","call_id":"s","execution":"host","arguments":{}}`), "input[1].execution", "invalid_value", "'host'"},
		{"search arguments string", in(user, `{"type":"tool_search_call","call_id":"s","execution":"client","arguments":"{}"}`), "input[1].arguments", "invalid_type", "an object"},
		{"search output tools object", in(user, `{"type":"tool_search_call","call_id":"s","execution":"client","arguments":{}}`, `{"type":"tool_search_output","call_id":"s","execution":"client","tools":{}}`), "input[2].tools", "invalid_type", "an array"},
		{"unanswered search", in(user, `{"type":"tool_search_call","call_id":"s","execution":"client","arguments":{}}`, user), "input", "", "No tool output found for tool search call s."},
		{"stray search output", in(user, `{"type":"tool_search_output","call_id":"s","execution":"client","tools":[]}`), "input", "", "No tool call found for tool search output with call_id s."},
		{"tools object", `{"model":"m","input":"x","tools":{}}`, "tools", "invalid_type", "an array"},
		{"tool without type", `{"model":"m","input":"x","tools":[{"name":"f"}]}`, "tools[0].type", "missing_required_parameter", "Missing"},
		{"tool odd type", `{"model":"m","input":"x","tools":[{"type":"bash"}]}`, "tools[0].type", "invalid_value", "'bash'"},
		{"function without name", `{"model":"m","input":"x","tools":[{"type":"function","parameters":{}}]}`, "tools[0].name", "missing_required_parameter", "Missing"},
		{"function parameters list", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":[]}]}`, "tools[0].parameters", "invalid_type", "an object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := postResponses(t, s, tc.body)
			b, _ := io.ReadAll(resp.Body)
			var e struct{ Error map[string]any }
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("body %s: %v", b, err)
			}
			param, _ := e.Error["param"].(string)
			code, _ := e.Error["code"].(string)
			msg, _ := e.Error["message"].(string)
			if resp.StatusCode != 400 || e.Error["type"] != "invalid_request_error" || param != tc.param || code != tc.code || !strings.Contains(msg, tc.msg) {
				t.Errorf("got %d %s, want 400 param %q code %q message containing %q", resp.StatusCode, b, tc.param, tc.code, tc.msg)
			}
		})
	}
	if reqs := s.Requests(); len(reqs) != len(cases) || reqs[0].Responses != nil || reqs[0].Status != 400 {
		t.Errorf("%d requests recorded, want %d refused", len(reqs), len(cases))
	}
}

func TestResponsesAcceptsWhatClientsSend(t *testing.T) {
	s := start(t, Config{})
	bodies := []string{
		responsesBody(true, responsesHello),
		// As the AI SDK (OpenCode) sends it: a system message, nulls, ids on items.
		`{"model":"gpt-5","input":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"data:image/png;base64,AA=="}]},
		  {"role":"assistant","content":[{"type":"output_text","text":"ok"}],"id":"msg_1"},{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin Patch"},
		  {"type":"custom_tool_call_output","call_id":"c2","output":"done"},{"type":"local_shell_call","call_id":"c3","status":"completed","action":{"type":"exec","command":["ls"]}},
		  {"type":"function_call_output","call_id":"c4","output":[{"type":"input_text","text":"x"}]},{"type":"function_call","call_id":"c4","name":"f","arguments":"{}"}],
		 "temperature":null,"max_output_tokens":null,"text":{"verbosity":"low"},"tools":[{"type":"local_shell"},{"type":"web_search"},{"type":"custom","name":"apply_patch","format":{"type":"grammar"}}],
		 "service_tier":"auto","client_metadata":{"a":"b"},"truncation":"disabled","metadata":{"k":"v"}}`,
	}
	for i, b := range bodies {
		resp := postResponses(t, s, b)
		got, _ := io.ReadAll(resp.Body)
		if i == 1 {
			// The output answers a call that comes after it: refused, as the API does.
			if resp.StatusCode != 400 || !strings.Contains(string(got), "No tool call found for function call output with call_id c4") {
				t.Errorf("out of order output: %d %s", resp.StatusCode, got)
			}
			continue
		}
		if resp.StatusCode != 200 {
			t.Errorf("body %d: %d %s", i, resp.StatusCode, got)
		}
	}
	fixed := strings.Replace(bodies[1], `{"type":"function_call_output","call_id":"c4","output":[{"type":"input_text","text":"x"}]},{"type":"function_call","call_id":"c4","name":"f","arguments":"{}"}`,
		`{"type":"function_call","call_id":"c4","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c4","output":[{"type":"input_text","text":"x"}]}`, 1)
	resp := postResponses(t, s, fixed)
	if got, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 {
		t.Errorf("in order: %d %s", resp.StatusCode, got)
	}
	if r := s.Requests()[2].Responses; r == nil || r.MaxOutputTokens != 0 || r.assistantTurns() != 2 || r.lastUserText() != "x" {
		t.Errorf("parsed: assistant turns %d, last user text %q; want 2 and x", r.assistantTurns(), r.lastUserText())
	}
}

func TestResponsesHTTPAndErrors(t *testing.T) {
	s := start(t, Config{Key: "sk-right", Turns: []Turn{
		{Error: Overloaded()},
		{Error: &APIError{Status: 429, Type: "rate_limit_error"}},
		{Error: &APIError{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded", Message: "too long"}},
	}})
	ok := `{"model":"m","input":"x"}`
	wantOpenAIError(t, send(t, s, "POST", "/v1/responses", map[string]string{}, ok), 401, "invalid_request_error", "", "You didn't provide an API key")
	wantOpenAIError(t, send(t, s, "POST", "/v1/responses", map[string]string{"Authorization": "Bearer sk-wrong"}, ok), 401, "invalid_request_error", "invalid_api_key", "Incorrect API key")
	wantOpenAIError(t, send(t, s, "POST", "/v1/responses", map[string]string{"x-api-key": "sk-right"}, ok), 401, "invalid_request_error", "", "You didn't provide")
	wantOpenAIError(t, send(t, s, "GET", "/v1/responses", openAIHeaders(s), ok), 405, "invalid_request_error", "", "Invalid method")
	wantOpenAIError(t, postResponses(t, s, ok), 503, "server_error", "", "overloaded")
	wantOpenAIError(t, postResponses(t, s, ok), 429, "requests", "rate_limit_exceeded", "rate limit")
	wantOpenAIError(t, postResponses(t, s, ok), 400, "invalid_request_error", "context_length_exceeded", "too long")
	if reqs := s.Requests(); len(reqs) != 7 || reqs[4].Status != 503 || reqs[4].Responses == nil {
		t.Errorf("recorded %+v", reqs)
	}
}

func TestResponsesBrokenStreams(t *testing.T) {
	turn := func(b Break) Turn { return Turn{Blocks: []Block{Text("some text to break")}, Break: b} }
	s := start(t, Config{Turns: []Turn{turn(Cut), turn(Malformed), turn(ErrorEvent), turn(Cut)}})
	body := `{"model":"m","input":"x","stream":true}`
	events, err := readSSE(postResponses(t, s, body).Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut stream: err %v after %d events", err, len(events))
	}
	if _, err := readSSE(postResponses(t, s, body).Body); err == nil || !strings.Contains(err.Error(), "output_text.delta") {
		t.Errorf("malformed stream: err %v", err)
	}
	events, err = readSSE(postResponses(t, s, body).Body)
	if err != nil || events[len(events)-1].Name != "error" || !strings.Contains(string(events[len(events)-1].Data), `"code":"server_error"`) {
		t.Errorf("error event: err %v, events %+v", err, events)
	}
	if _, err := io.ReadAll(postResponses(t, s, `{"model":"m","input":"x"}`).Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut JSON answer: err %v", err)
	}
}

func TestResponsesPerConversation(t *testing.T) {
	s := start(t, Config{PerConversation: true, Turns: []Turn{
		{Blocks: []Block{Text("one")}}, {Blocks: []Block{Text("two")}},
	}})
	text := func(input string) string {
		var r responseObject
		decode(t, postResponses(t, s, `{"model":"m","input":`+input+`}`), 200, &r)
		return r.Output[0].Content[0].Text
	}
	first := `[{"role":"user","content":"a"}]`
	second := `[{"role":"user","content":"a"},{"type":"reasoning","summary":[]},{"role":"assistant","content":"one"},{"role":"user","content":"b"}]`
	if a, b, c := text(first), text(second), text(first); a != "one" || b != "two" || c != "one" {
		t.Errorf("answers %q %q %q, want one two one", a, b, c)
	}
}

// TestResponsesToolSearch: a tool_use block calling "tool_search" in a
// request that offers a tool of type tool_search is a tool_search_call
// item (its arguments an object, whole in the stream), and one named
// NS__TOOL after a search whose output offered namespace NS with TOOL is
// a function_call of TOOL in NS, as Codex 0.169.0 reads them.
func TestResponsesToolSearch(t *testing.T) {
	s := start(t, Config{Turns: []Turn{
		{Blocks: []Block{ToolUse("tool_search", map[string]any{"query": "list agents"})}},
		{Blocks: []Block{ToolUse("mcp__hearth__list_agents", map[string]any{})}},
		{Blocks: []Block{ToolUse("mcp__other__list_agents", map[string]any{})}},
	}})
	withSearch := func(input string) string {
		return strings.Replace(responsesBody(true, input), `"tools":[`, `"tools":[{"type":"tool_search","execution":"client","description":"search","parameters":{"type":"object","properties":{"query":{"type":"string"}}}},`, 1)
	}
	final, names := readResponsesStream(t, postResponses(t, s, withSearch(responsesHello)))
	if len(final.Output) != 1 || final.Output[0].Type != "tool_search_call" || final.Output[0].CallID == "" {
		t.Fatalf("output %+v, want one tool_search_call", final.Output)
	}
	if slices.Contains(names, "response.function_call_arguments.delta") {
		t.Errorf("a tool search's arguments were streamed in deltas: %v", names)
	}
	searched := strings.TrimSuffix(responsesHello, "]") + `,{"type":"tool_search_call","call_id":"` + final.Output[0].CallID + `","status":"completed","execution":"client","arguments":{"query":"list agents"}},` +
		`{"type":"tool_search_output","call_id":"` + final.Output[0].CallID + `","status":"completed","execution":"client","tools":[{"type":"namespace","name":"mcp__hearth","description":"d","tools":[{"type":"function","name":"list_agents","parameters":{"type":"object"}}]}]}]`
	resp := postResponses(t, s, withSearch(searched))
	final, _ = readResponsesStream(t, resp)
	if len(final.Output) != 1 || final.Output[0].Type != "function_call" || final.Output[0].Name != "list_agents" || final.Output[0].Namespace != "mcp__hearth" {
		t.Fatalf("after the search: output %+v, want a call of list_agents", final.Output)
	}
	if string(final.Output[0].Arguments) != "{}" {
		t.Errorf("arguments %q", final.Output[0].Arguments)
	}
	events, err := readSSE(postResponses(t, s, withSearch(responsesHello)).Body)
	if err != nil {
		t.Fatal(err)
	}
	last := string(events[len(events)-1].Data)
	if !strings.Contains(last, `"name":"mcp__other__list_agents"`) || strings.Contains(last, `"namespace"`) {
		t.Errorf("a name no offered namespace has is called as it is, without a namespace: %s", last)
	}
}
