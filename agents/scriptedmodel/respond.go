package scriptedmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// play answers req with turn: an error, a JSON message or an SSE stream.
func (s *Server) play(w http.ResponseWriter, r *http.Request, req *MessagesRequest, turn Turn) {
	w.Header().Set("request-id", s.newID("req"))
	if turn.Error != nil {
		time.Sleep(turn.Delay)
		writeError(w, turn.Error.Status, turn.Error.Type, turn.Error.message())
		return
	}
	msg := s.message(req, turn)
	if req.Stream {
		s.stream(w, msg, turn)
		return
	}
	time.Sleep(turn.Delay)
	body, _ := marshal(msg)
	w.Header().Set("Content-Type", "application/json")
	if turn.Break == NoBreak {
		w.Write(body)
		return
	}
	// A broken JSON answer promises the whole body and sends half of it.
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body[:len(body)/2])
	http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler)
}

// message is the Messages API response object for a turn.
type message struct {
	ID           string       `json:"id"`
	Type         string       `json:"type"`
	Role         string       `json:"role"`
	Model        string       `json:"model"`
	Content      []blockJSON  `json:"content"`
	StopReason   *string      `json:"stop_reason"`
	StopSequence *string      `json:"stop_sequence"`
	Usage        messageUsage `json:"usage"`
}

type messageUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

type blockJSON struct {
	Type  string           `json:"type"`
	Text  *string          `json:"text,omitempty"`
	ID    string           `json:"id,omitempty"`
	Name  string           `json:"name,omitempty"`
	Input *json.RawMessage `json:"input,omitempty"`
}

func (s *Server) message(req *MessagesRequest, turn Turn) message {
	model := turn.Model
	if model == "" {
		model = req.Model
	}
	stop := turn.stopReason()
	m := message{
		ID: s.newID("msg"), Type: "message", Role: "assistant", Model: model,
		Content: []blockJSON{}, StopReason: &stop,
		Usage: messageUsage{
			InputTokens:              turn.Usage.InputTokens,
			CacheCreationInputTokens: turn.Usage.CacheCreationInputTokens,
			CacheReadInputTokens:     turn.Usage.CacheReadInputTokens,
			// A provider never generates more than max_tokens: a scripted
			// answer reports at most that many output tokens.
			OutputTokens: min(turn.Usage.OutputTokens, req.MaxTokens),
		},
	}
	for _, b := range turn.Blocks {
		m.Content = append(m.Content, s.block(b))
	}
	return m
}

func (s *Server) block(b Block) blockJSON {
	if b.Type != "tool_use" {
		text := b.Text
		return blockJSON{Type: "text", Text: &text}
	}
	id := b.ID
	if id == "" {
		id = s.newID("toolu")
	}
	input := b.Input
	if len(input) == 0 {
		input = json.RawMessage("{}")
	}
	var compact bytes.Buffer
	if json.Compact(&compact, input) == nil {
		input = compact.Bytes()
	}
	return blockJSON{Type: "tool_use", ID: id, Name: b.Name, Input: &input}
}

// event is one SSE event: its name and its data line's JSON.
type event struct {
	name string
	data any
}

func (e event) bytes() []byte {
	data, _ := marshal(e.data)
	return fmt.Appendf(nil, "event: %s\ndata: %s\n\n", e.name, data)
}

// stream plays msg as the API streams it, flushing after every event.
func (s *Server) stream(w http.ResponseWriter, msg message, turn Turn) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	events, breakAt := streamEvents(msg)
	for i, e := range events {
		time.Sleep(turn.Delay)
		if i == breakAt && turn.Break != NoBreak {
			if !breakStream(w, rc, e, turn.Break) {
				return
			}
		}
		if _, err := w.Write(e.bytes()); err != nil {
			return
		}
		rc.Flush()
	}
}

// breakStream breaks the stream before event e; it reports whether the
// stream goes on.
func breakStream(w http.ResponseWriter, rc *http.ResponseController, e event, b Break) bool {
	switch b {
	case Cut:
		whole := e.bytes()
		w.Write(whole[:len(whole)/2])
		rc.Flush()
		panic(http.ErrAbortHandler) // drop the connection mid-event
	case Malformed:
		w.Write([]byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\n\n"))
		rc.Flush()
		return true
	case ErrorEvent:
		w.Write(event{"error", errorBody("overloaded_error", "Overloaded")}.bytes())
		rc.Flush()
		return false
	}
	return true
}

// streamEvents turns msg into the API's event sequence. breakAt is the
// index of the event after the first content delta (or after
// message_start when there is no content): where a Break strikes.
func streamEvents(msg message) (events []event, breakAt int) {
	start := msg
	start.Content = []blockJSON{}
	start.StopReason = nil
	start.Usage.OutputTokens = min(msg.Usage.OutputTokens, 1)
	events = append(events,
		event{"message_start", map[string]any{"type": "message_start", "message": start}},
		event{"ping", map[string]string{"type": "ping"}},
	)
	breakAt = len(events)
	for i, b := range msg.Content {
		open, deltas := blockEvents(b)
		events = append(events, event{"content_block_start", map[string]any{
			"type": "content_block_start", "index": i, "content_block": open}})
		for j, d := range deltas {
			events = append(events, event{"content_block_delta", map[string]any{
				"type": "content_block_delta", "index": i, "delta": d}})
			if i == 0 && j == 0 {
				breakAt = len(events)
			}
		}
		events = append(events, event{"content_block_stop", map[string]any{"type": "content_block_stop", "index": i}})
	}
	events = append(events,
		event{"message_delta", map[string]any{
			"type":  "message_delta",
			"delta": map[string]any{"stop_reason": msg.StopReason, "stop_sequence": nil},
			"usage": map[string]int{"output_tokens": msg.Usage.OutputTokens},
		}},
		event{"message_stop", map[string]string{"type": "message_stop"}},
	)
	return events, breakAt
}

// blockEvents is a block's content_block_start payload and its deltas:
// text in a few text_delta pieces, tool input as an empty then a few
// input_json_delta pieces, as the API sends them.
func blockEvents(b blockJSON) (open any, deltas []any) {
	if b.Type == "tool_use" {
		open = map[string]any{"type": "tool_use", "id": b.ID, "name": b.Name, "input": map[string]any{}}
		deltas = append(deltas, map[string]string{"type": "input_json_delta", "partial_json": ""})
		for _, p := range split(string(*b.Input), 3) {
			deltas = append(deltas, map[string]string{"type": "input_json_delta", "partial_json": p})
		}
		return open, deltas
	}
	open = map[string]string{"type": "text", "text": ""}
	for _, p := range split(*b.Text, 3) {
		deltas = append(deltas, map[string]string{"type": "text_delta", "text": p})
	}
	return open, deltas
}

// split cuts s into at most n non-empty pieces on rune boundaries.
func split(s string, n int) []string {
	if s == "" {
		return []string{""}
	}
	size := max(1, (len(s)+n-1)/n)
	var out []string
	for len(s) > 0 {
		cut := min(size, len(s))
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return out
}
