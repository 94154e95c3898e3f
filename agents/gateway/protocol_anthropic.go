package gateway

import (
	"encoding/json"
	"net/http"
)

// anthropicProto is Anthropic's Messages API (POST /v1/messages), which
// Claude Code speaks: max_tokens is the output cap, the wrap-up goes at
// the end of the last user message (inject.go), usage comes in
// message_start and message_delta events.
type anthropicProto struct{}

func (anthropicProto) provider() string { return ProviderAnthropic }

func (anthropicProto) model(_ *http.Request, body []byte) (string, bool) { return peekModel(body) }

func (anthropicProto) prepare(body []byte) ([]byte, error) { return body, nil }

func (anthropicProto) maxOutput(body []byte) (int64, bool) {
	n := peekMaxTokens(body)
	return n, n > 0
}

func (anthropicProto) capOutput(body []byte, limit int64) ([]byte, int64, error) {
	return capRequest(body, limit)
}

func (anthropicProto) wrapUp(body []byte, text string) ([]byte, error) {
	return injectWrapUp(body, text)
}

func (anthropicProto) usageRequired() bool { return false }

func (anthropicProto) writeError(w http.ResponseWriter, status int, typ, msg string) {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": apiError{Type: typ, Message: msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func (anthropicProto) keepEvent(name string) bool {
	// Content deltas carry no usage, but are what a cut stream's output
	// is estimated from; other content and ping events are not even kept.
	return name == "message_start" || name == "message_delta" ||
		name == "message_stop" || name == "error" || name == "content_block_delta"
}

// sseEvent is the part of a Messages API event the meter reads.
type sseEvent struct {
	Type    string `json:"type"`
	Message *struct {
		ID    string     `json:"id"`
		Model string     `json:"model"`
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
	Usage *usageJSON `json:"usage"`
	Error *apiError  `json:"error"`
	Delta *struct {
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
}

func (anthropicProto) sseEvent(m *meter, name string, data []byte) {
	var ev sseEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		m.noteProblem("malformed %s event: %v", name, err)
		return
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil {
			m.id, m.model = ev.Message.ID, ev.Message.Model
			ev.Message.Usage.apply(&m.usage)
		}
	case "message_delta":
		ev.Usage.apply(&m.usage)
		m.final = m.final || ev.Usage != nil
	case "content_block_delta":
		if ev.Delta != nil {
			// A tool's input starts with an empty delta: not a token.
			m.delta(len(ev.Delta.Text) + len(ev.Delta.Thinking) + len(ev.Delta.PartialJSON))
		}
	case "message_stop":
		m.stopped = true
	case "error":
		if ev.Error != nil {
			m.errType, m.errMsg = ev.Error.Type, ev.Error.Message
		}
	}
}

func (anthropicProto) endJSON(m *meter, body []byte) {
	var msg struct {
		Type  string     `json:"type"`
		ID    string     `json:"id"`
		Model string     `json:"model"`
		Usage *usageJSON `json:"usage"`
		Error *apiError  `json:"error"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		m.noteProblem("malformed JSON body: %v", err)
		return
	}
	if msg.Error != nil {
		m.errType, m.errMsg = msg.Error.Type, msg.Error.Message
	}
	if m.kind == kindJSON && msg.Type == "message" {
		m.id, m.model, m.stopped, m.final = msg.ID, msg.Model, true, true
		msg.Usage.apply(&m.usage)
	}
}
