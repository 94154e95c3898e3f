package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// OpenAI's two APIs, which Codex (Responses) and OpenCode (either) speak.
// Both report input tokens with the cached ones included
// (input_tokens_details.cached_tokens, prompt_tokens_details.cached_tokens)
// and output tokens with the reasoning ones included
// (output_tokens_details.reasoning_tokens,
// completion_tokens_details.reasoning_tokens): the meter bills the cached
// part at the cached price and reasoning as output.

// openaiUsage is usage as either API writes it.
type openaiUsage struct {
	InputTokens  *int64 `json:"input_tokens"`  // Responses
	OutputTokens *int64 `json:"output_tokens"` // Responses
	InputDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	PromptTokens     *int64 `json:"prompt_tokens"`     // Chat Completions
	CompletionTokens *int64 `json:"completion_tokens"` // Chat Completions
	PromptDetails    *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

func (u *openaiUsage) usage() Usage {
	var in, cached, out, reasoning int64
	switch {
	case u.InputTokens != nil || u.OutputTokens != nil:
		in, out = deref(u.InputTokens), deref(u.OutputTokens)
		if u.InputDetails != nil {
			cached = u.InputDetails.CachedTokens
		}
		if u.OutputDetails != nil {
			reasoning = u.OutputDetails.ReasoningTokens
		}
	default:
		in, out = deref(u.PromptTokens), deref(u.CompletionTokens)
		if u.PromptDetails != nil {
			cached = u.PromptDetails.CachedTokens
		}
		if u.CompletionDetails != nil {
			reasoning = u.CompletionDetails.ReasoningTokens
		}
	}
	return usageOf(in, cached, out, reasoning)
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// openaiError is OpenAI's error object: {"error":{"message","type","param","code"}}.
type openaiError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    any    `json:"code"` // a string, or null
}

func (e *openaiError) kind() string {
	if s, ok := e.Code.(string); ok && s != "" {
		return s
	}
	if e.Type != "" {
		return e.Type
	}
	return "error"
}

// writeOpenAIError answers in OpenAI's error shape. A refusal for the
// budget is a 400 (not retried by the OpenAI SDKs or Codex, as 429 and
// 5xx are); the gateway's own overload (a drain) is a 503, which they
// retry.
func writeOpenAIError(w http.ResponseWriter, status int, typ, msg string) {
	var code any
	switch typ {
	case "authentication_error":
		typ, code = "invalid_request_error", "invalid_api_key"
	case "not_found_error":
		typ, code = "invalid_request_error", "unknown_url"
	case "request_too_large":
		typ, code = "invalid_request_error", "request_too_large"
	case "overloaded_error", "api_error":
		typ = "server_error"
	}
	if status == 529 {
		status = http.StatusServiceUnavailable
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// responsesProto is OpenAI's Responses API (POST /v1/responses):
// max_output_tokens (reasoning included) is the output cap, the wrap-up
// is a developer message appended to input, usage comes whole in the
// response object (streamed: in response.completed, .incomplete or
// .failed).
type responsesProto struct{}

func (responsesProto) provider() string { return ProviderOpenAI }

func (responsesProto) model(_ *http.Request, body []byte) (string, bool) { return peekModel(body) }

func (responsesProto) prepare(body []byte) ([]byte, error) { return body, nil }

func (responsesProto) maxOutput(body []byte) (int64, bool) {
	return peekPositive(body, "max_output_tokens")
}

func (responsesProto) capOutput(body []byte, limit int64) ([]byte, int64, error) {
	if out, n, ok := fastCap(body, "max_output_tokens", limit, "previous_response_id", "conversation", "prompt"); ok {
		return out, n, nil
	}
	req, err := decodeObject(body)
	if err != nil {
		return nil, 0, err
	}
	// Input the provider keeps (an earlier response, a conversation, a
	// stored prompt) is not in the body, so the body cannot bound it.
	for _, key := range []string{"previous_response_id", "conversation", "prompt"} {
		if raw, ok := req[key]; ok && string(raw) != "null" {
			return nil, 0, errBadRequestf("%s: under a dollar limit the model gateway bounds a call's input from its body, and this one's is stored by the provider: send the conversation in input (store: false), as Codex does", key)
		}
	}
	n, _, err := setOutputCap(req, "max_output_tokens", "max_output_tokens", limit, true)
	if err != nil {
		return nil, 0, err
	}
	out, err := marshal(req)
	if err != nil {
		return nil, 0, errBadRequestf("request body: %v", err)
	}
	return out, n, nil
}

// wrapUp appends a developer message to input (a string input becomes
// the user message it stands for, first): at the end, so the prompt
// cache's prefix stays whole. A request without input gets it at the end
// of instructions.
func (responsesProto) wrapUp(body []byte, text string) ([]byte, error) {
	req, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	item := map[string]string{"type": "message", "role": "developer", "content": text}
	var s string
	var items []json.RawMessage
	raw, has := req["input"]
	switch {
	case !has || string(raw) == "null":
		var ins string
		if r, ok := req["instructions"]; ok && string(r) != "null" && json.Unmarshal(r, &ins) != nil {
			return nil, errBadRequestf("instructions: must be a string")
		}
		if ins != "" {
			ins += "\n\n"
		}
		if req["instructions"], err = marshal(ins + text); err != nil {
			return nil, err
		}
		return marshal(req)
	case json.Unmarshal(raw, &s) == nil:
		user, _ := marshal(map[string]string{"role": "user", "content": s})
		items = []json.RawMessage{user}
	case json.Unmarshal(raw, &items) != nil:
		return nil, errBadRequestf("input: must be a string or a list")
	}
	dev, err := marshal(item)
	if err != nil {
		return nil, err
	}
	if req["input"], err = marshal(append(items, dev)); err != nil {
		return nil, err
	}
	return marshal(req)
}

func (responsesProto) usageRequired() bool { return true }

func (responsesProto) writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeOpenAIError(w, status, typ, msg)
}

func (responsesProto) keepEvent(name string) bool {
	switch name {
	case "", "response.created", "response.completed", "response.incomplete", "response.failed", "error":
		return true
	}
	return strings.HasSuffix(name, ".delta")
}

// responseObject is the part of a Responses API response the meter reads.
type responseObject struct {
	Object string       `json:"object"`
	ID     string       `json:"id"`
	Model  string       `json:"model"`
	Status string       `json:"status"`
	Usage  *openaiUsage `json:"usage"`
	Error  *openaiError `json:"error"`
}

func (m *meter) readResponse(r *responseObject, done bool) {
	if r == nil {
		return
	}
	if r.ID != "" {
		m.id = r.ID
	}
	if r.Model != "" {
		m.model = r.Model
	}
	if r.Error != nil {
		m.errType, m.errMsg = r.Error.kind(), r.Error.Message
	}
	if r.Usage != nil {
		m.usage = r.Usage.usage()
		m.final = m.final || done
	}
	m.stopped = m.stopped || done
}

func (responsesProto) sseEvent(m *meter, name string, data []byte) {
	var ev struct {
		Type     string          `json:"type"`
		Response *responseObject `json:"response"`
		Delta    json.RawMessage `json:"delta"`
		Code     any             `json:"code"`
		Message  string          `json:"message"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		m.noteProblem("malformed %s event: %v", name, err)
		return
	}
	switch ev.Type {
	case "response.created":
		m.readResponse(ev.Response, false)
	case "response.completed", "response.incomplete", "response.failed":
		m.readResponse(ev.Response, true)
	case "error":
		e := openaiError{Message: ev.Message, Code: ev.Code}
		m.errType, m.errMsg = e.kind(), e.Message
	default:
		if strings.HasSuffix(ev.Type, ".delta") {
			var s string
			if json.Unmarshal(ev.Delta, &s) == nil {
				m.delta(len(s))
			}
		}
	}
}

func (responsesProto) endJSON(m *meter, body []byte) {
	var r struct {
		responseObject
		Error *openaiError `json:"error"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		m.noteProblem("malformed JSON body: %v", err)
		return
	}
	if r.Error != nil {
		m.errType, m.errMsg = r.Error.kind(), r.Error.Message
	}
	if m.kind == kindJSON && r.Object == "response" {
		m.readResponse(&r.responseObject, true)
	}
}

// chatProto is OpenAI's Chat Completions API (POST /v1/chat/completions):
// max_completion_tokens (or the legacy max_tokens) is the output cap,
// the wrap-up is a system message appended to messages, usage comes in
// the response, or (streamed) in a last chunk sent only when the request
// asks with stream_options.include_usage, which prepare makes sure of.
type chatProto struct{}

func (chatProto) provider() string { return ProviderOpenAI }

func (chatProto) model(_ *http.Request, body []byte) (string, bool) { return peekModel(body) }

// prepare asks a streamed call for its usage (stream_options.include_usage):
// without it the stream has none, and the call could only be charged at
// its bound.
func (chatProto) prepare(body []byte) ([]byte, error) {
	if _, n := scanKey(body, "stream"); n == 0 {
		return body, nil
	}
	req, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	var stream bool
	if json.Unmarshal(req["stream"], &stream) != nil || !stream {
		return body, nil
	}
	opts := map[string]json.RawMessage{}
	if r, ok := req["stream_options"]; ok && string(r) != "null" {
		if json.Unmarshal(r, &opts) != nil || opts == nil {
			return nil, errBadRequestf("stream_options: must be an object")
		}
	}
	if string(opts["include_usage"]) == "true" {
		return body, nil
	}
	opts["include_usage"] = json.RawMessage("true")
	if req["stream_options"], err = marshal(opts); err != nil {
		return nil, err
	}
	return marshal(req)
}

func (chatProto) maxOutput(body []byte) (int64, bool) {
	a, okA := peekPositive(body, "max_completion_tokens")
	b, okB := peekPositive(body, "max_tokens")
	switch {
	case okA && okB:
		return min(a, b), true
	case okA:
		return a, true
	}
	return b, okB
}

// capOutput lowers max_completion_tokens and max_tokens, whichever are
// there (max_completion_tokens is set when neither is), and refuses a
// request for more than one choice.
func (chatProto) capOutput(body []byte, limit int64) ([]byte, int64, error) {
	req, err := decodeObject(body)
	if err != nil {
		return nil, 0, err
	}
	if err := oneChoice(req, "n", "n"); err != nil {
		return nil, 0, err
	}
	_, legacy := req["max_tokens"]
	a, okA, err := setOutputCap(req, "max_completion_tokens", "max_completion_tokens", limit, !legacy)
	if err != nil {
		return nil, 0, err
	}
	b, okB, err := setOutputCap(req, "max_tokens", "max_tokens", limit, false)
	if err != nil {
		return nil, 0, err
	}
	n := limit
	if okA {
		n = min(n, a)
	}
	if okB {
		n = min(n, b)
	}
	out, err := marshal(req)
	if err != nil {
		return nil, 0, errBadRequestf("request body: %v", err)
	}
	return out, n, nil
}

// wrapUp appends a system message to messages (OpenAI reads it as a
// developer message on the models that have those).
func (chatProto) wrapUp(body []byte, text string) ([]byte, error) {
	req, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	var msgs []json.RawMessage
	if json.Unmarshal(req["messages"], &msgs) != nil {
		return nil, errBadRequestf("messages: must be a list")
	}
	sys, err := marshal(map[string]string{"role": "system", "content": text})
	if err != nil {
		return nil, err
	}
	if req["messages"], err = marshal(append(msgs, sys)); err != nil {
		return nil, err
	}
	return marshal(req)
}

func (chatProto) usageRequired() bool { return true }

func (chatProto) writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeOpenAIError(w, status, typ, msg)
}

func (chatProto) keepEvent(string) bool { return true }

// chatChunk is the part of a chat completion (or a streamed chunk of
// one) the meter reads.
type chatChunk struct {
	Object  string `json:"object"`
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Delta *struct {
			Content          *string `json:"content"`
			Refusal          *string `json:"refusal"`
			ReasoningContent *string `json:"reasoning_content"`
			ToolCalls        []struct {
				Function *struct {
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *openaiUsage `json:"usage"`
	Error *openaiError `json:"error"`
}

func (chatProto) sseEvent(m *meter, name string, data []byte) {
	if bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
		m.stopped = true
		return
	}
	var c chatChunk
	if err := json.Unmarshal(data, &c); err != nil {
		m.noteProblem("malformed chunk: %v", err)
		return
	}
	if c.Error != nil {
		m.errType, m.errMsg = c.Error.kind(), c.Error.Message
		return
	}
	if m.id == "" {
		m.id = c.ID
	}
	if m.model == "" {
		m.model = c.Model
	}
	for _, ch := range c.Choices {
		if d := ch.Delta; d != nil {
			n := len(strOf(d.Content)) + len(strOf(d.Refusal)) + len(strOf(d.ReasoningContent))
			for _, tc := range d.ToolCalls {
				if tc.Function != nil {
					n += len(tc.Function.Arguments)
				}
			}
			m.delta(n)
		}
	}
	if c.Usage != nil {
		m.usage, m.final = c.Usage.usage(), true
	}
}

func strOf(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (chatProto) endJSON(m *meter, body []byte) {
	var c chatChunk
	if err := json.Unmarshal(body, &c); err != nil {
		m.noteProblem("malformed JSON body: %v", err)
		return
	}
	if c.Error != nil {
		m.errType, m.errMsg = c.Error.kind(), c.Error.Message
	}
	if m.kind == kindJSON && c.Object == "chat.completion" {
		m.id, m.model, m.stopped = c.ID, c.Model, true
		if c.Usage != nil {
			m.usage, m.final = c.Usage.usage(), true
		}
	}
}
