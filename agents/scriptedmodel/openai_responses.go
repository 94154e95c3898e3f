package scriptedmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// OpenAI's Responses API (POST /v1/responses), as Codex speaks it.

// ResponsesRequest is a validated Responses API request body.
type ResponsesRequest struct {
	Model           string
	MaxOutputTokens int // 0: none sent
	Stream          bool
	Instructions    string
	Input           []ResponsesItem // a string input is one user message
	Tools           []json.RawMessage
	// Fields holds every top-level field as sent.
	Fields map[string]json.RawMessage
}

// ResponsesItem is one input item with the fields tests look at; Raw is
// the item as sent.
type ResponsesItem struct {
	Type      string // message, function_call, function_call_output, reasoning ...
	Role      string // message
	Text      string // message: its text parts joined; function_call_output: its output text
	CallID    string // function_call, function_call_output (and custom tool calls)
	Name      string // function_call
	Arguments string // function_call
	Raw       json.RawMessage
}

// responsesFields are the request body's fields in the API reference.
var responsesFields = []string{
	"background", "conversation", "include", "input", "instructions", "max_output_tokens",
	"max_tool_calls", "metadata", "client_metadata", "model", "parallel_tool_calls", "previous_response_id",
	"prompt", "prompt_cache_key", "prompt_cache_retention", "reasoning", "safety_identifier",
	"service_tier", "store", "stream", "stream_options", "temperature", "text", "tool_choice",
	"tools", "top_logprobs", "top_p", "truncation", "user",
}

// responsesItemTypes are the input item types the API takes; the pairs
// map a call type to its output type.
var (
	responsesItemTypes = []string{
		"message", "function_call", "function_call_output", "reasoning", "custom_tool_call",
		"custom_tool_call_output", "local_shell_call", "local_shell_call_output", "web_search_call",
		"file_search_call", "computer_call", "computer_call_output", "image_generation_call",
		"code_interpreter_call", "mcp_call", "mcp_list_tools", "mcp_approval_request",
		"mcp_approval_response", "item_reference", "compaction", "tool_search_call", "tool_search_output",
	}
	responsesCallOutputs = map[string]string{
		"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output",
		"local_shell_call": "local_shell_call_output", "computer_call": "computer_call_output",
		"tool_search_call": "tool_search_output",
	}
	responsesToolTypes = []string{
		"function", "custom", "file_search", "web_search", "web_search_2025_08_26",
		"web_search_preview", "web_search_preview_2025_03_11", "computer_use_preview", "mcp",
		"code_interpreter", "image_generation", "local_shell", "shell", "apply_patch", "tool_search",
	}
)

type responsesProtocol struct{ openAIAuth }

func (responsesProtocol) parse(_ *http.Request, body []byte, rec *Request) *protoError {
	req, e := parseResponses(body)
	if e != nil {
		return e
	}
	rec.Responses = req
	return nil
}

// parseResponses validates body as the Responses API does.
func parseResponses(body []byte) (*ResponsesRequest, *protoError) {
	fields, ok := objectFields(body)
	if !ok {
		return nil, badRequest("", "", "We could not parse the JSON body of your request. The API expects a JSON object.")
	}
	if k := unknownField(fields, responsesFields); k != "" {
		return nil, badRequest(k, "unknown_parameter", "Unknown parameter: '%s'.", k)
	}
	req := &ResponsesRequest{Fields: fields}
	var e *protoError
	req.Model, req.MaxOutputTokens, req.Stream, e = openAIFields(fields, "max_output_tokens", 16)
	if e != nil {
		return nil, e
	}
	if raw, ok := present(fields, "instructions"); ok && !str(raw, &req.Instructions) {
		return nil, invalidType("instructions", "a string")
	}
	if raw, ok := present(fields, "previous_response_id"); ok {
		var id string
		str(raw, &id)
		// The scripted model keeps no responses: every id is unknown.
		return nil, badRequest("previous_response_id", "previous_response_not_found", "Previous response with id '%s' not found.", id)
	}
	if _, ok := present(fields, "stream_options"); ok && !req.Stream {
		return nil, badRequest("stream_options", "", "Invalid 'stream_options': only allowed when 'stream' is true.")
	}
	for _, k := range []string{"store", "parallel_tool_calls", "background"} {
		var b bool
		if raw, ok := present(fields, k); ok && !boolean(raw, &b) {
			return nil, invalidType(k, "a boolean")
		}
	}
	if raw, ok := present(fields, "include"); ok {
		var inc []string
		if jsonKind(raw) != '[' || json.Unmarshal(raw, &inc) != nil {
			return nil, invalidType("include", "an array of strings")
		}
	}
	if e := req.parseTools(); e != nil {
		return nil, e
	}
	if e := req.parseInput(); e != nil {
		return nil, e
	}
	return req, nil
}

