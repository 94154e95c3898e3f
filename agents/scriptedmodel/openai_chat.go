package scriptedmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// OpenAI's Chat Completions API (POST /v1/chat/completions), as
// OpenCode's OpenAI-compatible providers speak it.

// ChatRequest is a validated Chat Completions request body.
type ChatRequest struct {
	Model string
	// MaxTokens is max_completion_tokens, else the older max_tokens; 0:
	// neither sent.
	MaxTokens    int
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	Messages     []ChatMessage
	Tools        []json.RawMessage
	// Fields holds every top-level field as sent.
	Fields map[string]json.RawMessage
}

// ChatMessage is one entry of messages; Raw is the message as sent.
type ChatMessage struct {
	Role       string
	Text       string // string content, or its text parts joined
	ToolCalls  []ChatToolCall
	ToolCallID string // role tool
	Raw        json.RawMessage
}

// ChatToolCall is one entry of an assistant message's tool_calls.
type ChatToolCall struct {
	ID        string
	Name      string
	Arguments string
}

// chatFields are the request body's fields in the API reference.
var chatFields = []string{
	"audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
	"max_completion_tokens", "max_tokens", "messages", "metadata", "modalities", "model", "n",
	"parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
	"prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
	"service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice",
	"tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
}

var chatRoles = []string{"system", "assistant", "user", "function", "tool", "developer"}

type chatProtocol struct{ openAIAuth }

func (chatProtocol) parse(_ *http.Request, body []byte, rec *Request) *protoError {
	req, e := parseChat(body)
	if e != nil {
		return e
	}
	rec.Chat = req
	return nil
}

