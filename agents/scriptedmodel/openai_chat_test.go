package scriptedmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

func postChat(t *testing.T, s *Server, body string) *http.Response {
	t.Helper()
	return send(t, s, "POST", "/v1/chat/completions", openAIHeaders(s), body)
}

// chatBody is a request as OpenCode's OpenAI-compatible provider sends it.
func chatBody(stream bool, messages string) string {
	opts := ""
	if stream {
		opts = `,"stream_options":{"include_usage":true}`
	}
	return fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":32000,"temperature":0,"messages":%s,"tools":[{"type":"function","function":{"name":"bash","description":"run","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]},"strict":false}}],"tool_choice":"auto","stream":%v%s}`, messages, stream, opts)
}

type chatCompletion struct {
	ID, Object, Model string
	Choices           []struct {
		Index   int
		Message struct {
			Role      string
			Content   *string
			ToolCalls []chatCall `json:"tool_calls"`
		}
		FinishReason string `json:"finish_reason"`
	}
	Usage *chatUsageJSON
}

type chatCall struct {
	Index    int
	ID, Type string
	Function struct{ Name, Arguments string }
}

type chatUsageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// readChatStream reads chunks strictly up to [DONE] and assembles them
// into one completion, as a client does.
func readChatStream(t *testing.T, resp *http.Response) chatCompletion {
	t.Helper()
	data, err := readData(resp.Body)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(data) < 3 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream %v: want chunks then [DONE]", data)
	}
	var out chatCompletion
	out.Choices = make([]struct {
		Index   int
		Message struct {
			Role      string
			Content   *string
			ToolCalls []chatCall `json:"tool_calls"`
		}
		FinishReason string `json:"finish_reason"`
	}, 1)
	text := ""
	for i, d := range data[:len(data)-1] {
		var c struct {
			ID, Object, Model string
			Choices           []struct {
				Delta struct {
					Role      string
					Content   *string
					ToolCalls []chatCall `json:"tool_calls"`
				}
				FinishReason *string `json:"finish_reason"`
			}
			Usage *chatUsageJSON
		}
		if err := json.Unmarshal([]byte(d), &c); err != nil || c.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %d %s: %v", i, d, err)
		}
		if i == 0 {
			out.ID, out.Model = c.ID, c.Model
		} else if c.ID != out.ID {
			t.Errorf("chunk %d has id %s, the first %s", i, c.ID, out.ID)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 || i != len(data)-2 {
				t.Errorf("usage in chunk %d of %d with %d choices", i, len(data)-1, len(c.Choices))
			}
			out.Usage = c.Usage
		}
		for _, ch := range c.Choices {
			m := &out.Choices[0].Message
			if ch.Delta.Role != "" {
				m.Role = ch.Delta.Role
			}
			if ch.Delta.Content != nil {
				text += *ch.Delta.Content
				m.Content = &text
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Index == len(m.ToolCalls) {
					m.ToolCalls = append(m.ToolCalls, tc)
					continue
				}
				m.ToolCalls[tc.Index].Function.Arguments += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				out.Choices[0].FinishReason = *ch.FinishReason
			}
		}
	}
	if text == "" {
		out.Choices[0].Message.Content = nil
	}
	return out
}

func TestChatConversation(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			s := start(t, Config{Turns: []Turn{
				{Blocks: []Block{ToolUse("bash", map[string]string{"command": "ls"})}, Usage: usageTurn},
				{Match: LastUserContains("a.txt"), Blocks: []Block{Text("There is a.txt — ünïcode.")}, Usage: Usage{InputTokens: 50, OutputTokens: 7}},
			}})
			get := func(body string) chatCompletion {
				resp := postChat(t, s, body)
				if !stream {
					var c chatCompletion
					decode(t, resp, 200, &c)
					return c
				}
				return readChatStream(t, resp)
			}
			first := get(chatBody(stream, `[{"role":"system","content":"be brief"},{"role":"user","content":"list the files"}]`))
			if !strings.HasPrefix(first.ID, "chatcmpl-") || first.Model != "gpt-4.1" || len(first.Choices) != 1 {
				t.Fatalf("first answer %+v", first)
			}
			ch := first.Choices[0]
			if ch.FinishReason != "tool_calls" || ch.Message.Role != "assistant" || ch.Message.Content != nil || len(ch.Message.ToolCalls) != 1 {
				t.Fatalf("first choice %+v", ch)
			}
			call := ch.Message.ToolCalls[0]
			if !strings.HasPrefix(call.ID, "call_") || call.Type != "function" || call.Function.Name != "bash" || call.Function.Arguments != `{"command":"ls"}` {
				t.Errorf("tool call %+v", call)
			}
			if u := first.Usage; u == nil || u.PromptTokens != 1500 || u.PromptTokensDetails.CachedTokens != 400 || u.CompletionTokens != 300 ||
				u.CompletionTokensDetails.ReasoningTokens != 120 || u.TotalTokens != 1800 {
				t.Errorf("usage %+v, want prompt 1500 (400 cached), completion 300 (120 reasoning), total 1800", u)
			}
			second := get(chatBody(stream, `[{"role":"system","content":"be brief"},{"role":"user","content":"list the files"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"`+call.ID+`","type":"function","function":{"name":"bash","arguments":"{\"command\":\"ls\"}"}}]},
				{"role":"tool","tool_call_id":"`+call.ID+`","content":"a.txt"}]`))
			if c := second.Choices[0]; c.FinishReason != "stop" || c.Message.Content == nil || *c.Message.Content != "There is a.txt — ünïcode." || second.Usage.CompletionTokens != 7 {
				t.Errorf("second answer %+v", second)
			}
			if reqs := s.Requests(); len(reqs) != 2 || reqs[1].Chat == nil || len(reqs[1].Chat.Messages) != 4 || reqs[1].Chat.Messages[2].ToolCalls[0].ID != call.ID || reqs[1].LastUserText() != "a.txt" {
				t.Errorf("recorded %+v", reqs)
			}
		})
	}
}

func TestChatStreamWithoutUsage(t *testing.T) {
	s := start(t, Config{Turns: []Turn{{Blocks: []Block{Text("hi")}, Usage: Usage{InputTokens: 5, OutputTokens: 2}}}})
	resp := postChat(t, s, `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	data, err := readData(resp.Body)
	if err != nil || strings.Contains(strings.Join(data, ""), `"usage"`) || data[len(data)-1] != "[DONE]" {
		t.Errorf("stream without include_usage: %v %v", data, err)
	}
}

