package scriptedmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Request is one request the server received, as recorded.
type Request struct {
	Method string
	Path   string
	Query  string // the raw query, e.g. "beta=true"
	Header http.Header
	Body   []byte // the raw body

	// Messages is the parsed body of a valid POST /v1/messages; nil for
	// other requests and for requests the server rejected.
	Messages *MessagesRequest
	// Responses, Chat and Gemini are the parsed body of a valid request
	// of the other protocols: POST /v1/responses, POST
	// /v1/chat/completions and POST /v1beta/models/M:generateContent (or
	// :streamGenerateContent).
	Responses *ResponsesRequest
	Chat      *ChatRequest
	Gemini    *GeminiRequest

	Status int    // the HTTP status the server answered
	Error  string // the error message it answered with, if any
}

// MessagesRequest is a validated Messages API request body.
type MessagesRequest struct {
	Model     string
	MaxTokens int
	Messages  []Message
	System    []ContentBlock // a string system prompt is one text block
	Stream    bool
	Tools     []json.RawMessage
	Metadata  json.RawMessage
	// Fields holds every top-level field as sent, the ones above included.
	Fields map[string]json.RawMessage
}

// Message is one entry of messages; string content is one text block.
type Message struct {
	Role    string
	Content []ContentBlock
}

// ContentBlock is one content block with the fields tests look at; Raw is
// the block as sent.
type ContentBlock struct {
	Type      string
	Text      string          // text
	ID        string          // tool_use
	Name      string          // tool_use
	Input     json.RawMessage // tool_use
	ToolUseID string          // tool_result
	Content   json.RawMessage // tool_result: a string or blocks
	Raw       json.RawMessage
}

// LastUserText joins the text of the last user message: its text blocks
// and the text of its tool results. It is "" for a request without a
// parsed body.
func (r *Request) LastUserText() string {
	switch {
	case r.Responses != nil:
		return r.Responses.lastUserText()
	case r.Chat != nil:
		return r.Chat.lastUserText()
	case r.Gemini != nil:
		return r.Gemini.lastUserText()
	case r.Messages == nil:
		return ""
	}
	ms := r.Messages.Messages
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Role == "user" {
			return ms[i].text()
		}
	}
	return ""
}

// offersTools reports whether a request offers the model any tool.
func (r *Request) offersTools() bool {
	switch {
	case r.Messages != nil:
		return len(r.Messages.Tools) > 0
	case r.Responses != nil:
		return len(r.Responses.Tools) > 0
	case r.Chat != nil:
		return len(r.Chat.Tools) > 0
	case r.Gemini != nil:
		return len(r.Gemini.Tools) > 0
	}
	return false
}

// assistantTurns counts how many answers a request's conversation has
// had, in whichever protocol it came.
func (r *Request) assistantTurns() int {
	switch {
	case r.Messages != nil:
		return r.Messages.assistantTurns()
	case r.Responses != nil:
		return r.Responses.assistantTurns()
	case r.Chat != nil:
		return r.Chat.assistantTurns()
	case r.Gemini != nil:
		return r.Gemini.assistantTurns()
	}
	return 0
}

// assistantTurns counts the assistant messages of a request: how many
// answers its conversation has had.
func (r *MessagesRequest) assistantTurns() int {
	n := 0
	for _, m := range r.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

func (m Message) text() string {
	var parts []string
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			parts = append(parts, b.Text)
		case "tool_result":
			parts = append(parts, toolResultText(b.Content))
		}
	}
	return strings.Join(parts, "\n")
}

func toolResultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &blocks)
	var parts []string
	for _, b := range blocks {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// invalid is a request the Messages API would refuse with 400
// invalid_request_error; its text is the error message.
type invalid string

func invalidf(format string, args ...any) invalid { return invalid(fmt.Sprintf(format, args...)) }

// parseMessages validates body as the Messages API does, as far as the
// clients under test depend on it. Unknown top-level fields are allowed:
// the CLI sends many.
func parseMessages(body []byte) (*MessagesRequest, invalid) {
	var fields map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&fields); err != nil || fields == nil {
		return nil, "request body: must be a JSON object"
	}
	if d.More() {
		return nil, "request body: unexpected data after the JSON object"
	}
	req := &MessagesRequest{Fields: fields}
	checks := []func(*MessagesRequest) invalid{
		checkModel, checkMaxTokens, checkMessages, checkSystem, checkStream,
		checkTools, checkMetadata, checkSampling, checkToolChoice, checkThinking,
	}
	for _, check := range checks {
		if msg := check(req); msg != "" {
			return nil, msg
		}
	}
	return req, ""
}

func checkModel(r *MessagesRequest) invalid {
	raw, ok := r.Fields["model"]
	if !ok {
		return "model: Field required"
	}
	if json.Unmarshal(raw, &r.Model) != nil || r.Model == "" {
		return "model: Input should be a non-empty string"
	}
	return ""
}

func checkMaxTokens(r *MessagesRequest) invalid {
	raw, ok := r.Fields["max_tokens"]
	if !ok {
		return "max_tokens: Field required"
	}
	n, ok := integer(raw)
	if !ok {
		return "max_tokens: Input should be a valid integer"
	}
	if n < 1 {
		return "max_tokens: Input should be greater than or equal to 1"
	}
	r.MaxTokens = n
	return ""
}

// integer reads raw as a JSON number with an integral value.
func integer(raw json.RawMessage) (int, bool) {
	var f float64
	if json.Unmarshal(raw, &f) != nil || f != float64(int(f)) {
		return 0, false
	}
	return int(f), true
}

func checkMessages(r *MessagesRequest) invalid {
	raw, ok := r.Fields["messages"]
	if !ok {
		return "messages: Field required"
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return "messages: Input should be a valid list"
	}
	if len(items) == 0 {
		return "messages: at least one message is required"
	}
	for i, item := range items {
		m, msg := parseMessage(i, item)
		if msg == "" && m.Role == "system" {
			msg = checkSystemMessage(r.Model, i, m, r.Messages)
		}
		if msg != "" {
			return msg
		}
		r.Messages = append(r.Messages, m)
	}
	return checkToolPairs(r.Messages)
}

// checkSystemMessage checks a role "system" message in messages (a
// mid-conversation system message): the models from Claude Opus 4.8 on
// take one immediately after a user message, with text content; earlier
// models refuse the role.
func checkSystemMessage(model string, i int, m Message, before []Message) invalid {
	if !midConversationSystem(model) {
		return invalidf("messages.%d.role: Input should be 'user' or 'assistant' (role 'system' is not supported on this model)", i)
	}
	if i == 0 || before[i-1].Role != "user" {
		return invalidf("messages.%d: a system message must come immediately after a user message", i)
	}
	for j, b := range m.Content {
		if b.Type != "text" {
			return invalidf("messages.%d.content.%d.type: Input should be 'text'", i, j)
		}
	}
	return ""
}

// olderModels are the model name prefixes of models released before
// Claude Opus 4.8, which refuse system messages in messages. A model not
// named here (a later one, or an alias the tests make up) takes them.
var olderModels = []string{"claude-3", "claude-2", "claude-instant", "claude-opus-4-0", "claude-opus-4-1", "claude-opus-4-5",
	"claude-opus-4-6", "claude-opus-4-7", "claude-opus-4-2025", "claude-sonnet-4", "claude-haiku-4"}

func midConversationSystem(model string) bool {
	if model == "claude-opus-4" {
		return false
	}
	for _, p := range olderModels {
		if strings.HasPrefix(model, p) {
			return false
		}
	}
	return true
}