// parseChat validates body as the Chat Completions API does.
func parseChat(body []byte) (*ChatRequest, *protoError) {
	fields, ok := objectFields(body)
	if !ok {
		return nil, badRequest("", "", "We could not parse the JSON body of your request. The API expects a JSON object.")
	}
	if k := unknownField(fields, chatFields); k != "" {
		return nil, badRequest("", "", "Unrecognized request argument supplied: %s", k)
	}
	req := &ChatRequest{Fields: fields}
	if _, ok := present(fields, "model"); !ok {
		return nil, badRequest("", "", "you must provide a model parameter")
	}
	capField := "max_completion_tokens"
	if _, ok := present(fields, capField); !ok {
		capField = "max_tokens"
	}
	var e *protoError
	req.Model, req.MaxTokens, req.Stream, e = openAIFields(fields, capField, 1)
	if e != nil {
		return nil, e
	}
	if raw, ok := present(fields, "n"); ok {
		n, ok := integer(raw)
		if !ok || n < 1 || n > 128 {
			return nil, badRequest("n", "integer_out_of_range", "Invalid 'n': expected an integer between 1 and 128.")
		}
	}
	if raw, ok := present(fields, "stream_options"); ok {
		if !req.Stream {
			return nil, badRequest("stream_options", "", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if jsonKind(raw) != '{' || json.Unmarshal(raw, &so) != nil {
			return nil, invalidType("stream_options", "an object")
		}
		req.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	if e := req.parseTools(); e != nil {
		return nil, e
	}
	if e := req.parseMessages(); e != nil {
		return nil, e
	}
	return req, nil
}

func (req *ChatRequest) parseTools() *protoError {
	return parseToolList(req.Fields, &req.Tools, func(where, typ string, t json.RawMessage) *protoError {
		var tool struct {
			Function *struct {
				Name       *string         `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
			Custom json.RawMessage `json:"custom"`
		}
		if json.Unmarshal(t, &tool) != nil {
			return invalidType(where, "an object")
		}
		switch typ {
		case "function":
			if tool.Function == nil {
				return missingParam(where + ".function")
			}
			if tool.Function.Name == nil || *tool.Function.Name == "" {
				return missingParam(where + ".function.name")
			}
			if k := jsonKind(tool.Function.Parameters); k != 0 && k != '{' {
				return invalidType(where+".function.parameters", "an object")
			}
		case "custom":
			if jsonKind(tool.Custom) != '{' {
				return missingParam(where + ".custom")
			}
		default:
			return invalidValue(where+".type", typ, "function", "custom")
		}
		return nil
	})
}

func (req *ChatRequest) parseMessages() *protoError {
	raw, ok := present(req.Fields, "messages")
	if !ok {
		return missingParam("messages")
	}
	var items []json.RawMessage
	if jsonKind(raw) != '[' || json.Unmarshal(raw, &items) != nil {
		return invalidType("messages", "an array")
	}
	if len(items) == 0 {
		return badRequest("messages", "empty_array", "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.")
	}
	for i, item := range items {
		m, e := parseChatMessage(fmt.Sprintf("messages[%d]", i), item)
		if e != nil {
			return e
		}
		req.Messages = append(req.Messages, m)
	}
	return checkChatPairs(req.Messages)
}

func parseChatMessage(where string, raw json.RawMessage) (ChatMessage, *protoError) {
	var m struct {
		Role       *string         `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCalls  json.RawMessage `json:"tool_calls"`
		ToolCallID *string         `json:"tool_call_id"`
	}
	if jsonKind(raw) != '{' || json.Unmarshal(raw, &m) != nil {
		return ChatMessage{}, invalidType(where, "an object")
	}
	out := ChatMessage{Raw: raw}
	if m.Role == nil {
		return out, missingParam(where + ".role")
	}
	out.Role = *m.Role
	if !slices.Contains(chatRoles, out.Role) {
		return out, invalidValue(where+".role", out.Role, chatRoles...)
	}
	hasCalls := jsonKind(m.ToolCalls) != 0 && jsonKind(m.ToolCalls) != 'n'
	if hasCalls && out.Role != "assistant" {
		return out, badRequest(where+".tool_calls", "", "Invalid parameter: only messages with role 'assistant' can have 'tool_calls'.")
	}
	if k := jsonKind(m.Content); k == 0 || k == 'n' {
		if out.Role != "assistant" || !hasCalls {
			return out, missingParam(where + ".content")
		}
	} else {
		text, e := chatContent(where+".content", out.Role, m.Content)
		if e != nil {
			return out, e
		}
		out.Text = text
	}
	if out.Role == "tool" {
		if m.ToolCallID == nil {
			return out, missingParam(where + ".tool_call_id")
		}
		out.ToolCallID = *m.ToolCallID
	}
	if hasCalls {
		calls, e := chatToolCalls(where+".tool_calls", m.ToolCalls)
		if e != nil {
			return out, e
		}
		out.ToolCalls = calls
	}
	return out, nil
}

// chatContent checks a message's content: a string or parts of the
// types its role may send; it returns the text.
func chatContent(where, role string, raw json.RawMessage) (string, *protoError) {
	var s string
	if str(raw, &s) {
		return s, nil
	}
	var parts []json.RawMessage
	if jsonKind(raw) != '[' || json.Unmarshal(raw, &parts) != nil {
		return "", invalidType(where, "a string or an array of content parts")
	}
	allowed := []string{"text"}
	switch role {
	case "user":
		allowed = []string{"text", "image_url", "input_audio", "file"}
	case "assistant":
		allowed = []string{"text", "refusal"}
	}
	var texts []string
	for j, p := range parts {
		pw := fmt.Sprintf("%s[%d]", where, j)
		var part struct {
			Type *string `json:"type"`
			Text *string `json:"text"`
		}
		if jsonKind(p) != '{' || json.Unmarshal(p, &part) != nil {
			return "", invalidType(pw, "an object")
		}
		if part.Type == nil {
			return "", missingParam(pw + ".type")
		}
		if !slices.Contains(allowed, *part.Type) {
			return "", invalidValue(pw+".type", *part.Type, allowed...)
		}
		if *part.Type == "text" {
			if part.Text == nil {
				return "", missingParam(pw + ".text")
			}
			texts = append(texts, *part.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

func chatToolCalls(where string, raw json.RawMessage) ([]ChatToolCall, *protoError) {
	var items []struct {
		ID       *string `json:"id"`
		Type     *string `json:"type"`
		Function *struct {
			Name      *string `json:"name"`
			Arguments *string `json:"arguments"`
		} `json:"function"`
	}
	if jsonKind(raw) != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, invalidType(where, "an array of tool calls")
	}
	var calls []ChatToolCall
	for i, c := range items {
		cw := fmt.Sprintf("%s[%d]", where, i)
		switch {
		case c.ID == nil:
			return nil, missingParam(cw + ".id")
		case c.Type == nil:
			return nil, missingParam(cw + ".type")
		case *c.Type != "function":
			return nil, invalidValue(cw+".type", *c.Type, "function")
		case c.Function == nil:
			return nil, missingParam(cw + ".function")
		case c.Function.Name == nil:
			return nil, missingParam(cw + ".function.name")
		case c.Function.Arguments == nil:
			return nil, missingParam(cw + ".function.arguments")
		}
		calls = append(calls, ChatToolCall{ID: *c.ID, Name: *c.Function.Name, Arguments: *c.Function.Arguments})
	}
	return calls, nil
}

// checkChatPairs enforces what the API enforces about tool calls: tool
// messages follow an assistant message with tool_calls (or one of its
// other tool messages) and answer one of its ids, and every id of an
// assistant message's tool_calls is answered before the next message.
func checkChatPairs(ms []ChatMessage) *protoError {
	var open map[string]bool // the ids of the last tool_calls, unanswered
	openAt := -1
	unanswered := func() *protoError {
		var ids []string
		for id, waiting := range open {
			if waiting {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return nil
		}
		slices.Sort(ids)
		return badRequest(fmt.Sprintf("messages.[%d].role", openAt), "",
			"An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: %s", strings.Join(ids, ", "))
	}
	for i, m := range ms {
		if m.Role == "tool" {
			if open == nil {
				return badRequest(fmt.Sprintf("messages.[%d].role", i), "",
					"Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.")
			}
			if _, ok := open[m.ToolCallID]; !ok {
				return badRequest(fmt.Sprintf("messages.[%d].tool_call_id", i), "",
					"Invalid parameter: 'tool_call_id' of '%s' not found in 'tool_calls' of previous message.", m.ToolCallID)
			}
			open[m.ToolCallID] = false
			continue
		}
		if e := unanswered(); e != nil {
			return e
		}
		open, openAt = nil, -1
		if len(m.ToolCalls) > 0 {
			open, openAt = map[string]bool{}, i
			for _, c := range m.ToolCalls {
				open[c.ID] = true
			}
		}
	}
	return unanswered()
}

func (req *ChatRequest) assistantTurns() int {
	n := 0
	for _, m := range req.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

// lastUserText joins the text of the messages after the last assistant
// message that are user or tool messages.
func (req *ChatRequest) lastUserText() string {
	var run []string
	for _, m := range req.Messages {
		switch m.Role {
		case "assistant":
			run = nil
		case "user", "tool":
			run = append(run, m.Text)
		}
	}
	return strings.Join(run, "\n")
}

func chatUsage(t *Turn, limit int) map[string]any {
	out, reasoning := t.outputTokens(limit)
	in := t.promptTokens()
	return map[string]any{
		"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out,
		"prompt_tokens_details": map[string]int{"cached_tokens": t.Usage.CacheReadInputTokens, "audio_tokens": 0},
		"completion_tokens_details": map[string]int{"reasoning_tokens": reasoning, "audio_tokens": 0,
			"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
	}
}

func (t *Turn) chatFinish() string {
	switch {
	case t.truncated():
		return "length"
	case len(t.toolCalls()) > 0:
		return "tool_calls"
	}
	return "stop"
}

// chatAnswer is a turn's text (its text blocks joined) and tool calls.
func (s *Server) chatAnswer(t Turn) (text *string, calls []map[string]any) {
	var texts []string
	for _, b := range t.Blocks {
		if b.Type != "tool_use" {
			texts = append(texts, b.Text)
			continue
		}
		id := b.ID
		if id == "" {
			id = s.newID("call")
		}
		calls = append(calls, map[string]any{"id": id, "type": "function",
			"function": map[string]string{"name": b.Name, "arguments": compactInput(b)}})
	}
	if texts != nil {
		joined := strings.Join(texts, "\n\n")
		text = &joined
	}
	return text, calls
}

func (chatProtocol) play(s *Server, w http.ResponseWriter, rec *Request, turn Turn) {
	req := rec.Chat
	model := turn.Model
	if model == "" {
		model = req.Model
	}
	w.Header().Set("x-request-id", s.newID("req"))
	id, created := "chatcmpl-"+s.newID("c"), time.Now().Unix()
	text, calls := s.chatAnswer(turn)
	usage := chatUsage(&turn, req.MaxTokens)
	if !req.Stream {
		msg := map[string]any{"role": "assistant", "content": text, "refusal": nil, "annotations": []any{}}
		if calls != nil {
			msg["tool_calls"] = calls
		}
		writeJSON(w, turn, map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": model,
			"choices": []map[string]any{{"index": 0, "message": msg, "logprobs": nil, "finish_reason": turn.chatFinish()}},
			"usage":   usage, "service_tier": "default", "system_fingerprint": nil,
		})
		return
	}
	chunk := func(delta map[string]any, finish any) map[string]any {
		c := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
			"service_tier": "default", "system_fingerprint": nil,
			"choices": []map[string]any{{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}}
		if req.IncludeUsage {
			c["usage"] = nil
		}
		return c
	}
	chunks := []map[string]any{chunk(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil)}
	breakAt := len(chunks)
	if text != nil {
		for j, p := range split(*text, 3) {
			chunks = append(chunks, chunk(map[string]any{"content": p}, nil))
			if j == 0 {
				breakAt = len(chunks)
			}
		}
	}
	for i, c := range calls {
		fn := c["function"].(map[string]string)
		chunks = append(chunks, chunk(map[string]any{"tool_calls": []map[string]any{{"index": i, "id": c["id"], "type": "function",
			"function": map[string]string{"name": fn["name"], "arguments": ""}}}}, nil))
		for j, p := range split(fn["arguments"], 3) {
			chunks = append(chunks, chunk(map[string]any{"tool_calls": []map[string]any{{"index": i,
				"function": map[string]string{"arguments": p}}}}, nil))
			if text == nil && i == 0 && j == 0 {
				breakAt = len(chunks)
			}
		}
	}
	chunks = append(chunks, chunk(map[string]any{}, turn.chatFinish()))
	if req.IncludeUsage {
		last := chunk(nil, nil)
		last["choices"], last["usage"] = []any{}, usage
		chunks = append(chunks, last)
	}
	out := newSSE(w, turn)
	out.breakAt = breakAt
	bad := []byte("data: {\"id\":\"" + id + "\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\n\n")
	errData, _ := marshal(openAIErrorBody(&protoError{Type: "server_error", Message: "The server had an error while processing your request."}))
	errEvent := fmt.Appendf(nil, "data: %s\n\n", errData)
	for _, c := range chunks {
		data, _ := marshal(c)
		if !out.send(fmt.Appendf(nil, "data: %s\n\n", data), bad, errEvent) {
			return
		}
	}
	out.send([]byte("data: [DONE]\n\n"), bad, errEvent)
}
