package scriptedmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"
)

// countPath is the token counting endpoint.
const countPath = "/v1/messages/count_tokens"

// Count says how a Server answers POST /v1/messages/count_tokens.
type Count struct {
	// InputTokens, if > 0, is the count answered for every valid body.
	// 0 means a stand-in derived from the body: a token per 4 bytes of
	// the body as sent, rounded up. It is not a tokenizer: a script that
	// meters its calls' input exactly says what the provider would count
	// here.
	InputTokens int
	// Error, if set, is answered instead, to script a count that fails.
	Error *APIError
	// Delay is slept before answering, to script a slow count.
	Delay time.Duration
}

// countFields are the top-level fields count_tokens takes; any other is
// refused, as the API refuses it (max_tokens, stream, metadata,
// temperature... belong to a message, not to a count).
var countFields = map[string]bool{
	"model": true, "messages": true, "system": true, "tools": true, "tool_choice": true,
	"thinking": true, "cache_control": true, "output_config": true, "speed": true,
}

// countRefusedTools are the tool types count_tokens refuses (server
// tools): the Messages API accepts them, the count does not.
var countRefusedTools = []string{"web_search", "web_fetch", "code_execution", "tool_search"}

// serveCount answers a count_tokens request whose HTTP side checkHTTP
// passed: the body validated as a Messages request's, but for its
// fields, then the scripted count.
func (s *Server) serveCount(w http.ResponseWriter, rec *Request, body []byte) {
	if msg := checkCount(body); msg != "" {
		s.reject(w, rec, http.StatusBadRequest, "invalid_request_error", string(msg))
		return
	}
	s.mu.Lock()
	c := s.count
	s.mu.Unlock()
	time.Sleep(c.Delay)
	if c.Error != nil {
		s.reject(w, rec, c.Error.Status, c.Error.Type, c.Error.message())
		return
	}
	n := c.InputTokens
	if n <= 0 {
		n = (len(body) + 3) / 4
	}
	rec.Status = http.StatusOK
	s.mu.Lock()
	s.record(*rec)
	s.mu.Unlock()
	b, _ := marshal(map[string]int{"input_tokens": n})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("request-id", s.newID("req"))
	w.Write(b)
}

// checkCount validates a count_tokens body as the API does: a JSON
// object of known fields only, with a model and valid messages, and
// valid system, tools, tool_choice and thinking when present.
func checkCount(body []byte) invalid {
	var fields map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&fields); err != nil || fields == nil {
		return "request body: must be a JSON object"
	}
	if d.More() {
		return "request body: unexpected data after the JSON object"
	}
	for k := range fields {
		if !countFields[k] {
			return invalidf("%s: Extra inputs are not permitted", k)
		}
	}
	// A count has no max_tokens: the thinking budget is checked against
	// none.
	req := &MessagesRequest{Fields: fields, MaxTokens: math.MaxInt}
	for _, check := range []func(*MessagesRequest) invalid{checkModel, checkMessages, checkSystem, checkTools, checkToolChoice, checkThinking} {
		if msg := check(req); msg != "" {
			return msg
		}
	}
	for i, t := range req.Tools {
		var tool struct {
			Type string `json:"type"`
		}
		json.Unmarshal(t, &tool)
		for _, p := range countRefusedTools {
			if strings.HasPrefix(tool.Type, p) {
				return invalidf("tools.%d: server tools are not supported by token counting", i)
			}
		}
	}
	for i, m := range req.Messages {
		for j, b := range m.Content {
			if msg := countableBlock(fmt.Sprintf("messages.%d.content.%d", i, j), b.Raw); msg != "" {
				return msg
			}
		}
	}
	return ""
}

// countableBlock refuses what the count refuses in content: an image or
// document given by URL or file id (base64 ones are counted), also
// inside a tool result.
func countableBlock(where string, raw json.RawMessage) invalid {
	var b struct {
		Type   string `json:"type"`
		Source struct {
			Type string `json:"type"`
		} `json:"source"`
		Content json.RawMessage `json:"content"`
	}
	json.Unmarshal(raw, &b)
	if (b.Type == "image" || b.Type == "document") && (b.Source.Type == "url" || b.Source.Type == "file") {
		return invalidf("%s.source: %s sources are not supported by token counting; send the %s as base64", where, b.Source.Type, b.Type)
	}
	var inner []json.RawMessage
	if b.Type == "tool_result" && json.Unmarshal(b.Content, &inner) == nil {
		for k, c := range inner {
			if msg := countableBlock(fmt.Sprintf("%s.content.%d", where, k), c); msg != "" {
				return msg
			}
		}
	}
	return ""
}