func TestChatOutputCapped(t *testing.T) {
	s := start(t, Config{Turns: []Turn{
		{Blocks: []Block{Text("long")}, Usage: Usage{InputTokens: 10, OutputTokens: 5000}},
		{Blocks: []Block{Text("long")}, StopReason: "max_tokens", Usage: Usage{InputTokens: 10, OutputTokens: 5000, ReasoningTokens: 90}},
	}})
	var c chatCompletion
	decode(t, postChat(t, s, `{"model":"m","max_completion_tokens":100,"max_tokens":7,"messages":[{"role":"user","content":"x"}]}`), 200, &c)
	if c.Usage.CompletionTokens != 100 || c.Usage.TotalTokens != 110 {
		t.Errorf("usage %+v, want completion capped at max_completion_tokens 100", c.Usage)
	}
	got := readChatStream(t, postChat(t, s, chatBody(true, `[{"role":"user","content":"x"}]`)))
	if got.Choices[0].FinishReason != "length" || got.Usage.CompletionTokens != 5000 {
		t.Errorf("max_tokens 32000 answer %+v", got)
	}
	s2 := start(t, Config{Final: &Turn{Blocks: []Block{Text("long")}, Usage: Usage{OutputTokens: 5000, ReasoningTokens: 90}}})
	decode(t, postChat(t, s2, `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"x"}]}`), 200, &c)
	if c.Usage.CompletionTokens != 50 || c.Usage.CompletionTokensDetails.ReasoningTokens != 50 {
		t.Errorf("usage %+v, want completion capped at max_tokens 50", c.Usage)
	}
}