func parseMessage(i int, raw json.RawMessage) (Message, invalid) {
	var m struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return Message{}, invalidf("messages.%d: Input should be a valid dictionary", i)
	}
	if m.Role == nil {
		return Message{}, invalidf("messages.%d.role: Field required", i)
	}
	if *m.Role != "user" && *m.Role != "assistant" && *m.Role != "system" {
		return Message{}, invalidf("messages.%d.role: Input should be 'user', 'assistant' or 'system'", i)
	}
	if m.Content == nil {
		return Message{}, invalidf("messages.%d.content: Field required", i)
	}
	blocks, msg := parseContent(fmt.Sprintf("messages.%d.content", i), m.Content)
	if msg != "" {
		return Message{}, msg
	}
	return Message{Role: *m.Role, Content: blocks}, ""
}

// parseContent reads content: a string (one text block) or a list of
// blocks, each an object with a type and the fields that type needs.
func parseContent(where string, raw json.RawMessage) ([]ContentBlock, invalid) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []ContentBlock{{Type: "text", Text: s, Raw: raw}}, ""
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, invalid(where + ": Input should be a valid string or list of content blocks")
	}
	blocks := make([]ContentBlock, 0, len(items))
	for j, item := range items {
		b, msg := parseBlock(fmt.Sprintf("%s.%d", where, j), item)
		if msg != "" {
			return nil, msg
		}
		blocks = append(blocks, b)
	}
	return blocks, ""
}

