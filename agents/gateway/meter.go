package gateway

import (
	"bytes"
	"fmt"
)

// Usage is the token count of one model call, as the provider reported it.
type Usage struct {
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	CacheReadTokens     int64 `json:"cache_read_tokens"`
	CacheCreationTokens int64 `json:"cache_creation_tokens"`
	// ReasoningTokens is the part of OutputTokens the model spent
	// reasoning (OpenAI's reasoning_tokens, Gemini's thoughtsTokenCount):
	// billed as output, and already counted in OutputTokens.
	ReasoningTokens int64 `json:"reasoning_tokens,omitempty"`
}

// usageJSON is usage as the API writes it; absent fields stay nil so a
// later event overrides only what it reports.
type usageJSON struct {
	InputTokens         *int64 `json:"input_tokens"`
	OutputTokens        *int64 `json:"output_tokens"`
	CacheReadTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreationTokens *int64 `json:"cache_creation_input_tokens"`
}

// apply overrides u with every field j reports: the API's usage figures
// are running totals, so the last value is the one to keep.
func (j *usageJSON) apply(u *Usage) {
	if j == nil {
		return
	}
	for _, f := range []struct {
		src *int64
		dst *int64
	}{
		{j.InputTokens, &u.InputTokens}, {j.OutputTokens, &u.OutputTokens},
		{j.CacheReadTokens, &u.CacheReadTokens}, {j.CacheCreationTokens, &u.CacheCreationTokens},
	} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
}

// Response kinds a meter reads.
const (
	kindSSE   = iota // a streamed message
	kindJSON         // a message as one JSON object
	kindError        // an error answer (HTTP status >= 400)
)

const (
	maxLine      = 1 << 20  // an SSE line longer than this is not parsed
	maxJSONBody  = 16 << 20 // a JSON message longer than this is not parsed
	maxErrorBody = 64 << 10
)

// meter reads a response's bytes as they pass and keeps what the call
// cost: the message id, model and usage, whether the message ended, and
// the provider's error if it sent one. It never changes the bytes.
type meter struct {
	kind int
	p    protocol // nil: Anthropic's Messages API

	// SSE parsing state (kindSSE).
	line     []byte
	overflow bool
	cr       bool // the last line ended with \r: a leading \n belongs to it
	event    string
	data     []byte
	skip     bool // the current event is one the meter ignores

	body []byte // kindJSON and kindError: the body, up to a cap

	id, model string
	usage     Usage
	final     bool   // a message_delta (the final usage) seen, or a whole JSON message read
	stopped   bool   // message_stop seen, or a whole JSON message read
	deltas    int64  // content_block_delta events seen that carried content
	content   int64  // bytes of text, thinking and tool input they carried
	errType   string // the provider's error type, if it sent one
	errMsg    string
	problem   string // the first thing that could not be parsed
}

func (m *meter) write(p []byte) {
	switch m.kind {
	case kindSSE:
		m.writeSSE(p)
	case kindJSON:
		m.body = appendCapped(m.body, p, maxJSONBody, &m.overflow)
	default:
		m.body = appendCapped(m.body, p, maxErrorBody, &m.overflow)
	}
}

func appendCapped(dst, p []byte, limit int, over *bool) []byte {
	if len(dst)+len(p) > limit {
		*over = true
		return dst
	}
	return append(dst, p...)
}

// writeSSE splits p into lines (ending in \n, \r\n or \r, as the SSE
// format allows) and handles each complete one.
func (m *meter) writeSSE(p []byte) {
	for len(p) > 0 {
		if m.cr {
			m.cr = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			m.line = appendCapped(m.line, p, maxLine, &m.overflow)
			return
		}
		m.line = appendCapped(m.line, p[:i], maxLine, &m.overflow)
		m.cr = p[i] == '\r'
		m.lineDone()
		p = p[i+1:]
	}
}

func (m *meter) lineDone() {
	line := m.line
	m.line = m.line[:0]
	if m.overflow {
		m.overflow = false
		m.noteProblem("an SSE line longer than %d bytes", maxLine)
		m.data, m.skip = nil, true
		return
	}
	if len(line) == 0 {
		m.dispatch()
		return
	}
	field, value, _ := bytes.Cut(line, []byte(":"))
	value = bytes.TrimPrefix(value, []byte(" "))
	switch string(field) {
	case "event":
		m.event = string(value)
		m.skip = !m.proto().keepEvent(m.event)
	case "data":
		if m.skip {
			return
		}
		if m.data != nil {
			m.data = append(m.data, '\n')
		}
		m.data = append(m.data, value...)
	}
}

type apiError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func (m *meter) dispatch() {
	name, data, skip := m.event, m.data, m.skip
	m.event, m.data, m.skip = "", nil, false
	if skip || data == nil {
		return
	}
	m.proto().sseEvent(m, name, data)
}

// proto is the protocol whose answers the meter reads.
func (m *meter) proto() protocol {
	if m.p == nil {
		return anthropicProto{}
	}
	return m.p
}

// delta counts a content delta of n bytes, if it carried any.
func (m *meter) delta(n int) {
	if n > 0 {
		m.deltas++
		m.content += int64(n)
	}
}

func (m *meter) noteProblem(format string, args ...any) {
	if m.problem == "" {
		m.problem = fmt.Sprintf(format, args...)
	}
}

// end reads a buffered body once it is complete.
func (m *meter) end() {
	if m.kind == kindSSE {
		if len(m.line) > 0 || m.data != nil {
			m.noteProblem("the stream ended inside an event")
		}
		return
	}
	if m.overflow {
		m.noteProblem("a body longer than the meter reads")
		return
	}
	m.proto().endJSON(m, m.body)
}

// estimatedOutput is the output tokens of a message whose final usage
// never came (its stream was cut): at least what message_start reported,
// at least one token per content delta that carried content, and
// at least a token per four bytes of delivered text, the usual ratio for
// English and code. The provider bills what it generated, which is at
// least what was delivered, so this errs low, never high.
func (m *meter) estimatedOutput() int64 {
	return max(m.usage.OutputTokens, m.deltas, (m.content+3)/4)
}