func (req *ResponsesRequest) parseTools() *protoError {
	return parseToolList(req.Fields, &req.Tools, func(where, typ string, t json.RawMessage) *protoError {
		if !slices.Contains(responsesToolTypes, typ) {
			return invalidValue(where+".type", typ, responsesToolTypes...)
		}
		if typ != "function" && typ != "custom" {
			return nil
		}
		var tool struct {
			Name       *string         `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		}
		if json.Unmarshal(t, &tool) != nil {
			return invalidType(where, "an object")
		}
		if tool.Name == nil || *tool.Name == "" {
			return missingParam(where + ".name")
		}
		if k := jsonKind(tool.Parameters); k != 0 && k != '{' && k != 'n' {
			return invalidType(where+".parameters", "an object")
		}
		return nil
	})
}

func (req *ResponsesRequest) parseInput() *protoError {
	raw, ok := present(req.Fields, "input")
	if !ok {
		return nil
	}
	var s string
	if str(raw, &s) {
		req.Input = []ResponsesItem{{Type: "message", Role: "user", Text: s, Raw: raw}}
		return nil
	}
	var items []json.RawMessage
	if jsonKind(raw) != '[' || json.Unmarshal(raw, &items) != nil {
		return invalidType("input", "a string or an array of input items")
	}
	for i, item := range items {
		it, e := parseResponsesItem(fmt.Sprintf("input[%d]", i), item)
		if e != nil {
			return e
		}
		req.Input = append(req.Input, it)
	}
	return checkResponsesPairs(req.Input)
}

func parseResponsesItem(where string, raw json.RawMessage) (ResponsesItem, *protoError) {
	var it struct {
		Type      *string         `json:"type"`
		Role      *string         `json:"role"`
		Content   json.RawMessage `json:"content"`
		CallID    *string         `json:"call_id"`
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"` // a string; an object in tool_search_call
		Input     *string         `json:"input"`
		Output    json.RawMessage `json:"output"`
		Summary   json.RawMessage `json:"summary"`
		Tools     json.RawMessage `json:"tools"`     // tool_search_output
		Execution *string         `json:"execution"` // tool_search_call, tool_search_output
	}
	if jsonKind(raw) != '{' || json.Unmarshal(raw, &it) != nil {
		return ResponsesItem{}, invalidType(where, "an object")
	}
	out := ResponsesItem{Raw: raw}
	switch {
	case it.Type != nil:
		out.Type = *it.Type
	case it.Role != nil:
		out.Type = "message" // an easy input message
	default:
		return out, missingParam(where + ".type")
	}
	if !slices.Contains(responsesItemTypes, out.Type) {
		return out, invalidValue(where+".type", out.Type, responsesItemTypes...)
	}
	need := func(field string, v *string) *protoError {
		if v == nil {
			return missingParam(where + "." + field)
		}
		return nil
	}
	switch out.Type {
	case "message":
		if e := need("role", it.Role); e != nil {
			return out, e
		}
		out.Role = *it.Role
		if !slices.Contains([]string{"user", "assistant", "system", "developer"}, out.Role) {
			return out, invalidValue(where+".role", out.Role, "user", "assistant", "system", "developer")
		}
		text, e := responsesContent(where+".content", out.Role, it.Content)
		if e != nil {
			return out, e
		}
		out.Text = text
	case "function_call", "custom_tool_call":
		if e := need("call_id", it.CallID); e != nil {
			return out, e
		}
		if e := need("name", it.Name); e != nil {
			return out, e
		}
		var args string
		switch {
		case out.Type == "custom_tool_call" && it.Input == nil:
			return out, missingParam(where + ".input")
		case out.Type == "custom_tool_call":
			args = *it.Input
		case it.Arguments == nil:
			return out, missingParam(where + ".arguments")
		case !str(it.Arguments, &args):
			return out, invalidType(where+".arguments", "a string")
		}
		out.CallID, out.Name, out.Arguments = *it.CallID, *it.Name, args
	case "tool_search_call", "tool_search_output":
		// A search of the tools the request defers (a tool of type
		// tool_search), run by the client when execution is "client".
		if e := need("call_id", it.CallID); e != nil {
			return out, e
		}
		if e := need("execution", it.Execution); e != nil {
			return out, e
		}
		if *it.Execution != "client" && *it.Execution != "server" {
			return out, invalidValue(where+".execution", *it.Execution, "client", "server")
		}
		out.CallID = *it.CallID
		if out.Type == "tool_search_call" && jsonKind(it.Arguments) != '{' {
			return out, invalidType(where+".arguments", "an object")
		}
		if out.Type == "tool_search_output" && jsonKind(it.Tools) != '[' {
			return out, invalidType(where+".tools", "an array of tools")
		}
	case "function_call_output", "custom_tool_call_output", "local_shell_call_output", "computer_call_output":
		if it.CallID == nil && out.Type != "local_shell_call_output" {
			return out, missingParam(where + ".call_id")
		}
		if it.CallID != nil {
			out.CallID = *it.CallID
		}
		if it.Output == nil {
			return out, missingParam(where + ".output")
		}
		var s string
		switch k := jsonKind(it.Output); {
		case k == '"':
			str(it.Output, &s)
		case k == '[' && out.Type != "local_shell_call_output":
			s = partsText(it.Output)
		case k == '{' && out.Type == "computer_call_output":
		default:
			return out, invalidType(where+".output", "a string or an array of content parts")
		}
		out.Text = s
	case "local_shell_call", "computer_call":
		if it.CallID != nil {
			out.CallID = *it.CallID
		}
	case "reasoning":
		if jsonKind(it.Summary) != '[' {
			return out, missingParam(where + ".summary")
		}
	}
	return out, nil
}

// responsesContent checks a message's content: a string, or parts of
// the types its role may send; it returns the text.
func responsesContent(where, role string, raw json.RawMessage) (string, *protoError) {
	if raw == nil {
		return "", missingParam(where)
	}
	var s string
	if str(raw, &s) {
		return s, nil
	}
	var parts []json.RawMessage
	if jsonKind(raw) != '[' || json.Unmarshal(raw, &parts) != nil {
		return "", invalidType(where, "a string or an array of content parts")
	}
	allowed := []string{"input_text", "input_image", "input_file", "input_audio"}
	if role == "assistant" {
		allowed = []string{"output_text", "refusal"}
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
		if *part.Type == "input_text" || *part.Type == "output_text" {
			if part.Text == nil {
				return "", missingParam(pw + ".text")
			}
			texts = append(texts, *part.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// partsText joins the text of content parts (a function output's list).
func partsText(raw json.RawMessage) string {
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var texts []string
	for _, p := range parts {
		if p.Text != "" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// toolSearch reports whether name is the request's tool of type
// tool_search (which has no name of its own: "tool_search" calls it),
// and how it is executed.
func (req *ResponsesRequest) toolSearch(name string) (execution string, ok bool) {
	if name != "tool_search" {
		return "", false
	}
	for _, raw := range req.Tools {
		var tool struct {
			Type      string `json:"type"`
			Execution string `json:"execution"`
		}
		if json.Unmarshal(raw, &tool) == nil && tool.Type == "tool_search" {
			if tool.Execution == "" {
				tool.Execution = "server"
			}
			return tool.Execution, true
		}
	}
	return "", false
}

// namespaced splits name, "NS__TOOL", into a namespace the request
// offers (a tool of type namespace, in its tools or in an earlier tool
// search's output) and a tool of that namespace: ok is false when no
// namespace has it.
func (req *ResponsesRequest) namespaced(name string) (ns, tool string, ok bool) {
	type namespace struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	var offered []json.RawMessage
	offered = append(offered, req.Tools...)
	for _, it := range req.Input {
		if it.Type != "tool_search_output" {
			continue
		}
		var out struct {
			Tools []json.RawMessage `json:"tools"`
		}
		if json.Unmarshal(it.Raw, &out) == nil {
			offered = append(offered, out.Tools...)
		}
	}
	for _, raw := range offered {
		var n namespace
		if json.Unmarshal(raw, &n) != nil || n.Type != "namespace" || !strings.HasPrefix(name, n.Name+"__") {
			continue
		}
		for _, t := range n.Tools {
			if n.Name+"__"+t.Name == name {
				return n.Name, t.Name, true
			}
		}
	}
	return "", "", false
}

// checkResponsesPairs enforces what the API enforces about tool calls:
// every call output answers an earlier call of its kind by call_id, and
// every call has its output in the input.
func checkResponsesPairs(items []ResponsesItem) *protoError {
	calls := map[string]string{} // call_id -> output type wanted
	answered := map[string]bool{}
	for _, it := range items {
		if outType, ok := responsesCallOutputs[it.Type]; ok && it.CallID != "" {
			calls[it.CallID] = outType
			continue
		}
		if !strings.HasSuffix(it.Type, "_output") || it.CallID == "" {
			continue
		}
		if calls[it.CallID] != it.Type {
			return badRequest("input", "", "No tool call found for %s with call_id %s.", strings.ReplaceAll(it.Type, "_", " "), it.CallID)
		}
		answered[it.CallID] = true
	}
	for _, it := range items {
		if _, ok := responsesCallOutputs[it.Type]; ok && it.CallID != "" && !answered[it.CallID] && it.Type != "local_shell_call" && it.Type != "computer_call" {
			return badRequest("input", "", "No tool output found for %s %s.", strings.ReplaceAll(it.Type, "_", " "), it.CallID)
		}
	}
	return nil
}

// modelSide reports whether an item is the model's (a past answer's).
func (it ResponsesItem) modelSide() bool {
	if it.Type == "message" {
		return it.Role == "assistant"
	}
	_, call := responsesCallOutputs[it.Type]
	return call || it.Type == "reasoning" || it.Type == "web_search_call"
}

// assistantTurns counts the answers in the input: runs of model items.
func (req *ResponsesRequest) assistantTurns() int {
	n, in := 0, false
	for _, it := range req.Input {
		if it.modelSide() && !in {
			n++
		}
		in = it.modelSide()
	}
	return n
}

// lastUserText joins the text of the last run of user-side items (user
// messages and call outputs).
func (req *ResponsesRequest) lastUserText() string {
	var run []string
	in := false
	for _, it := range req.Input {
		user := it.Type == "message" && it.Role == "user" || strings.HasSuffix(it.Type, "_output")
		if !user {
			in = false
			continue
		}
		if !in {
			run = nil
		}
		in = true
		run = append(run, it.Text)
	}
	return strings.Join(run, "\n")
}

// responsesUsage is the Responses API's usage object.
func responsesUsage(t *Turn, limit int) map[string]any {
	out, reasoning := t.outputTokens(limit)
	in := t.promptTokens()
	return map[string]any{
		"input_tokens":          in,
		"input_tokens_details":  map[string]int{"cached_tokens": t.Usage.CacheReadInputTokens},
		"output_tokens":         out,
		"output_tokens_details": map[string]int{"reasoning_tokens": reasoning},
		"total_tokens":          in + out,
	}
}

// responsesOutput is a turn's output items: a message per text block and
// a function_call per tool_use, in block order, each with its id.
func (s *Server) responsesOutput(t Turn, req *ResponsesRequest) []map[string]any {
	var items []map[string]any
	for _, b := range t.Blocks {
		if b.Type == "tool_use" {
			callID := b.ID
			if callID == "" {
				callID = s.newID("call")
			}
			if exec, ok := req.toolSearch(b.Name); ok {
				// A call of the request's tool_search tool is its own
				// item, its arguments an object.
				items = append(items, map[string]any{
					"id": s.newID("tsc"), "type": "tool_search_call", "status": "completed",
					"execution": exec, "call_id": callID, "arguments": json.RawMessage(compactInput(b))})
				continue
			}
			item := map[string]any{
				"id": s.newID("fc"), "type": "function_call", "status": "completed",
				"arguments": compactInput(b), "call_id": callID, "name": b.Name}
			if ns, name, ok := req.namespaced(b.Name); ok {
				// A tool of a namespace is called by its own name in it.
				item["namespace"], item["name"] = ns, name
			}
			items = append(items, item)
			continue
		}
		items = append(items, map[string]any{
			"id": s.newID("msg"), "type": "message", "status": "completed", "role": "assistant",
			"content": []map[string]any{{"type": "output_text", "text": b.Text, "annotations": []any{}, "logprobs": []any{}}}})
	}
	if items == nil {
		items = []map[string]any{}
	}
	return items
}

func (responsesProtocol) play(s *Server, w http.ResponseWriter, rec *Request, turn Turn) {
	req := rec.Responses
	model := turn.Model
	if model == "" {
		model = req.Model
	}
	w.Header().Set("x-request-id", s.newID("req"))
	status, incomplete := "completed", any(nil)
	if turn.truncated() {
		status, incomplete = "incomplete", map[string]string{"reason": "max_output_tokens"}
	}
	resp := map[string]any{
		"id": s.newID("resp"), "object": "response", "created_at": time.Now().Unix(),
		"status": status, "error": nil, "incomplete_details": incomplete,
		"instructions": nullable(req.Instructions), "max_output_tokens": nullableInt(req.MaxOutputTokens),
		"model": model, "output": s.responsesOutput(turn, req), "parallel_tool_calls": true,
		"previous_response_id": nil, "tool_choice": "auto", "tools": orEmpty(req.Tools),
		"usage": responsesUsage(&turn, req.MaxOutputTokens), "metadata": map[string]any{},
	}
	if !req.Stream {
		writeJSON(w, turn, resp)
		return
	}
	streamResponses(w, turn, resp)
}

func nullableInt(n int) any {
	if n == 0 {
		return nil
	}
	return n
}

func orEmpty(raw []json.RawMessage) []json.RawMessage {
	if raw == nil {
		return []json.RawMessage{}
	}
	return raw
}

// streamResponses plays resp as the Responses API streams it: created,
// in_progress, each output item added, its deltas and done, then
// completed (or incomplete) with the usage.
func streamResponses(w http.ResponseWriter, turn Turn, resp map[string]any) {
	type ev struct {
		name string
		data map[string]any
	}
	start := map[string]any{}
	for k, v := range resp {
		start[k] = v
	}
	start["status"], start["output"], start["usage"], start["incomplete_details"] = "in_progress", []any{}, nil, nil
	evs := []ev{{"response.created", map[string]any{"response": start}}, {"response.in_progress", map[string]any{"response": start}}}
	breakAt := len(evs)
	for i, item := range resp["output"].([]map[string]any) {
		id := item["id"]
		open := map[string]any{}
		for k, v := range item {
			open[k] = v
		}
		open["status"] = "in_progress"
		switch item["type"] {
		case "tool_search_call":
			// Whole when added: its arguments are an object, not
			// streamed in deltas.
			evs = append(evs, ev{"response.output_item.added", map[string]any{"output_index": i, "item": open}})
		case "function_call":
			open["arguments"] = ""
			evs = append(evs, ev{"response.output_item.added", map[string]any{"output_index": i, "item": open}})
			for j, p := range split(item["arguments"].(string), 3) {
				evs = append(evs, ev{"response.function_call_arguments.delta", map[string]any{"item_id": id, "output_index": i, "delta": p}})
				if i == 0 && j == 0 {
					breakAt = len(evs)
				}
			}
			evs = append(evs, ev{"response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": i, "arguments": item["arguments"]}})
		default:
			part := item["content"].([]map[string]any)[0]
			text := part["text"].(string)
			open["content"] = []any{}
			empty := map[string]any{"type": "output_text", "text": "", "annotations": []any{}, "logprobs": []any{}}
			evs = append(evs, ev{"response.output_item.added", map[string]any{"output_index": i, "item": open}},
				ev{"response.content_part.added", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "part": empty}})
			for j, p := range split(text, 3) {
				evs = append(evs, ev{"response.output_text.delta", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "delta": p, "logprobs": []any{}}})
				if i == 0 && j == 0 {
					breakAt = len(evs)
				}
			}
			evs = append(evs, ev{"response.output_text.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []any{}}},
				ev{"response.content_part.done", map[string]any{"item_id": id, "output_index": i, "content_index": 0, "part": part}})
		}
		evs = append(evs, ev{"response.output_item.done", map[string]any{"output_index": i, "item": item}})
	}
	end := "response.completed"
	if resp["status"] == "incomplete" {
		end = "response.incomplete"
	}
	evs = append(evs, ev{end, map[string]any{"response": resp}})

	out := newSSE(w, turn)
	out.breakAt = breakAt
	for i, e := range evs {
		e.data["type"], e.data["sequence_number"] = e.name, i
		data, _ := marshal(e.data)
		whole := fmt.Appendf(nil, "event: %s\ndata: %s\n\n", e.name, data)
		bad := fmt.Appendf(nil, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\n\n")
		errData, _ := marshal(map[string]any{"type": "error", "code": "server_error", "param": nil,
			"message": "The server had an error while processing your request.", "sequence_number": i})
		if !out.send(whole, bad, fmt.Appendf(nil, "event: error\ndata: %s\n\n", errData)) {
			return
		}
	}
}