func parseBlock(where string, raw json.RawMessage) (ContentBlock, invalid) {
	var b struct {
		Type      *string         `json:"type"`
		Text      *string         `json:"text"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &b) != nil {
		return ContentBlock{}, invalid(where + ": Input should be a valid dictionary")
	}
	if b.Type == nil || *b.Type == "" {
		return ContentBlock{}, invalid(where + ".type: Field required")
	}
	out := ContentBlock{Type: *b.Type, ID: b.ID, Name: b.Name, Input: b.Input,
		ToolUseID: b.ToolUseID, Content: b.Content, Raw: raw}
	switch out.Type {
	case "text":
		if b.Text == nil {
			return out, invalid(where + ".text: Field required")
		}
		if *b.Text == "" {
			return out, "messages: text content blocks must be non-empty"
		}
		out.Text = *b.Text
	case "tool_use":
		if b.ID == "" || b.Name == "" || !isObject(b.Input) {
			return out, invalid(where + ": tool_use blocks need an id, a name and an input object")
		}
	case "tool_result":
		if b.ToolUseID == "" {
			return out, invalid(where + ".tool_use_id: Field required")
		}
	}
	return out, ""
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
}

// checkToolPairs enforces what the API enforces about tool use: each
// tool_use is answered by a tool_result in the very next (user) message,
// tool results come before any other block of that message, and each
// tool_result answers a tool_use of the message just before it.
func checkToolPairs(ms []Message) invalid {
	for i, m := range ms {
		var asked map[string]bool
		if i > 0 && ms[i-1].Role == "assistant" {
			asked = toolUseIDs(ms[i-1])
		}
		if m.Role == "user" {
			if msg := checkToolResults(i, m, asked); msg != "" {
				return msg
			}
		} else if len(asked) > 0 {
			return invalidf("messages.%d: tool_use ids were found without tool_result blocks immediately after", i-1)
		}
	}
	if n := len(ms); n > 0 && ms[n-1].Role == "assistant" && len(toolUseIDs(ms[n-1])) > 0 {
		return invalidf("messages.%d: tool_use ids were found without tool_result blocks immediately after", n-1)
	}
	return ""
}

func toolUseIDs(m Message) map[string]bool {
	ids := map[string]bool{}
	for _, b := range m.Content {
		if b.Type == "tool_use" {
			ids[b.ID] = true
		}
	}
	return ids
}

func checkToolResults(i int, m Message, asked map[string]bool) invalid {
	answered := map[string]bool{}
	other := false
	for j, b := range m.Content {
		if b.Type != "tool_result" {
			other = true
			continue
		}
		if other {
			return invalidf("messages.%d.content.%d: tool_result blocks must come first in the content array", i, j)
		}
		if !asked[b.ToolUseID] {
			return invalidf("messages.%d.content.%d: unexpected tool_use_id %q in tool_result blocks: each tool_result must answer a tool_use of the previous message", i, j, b.ToolUseID)
		}
		answered[b.ToolUseID] = true
	}
	for id := range asked {
		if !answered[id] {
			return invalidf("messages.%d: tool_use ids were found without tool_result blocks immediately after: %s", i-1, id)
		}
	}
	return ""
}

func checkSystem(r *MessagesRequest) invalid {
	raw, ok := r.Fields["system"]
	if !ok {
		return ""
	}
	blocks, msg := parseContent("system", raw)
	if msg != "" {
		return msg
	}
	for i, b := range blocks {
		if b.Type != "text" {
			return invalidf("system.%d.type: Input should be 'text'", i)
		}
	}
	r.System = blocks
	return ""
}

func checkStream(r *MessagesRequest) invalid {
	raw, ok := r.Fields["stream"]
	if ok && json.Unmarshal(raw, &r.Stream) != nil {
		return "stream: Input should be a valid boolean"
	}
	return ""
}

func checkTools(r *MessagesRequest) invalid {
	raw, ok := r.Fields["tools"]
	if !ok {
		return ""
	}
	if json.Unmarshal(raw, &r.Tools) != nil {
		return "tools: Input should be a valid list"
	}
	for i, t := range r.Tools {
		var tool struct {
			Name        string          `json:"name"`
			Type        string          `json:"type"`
			InputSchema json.RawMessage `json:"input_schema"`
		}
		if json.Unmarshal(t, &tool) != nil || tool.Name == "" {
			return invalidf("tools.%d.name: Field required", i)
		}
		// Custom tools carry an input schema; server tools a type instead.
		if tool.Type == "" && !isObject(tool.InputSchema) {
			return invalidf("tools.%d.input_schema: Field required", i)
		}
	}
	return ""
}

func checkMetadata(r *MessagesRequest) invalid {
	raw, ok := r.Fields["metadata"]
	if !ok {
		return ""
	}
	var md struct {
		UserID *string `json:"user_id"`
	}
	if !isObject(raw) || json.Unmarshal(raw, &md) != nil {
		return "metadata: Input should be a valid dictionary with a string user_id"
	}
	r.Metadata = raw
	return ""
}

func checkSampling(r *MessagesRequest) invalid {
	if raw, ok := r.Fields["temperature"]; ok {
		var t float64
		if json.Unmarshal(raw, &t) != nil || t < 0 || t > 1 {
			return "temperature: Input should be a number between 0 and 1"
		}
	}
	if raw, ok := r.Fields["stop_sequences"]; ok {
		var seqs []string
		if json.Unmarshal(raw, &seqs) != nil {
			return "stop_sequences: Input should be a valid list of strings"
		}
	}
	return ""
}

func checkToolChoice(r *MessagesRequest) invalid {
	raw, ok := r.Fields["tool_choice"]
	if !ok {
		return ""
	}
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &tc) != nil {
		return "tool_choice: Input should be a valid dictionary"
	}
	switch tc.Type {
	case "auto", "any", "none":
	case "tool":
		if tc.Name == "" {
			return "tool_choice.name: Field required"
		}
	default:
		return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
	}
	return ""
}

func checkThinking(r *MessagesRequest) invalid {
	raw, ok := r.Fields["thinking"]
	if !ok {
		return ""
	}
	var th struct {
		Type         string          `json:"type"`
		BudgetTokens json.RawMessage `json:"budget_tokens"`
	}
	if json.Unmarshal(raw, &th) != nil || th.Type == "" {
		return "thinking.type: Field required"
	}
	if th.Type != "enabled" {
		return ""
	}
	n, ok := integer(th.BudgetTokens)
	if !ok || n < 1024 {
		return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
	}
	if n >= r.MaxTokens {
		return "max_tokens must be greater than thinking.budget_tokens"
	}
	return ""
}
