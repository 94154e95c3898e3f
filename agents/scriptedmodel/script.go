package scriptedmodel

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
)

// Turn is one scripted answer: a message (Blocks, StopReason, Usage), an
// HTTP error (Error), or a message whose stream breaks (Break).
type Turn struct {
	// Match, if set, makes this a reactive turn: it is played, once, for the
	// first request it matches, ahead of the turns that play in order.
	// Turns without Match play in script order.
	Match func(*Request) bool

	Blocks []Block
	// StopReason is "end_turn", "tool_use", "max_tokens" or
	// "stop_sequence"; empty means tool_use if a block is a tool_use, else
	// end_turn.
	StopReason string
	Usage      Usage
	// Model overrides the model named in the answer; empty means the
	// request's model.
	Model string

	// Error, if set, is answered instead of a message.
	Error *APIError
	// Break breaks a streamed answer after its first content delta. A
	// non-streamed answer with any Break sends half its body, then drops
	// the connection.
	Break Break
	// Delay is slept before each SSE event (and before a JSON answer), to
	// script a slow model.
	Delay time.Duration
}

// Block is one content block of a scripted message.
type Block struct {
	Type  string          // "text" or "tool_use"
	Text  string          // text blocks
	ID    string          // tool_use; empty means a fresh toolu_ id
	Name  string          // tool_use
	Input json.RawMessage // tool_use: a JSON object
}

// Text is a text block.
func Text(s string) Block { return Block{Type: "text", Text: s} }

// ToolUse is a tool_use block calling name with input, which must encode
// to a JSON object (a map, a struct, or JSON text as string or []byte).
func ToolUse(name string, input any) Block {
	var raw json.RawMessage
	switch v := input.(type) {
	case string:
		raw = json.RawMessage(v)
	case []byte:
		raw = json.RawMessage(v)
	case json.RawMessage:
		raw = v
	default:
		b, err := marshal(v)
		if err != nil {
			panic("scriptedmodel.ToolUse: " + err.Error())
		}
		raw = b
	}
	return Block{Type: "tool_use", Name: name, Input: raw}
}

// Usage is what a scripted answer reports in usage, except that its
// output tokens are at most the request's output cap (max_tokens,
// max_output_tokens, max_completion_tokens, maxOutputTokens), as a
// provider's. It means the same in every protocol: InputTokens are the
// uncached input tokens, as Anthropic counts them; OpenAI and Gemini,
// which count cached tokens inside their input total, are sent
// InputTokens + CacheReadInputTokens + CacheCreationInputTokens there,
// with CacheReadInputTokens as the cached part. OutputTokens include
// ReasoningTokens, as OpenAI counts them (Anthropic reports no reasoning
// figure; Gemini reports them apart, as thoughtsTokenCount, and the rest
// as candidatesTokenCount).
type Usage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	ReasoningTokens          int `json:"reasoning_tokens,omitempty"`
}

// APIError is an error answer: HTTP status and Anthropic error type, e.g.
// {529, "overloaded_error"}, {500, "api_error"}, {429, "rate_limit_error"}.
// The other protocols answer it in their own shape: OpenAI's maps the
// Anthropic types to its own type and code (overloaded_error: 503
// server_error; rate_limit_error: type requests, code
// rate_limit_exceeded) and sends other types as they are; Gemini's sends
// the status named by Code, else the one that goes with the HTTP status
// (429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE ...). Both answer a 529 as 503.
type APIError struct {
	Status  int
	Type    string
	Message string // empty means a message made from Type
	// Code is OpenAI's error code (e.g. "rate_limit_exceeded") or
	// Gemini's status (e.g. "RESOURCE_EXHAUSTED"); Anthropic has none.
	Code string
}

// Overloaded is the provider's 529 answer.
func Overloaded() *APIError {
	return &APIError{Status: 529, Type: "overloaded_error", Message: "Overloaded"}
}

// Break says how a streamed answer breaks.
type Break int

const (
	// NoBreak plays the answer whole.
	NoBreak Break = iota
	// Cut writes half of the next event, then drops the connection.
	Cut
	// Malformed writes an SSE data line that is not JSON, then goes on
	// with the rest of the answer.
	Malformed
	// ErrorEvent sends an `event: error` (overloaded_error) and ends the
	// stream, as the API does when it fails mid-answer.
	ErrorEvent
)

// LastUserContains matches a request whose last user message has a text
// (or tool_result text) containing s.
func LastUserContains(s string) func(*Request) bool {
	return func(r *Request) bool { return strings.Contains(r.LastUserText(), s) }
}

func (t *Turn) stopReason() string {
	if t.StopReason != "" {
		return t.StopReason
	}
	for _, b := range t.Blocks {
		if b.Type == "tool_use" {
			return "tool_use"
		}
	}
	return "end_turn"
}

// script is the server's playback state; the Server's mutex guards it.
type script struct {
	turns           []Turn
	played          []bool
	final           Turn
	perConversation bool
	sideCall        *Turn
}

// next picks the turn for r: the side call turn for a request without
// tools (if the script has one), else the first unplayed reactive turn
// that matches, else the next unplayed ordered turn, else the final turn.
func (s *script) next(r *Request) Turn {
	if s.sideCall != nil && !r.offersTools() {
		return *s.sideCall
	}
	for i := range s.turns {
		if t := &s.turns[i]; !s.played[i] && t.Match != nil && t.Match(r) {
			s.played[i] = true
			return *t
		}
	}
	if s.perConversation {
		return s.inConversation(r.assistantTurns())
	}
	for i := range s.turns {
		if !s.played[i] && s.turns[i].Match == nil {
			s.played[i] = true
			return s.turns[i]
		}
	}
	return s.final
}

// inConversation returns the n-th ordered turn (from 0), or the final
// one past the end.
func (s *script) inConversation(n int) Turn {
	for i := range s.turns {
		if s.turns[i].Match != nil {
			continue
		}
		if n == 0 {
			return s.turns[i]
		}
		n--
	}
	return s.final
}

// marshal is json.Marshal without HTML escaping, as the API writes JSON.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