func TestChatValidation(t *testing.T) {
	s := start(t, Config{})
	user := `{"role":"user","content":"hi"}`
	calls := `{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{}"}},{"id":"call_2","type":"function","function":{"name":"bash","arguments":"{}"}}]}`
	tool := func(id string) string { return `{"role":"tool","tool_call_id":"` + id + `","content":"ok"}` }
	msgs := func(ms ...string) string { return `{"model":"m","messages":[` + strings.Join(ms, ",") + `]}` }
	cases := []struct {
		name, body, param, code, msg string
	}{
		{"not json", `{"model":`, "", "", "could not parse the JSON body"},
		{"unknown field", `{"model":"m","messages":[` + user + `],"max_output_tokens":5}`, "", "", "Unrecognized request argument supplied: max_output_tokens"},
		{"no model", `{"messages":[` + user + `]}`, "", "", "you must provide a model parameter"},
		{"model number", `{"model":1,"messages":[` + user + `]}`, "model", "invalid_type", "expected a string"},
		{"no messages", `{"model":"m"}`, "messages", "missing_required_parameter", "Missing required parameter: 'messages'."},
		{"empty messages", msgs(), "messages", "empty_array", "empty array"},
		{"messages object", `{"model":"m","messages":{}}`, "messages", "invalid_type", "an array"},
		{"max_tokens zero", `{"model":"m","max_tokens":0,"messages":[` + user + `]}`, "max_tokens", "integer_below_min_value", ">= 1"},
		{"max_completion_tokens string", `{"model":"m","max_completion_tokens":"9","messages":[` + user + `]}`, "max_completion_tokens", "invalid_type", "an integer"},
		{"temperature -1", `{"model":"m","temperature":-1,"messages":[` + user + `]}`, "temperature", "decimal_out_of_range", "between 0 and 2"},
		{"n 0", `{"model":"m","n":0,"messages":[` + user + `]}`, "n", "integer_out_of_range", "between 1 and 128"},
		{"stream_options without stream", `{"model":"m","stream_options":{"include_usage":true},"messages":[` + user + `]}`, "stream_options", "", "only allowed when 'stream' is enabled"},
		{"no role", msgs(`{"content":"x"}`), "messages[0].role", "missing_required_parameter", "Missing"},
		{"odd role", msgs(`{"role":"model","content":"x"}`), "messages[0].role", "invalid_value", "Invalid value: 'model'"},
		{"user without content", msgs(`{"role":"user"}`), "messages[0].content", "missing_required_parameter", "Missing"},
		{"assistant without content or calls", msgs(user, `{"role":"assistant","content":null}`), "messages[1].content", "missing_required_parameter", "Missing"},
		{"content number", msgs(`{"role":"user","content":5}`), "messages[0].content", "invalid_type", "a string or an array"},
		{"part odd type", msgs(`{"role":"user","content":[{"type":"input_text","text":"x"}]}`), "messages[0].content[0].type", "invalid_value", "'input_text'"},
		{"system image", msgs(`{"role":"system","content":[{"type":"image_url","image_url":{"url":"x"}}]}`), "messages[0].content[0].type", "invalid_value", "'image_url'"},
		{"text part without text", msgs(`{"role":"user","content":[{"type":"text"}]}`), "messages[0].content[0].text", "missing_required_parameter", "Missing"},
		{"user tool_calls", msgs(`{"role":"user","content":"x","tool_calls":[]}`), "messages[0].tool_calls", "", "only messages with role 'assistant'"},
		{"tool call without id", msgs(user, `{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}`), "messages[1].tool_calls[0].id", "missing_required_parameter", "Missing"},
		{"tool call without arguments", msgs(user, `{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f"}}]}`), "messages[1].tool_calls[0].function.arguments", "missing_required_parameter", "Missing"},
		{"tool without tool_call_id", msgs(user, calls, `{"role":"tool","content":"ok"}`), "messages[2].tool_call_id", "missing_required_parameter", "Missing"},
		{"tool message stray", msgs(user, tool("call_1")), "messages.[1].role", "", "must be a response to a preceeding message with 'tool_calls'"},
		{"tool message wrong id", msgs(user, calls, tool("call_9")), "messages.[2].tool_call_id", "", "'call_9' not found in 'tool_calls' of previous message"},
		{"call unanswered", msgs(user, calls, tool("call_1"), user), "messages.[1].role", "", "did not have response messages: call_2"},
		{"call unanswered at the end", msgs(user, calls), "messages.[1].role", "", "did not have response messages: call_1, call_2"},
		{"tools object", `{"model":"m","tools":{},"messages":[` + user + `]}`, "tools", "invalid_type", "an array"},
		{"tool without function", `{"model":"m","tools":[{"type":"function"}],"messages":[` + user + `]}`, "tools[0].function", "missing_required_parameter", "Missing"},
		{"function without name", `{"model":"m","tools":[{"type":"function","function":{"parameters":{}}}],"messages":[` + user + `]}`, "tools[0].function.name", "missing_required_parameter", "Missing"},
		{"tool odd type", `{"model":"m","tools":[{"type":"web_search"}],"messages":[` + user + `]}`, "tools[0].type", "invalid_value", "'web_search'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := postChat(t, s, tc.body)
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
	ok := msgs(`{"role":"developer","content":[{"type":"text","text":"rules"}]}`, `{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"data:,"}}]}`,
		calls, tool("call_2"), tool("call_1"), `{"role":"assistant","content":"done","refusal":null}`, user)
	if resp := postChat(t, s, ok); resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("a valid conversation: %d %s", resp.StatusCode, b)
	}
	if reqs := s.Requests(); len(reqs) != len(cases)+1 || reqs[len(cases)].Chat.assistantTurns() != 2 {
		t.Errorf("%d requests recorded, want %d", len(reqs), len(cases)+1)
	}
}

func TestChatHTTPAndErrors(t *testing.T) {
	s := start(t, Config{Key: "sk-right", Turns: []Turn{
		{Error: Overloaded()},
		{Error: &APIError{Status: 429, Type: "insufficient_quota", Code: "insufficient_quota", Message: "You exceeded your current quota"}},
	}})
	ok := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	wantOpenAIError(t, send(t, s, "POST", "/v1/chat/completions", map[string]string{"Authorization": "Bearer sk-wrong"}, ok), 401, "invalid_request_error", "invalid_api_key", "Incorrect API key")
	wantOpenAIError(t, send(t, s, "POST", "/v1/chat/completions", nil, ok), 401, "invalid_request_error", "", "You didn't provide an API key")
	wantOpenAIError(t, postChat(t, s, ok), 503, "server_error", "", "overloaded")
	wantOpenAIError(t, postChat(t, s, ok), 429, "insufficient_quota", "insufficient_quota", "current quota")
}

func TestChatBrokenStreams(t *testing.T) {
	turn := func(b Break) Turn {
		return Turn{Blocks: []Block{ToolUse("bash", map[string]string{"command": "ls -l"})}, Break: b}
	}
	s := start(t, Config{Turns: []Turn{turn(Cut), turn(Malformed), turn(ErrorEvent), turn(Cut)}})
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`
	if data, err := readData(postChat(t, s, body).Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut stream: err %v after %v", err, data)
	}
	data, err := readData(postChat(t, s, body).Body)
	bad := 0
	for _, d := range data {
		if d != "[DONE]" && !json.Valid([]byte(d)) {
			bad++
		}
	}
	if err != nil || bad != 1 || data[len(data)-1] != "[DONE]" {
		t.Errorf("malformed stream: %d bad chunks, err %v", bad, err)
	}
	data, err = readData(postChat(t, s, body).Body)
	if err != nil || !strings.HasPrefix(data[len(data)-1], `{"error":{`) {
		t.Errorf("error chunk: err %v, data %v", err, data)
	}
	if _, err := io.ReadAll(postChat(t, s, `{"model":"m","messages":[{"role":"user","content":"x"}]}`).Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut JSON answer: err %v", err)
	}
}
