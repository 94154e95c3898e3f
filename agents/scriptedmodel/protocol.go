package scriptedmodel

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A protocol is one provider API besides Anthropic's Messages API: its
// HTTP checks, its request validation, its error shape and how it plays a
// turn. Each lives in its own file (openai_responses.go, openai_chat.go,
// gemini.go); the script and its vocabulary are the same for all.
type protocol interface {
	// check checks what is not in the body: method, key, content type.
	check(s *Server, r *http.Request) *protoError
	// parse validates body and keeps the parsed request on rec.
	parse(r *http.Request, body []byte, rec *Request) *protoError
	// fail answers a turn's scripted error.
	fail(e *APIError) *protoError
	writeError(w http.ResponseWriter, e *protoError)
	// play answers the parsed request on rec with turn.
	play(s *Server, w http.ResponseWriter, rec *Request, turn Turn)
}

// protoError is an error answer in a provider's terms: for OpenAI, Type,
// Code and Param are the error object's fields; for Gemini, Type is the
// status (INVALID_ARGUMENT ...). An empty Type is filled in by the
// protocol's writeError.
type protoError struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
}

// protocolFor is the protocol serving path, or nil for the Messages API
// (and for paths no protocol serves).
func protocolFor(path string) protocol {
	switch {
	case path == "/v1/responses":
		return responsesProtocol{}
	case path == "/v1/chat/completions":
		return chatProtocol{}
	case strings.HasPrefix(path, "/v1beta/models/") || strings.HasPrefix(path, "/v1/models/"):
		return geminiProtocol{}
	}
	return nil
}

// serveProtocol answers one request of protocol p: it validates, records,
// picks a turn and plays it, as ServeHTTP does for the Messages API.
func (s *Server) serveProtocol(w http.ResponseWriter, r *http.Request, p protocol) {
	rec := Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone()}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	rec.Body = body
	fail := func(e *protoError) {
		rec.Status, rec.Error = e.Status, e.Message
		s.mu.Lock()
		s.record(rec)
		s.mu.Unlock()
		p.writeError(w, e)
	}
	if err != nil {
		fail(&protoError{Status: http.StatusBadRequest, Message: "request body: " + err.Error()})
		return
	}
	if e := p.check(s, r); e != nil {
		fail(e)
		return
	}
	if len(body) > maxBody {
		fail(&protoError{Status: http.StatusRequestEntityTooLarge, Message: "request exceeds the maximum allowed size"})
		return
	}
	if e := p.parse(r, body, &rec); e != nil {
		fail(e)
		return
	}
	s.mu.Lock()
	turn := s.script.next(&rec)
	rec.Status = http.StatusOK
	var e *protoError
	if turn.Error != nil {
		e = p.fail(turn.Error)
		rec.Status, rec.Error = e.Status, e.Message
	}
	s.record(rec)
	s.mu.Unlock()
	if e != nil {
		time.Sleep(turn.Delay)
		p.writeError(w, e)
		return
	}
	p.play(s, w, &rec, turn)
}

// outputTokens is what a turn reports as output for a request whose
// output cap is limit (0: none): a provider never generates more.
func (t *Turn) outputTokens(limit int) (out, reasoning int) {
	out = t.Usage.OutputTokens
	if limit > 0 {
		out = min(out, limit)
	}
	return out, min(t.Usage.ReasoningTokens, out)
}

// promptTokens is the whole input of a turn, as OpenAI and Gemini count
// it: cached tokens included.
func (t *Turn) promptTokens() int {
	return t.Usage.InputTokens + t.Usage.CacheReadInputTokens + t.Usage.CacheCreationInputTokens
}

// truncated reports whether a turn ends because its output hit the cap.
func (t *Turn) truncated() bool { return t.StopReason == "max_tokens" }

// toolCalls are a turn's tool_use blocks.
func (t *Turn) toolCalls() []Block {
	var out []Block
	for _, b := range t.Blocks {
		if b.Type == "tool_use" {
			out = append(out, b)
		}
	}
	return out
}

// compactInput is a tool_use block's input as compact JSON text.
func compactInput(b Block) string {
	if len(b.Input) == 0 {
		return "{}"
	}
	var v any
	if json.Unmarshal(b.Input, &v) != nil {
		return string(b.Input)
	}
	out, _ := marshal(v)
	return string(out)
}

// objectFields decodes body as one JSON object, field by field, refusing
// trailing data.
func objectFields(body []byte) (map[string]json.RawMessage, bool) {
	var fields map[string]json.RawMessage
	d := json.NewDecoder(strings.NewReader(string(body)))
	if d.Decode(&fields) != nil || fields == nil || d.More() {
		return nil, false
	}
	return fields, true
}

// unknownField is the first (sorted) field of fields not in known.
func unknownField(fields map[string]json.RawMessage, known []string) string {
	var unknown []string
	for k := range fields {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	if len(unknown) == 0 {
		return ""
	}
	return unknown[0]
}

// present reports whether a field was sent with a value other than null;
// the OpenAI APIs treat an optional null as absent.
func present(fields map[string]json.RawMessage, k string) (json.RawMessage, bool) {
	raw, ok := fields[k]
	if !ok || strings.TrimSpace(string(raw)) == "null" {
		return nil, false
	}
	return raw, true
}

// sse writes Server-Sent Events, flushing after each, sleeping the
// turn's delay before each and breaking the stream as the turn says.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	turn    Turn
	n       int // events written
	breakAt int // the event a Break strikes before; -1 none
}

func newSSE(w http.ResponseWriter, turn Turn) *sse {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w), turn: turn, breakAt: -1}
}

// send writes one event (its bytes whole). At the break point a Cut
// writes half of it and drops the connection, a Malformed break writes
// malformed (data that is not JSON) before it, and an ErrorEvent break
// writes errEvent instead and ends the stream. It reports whether the
// stream goes on.
func (e *sse) send(event, malformed, errEvent []byte) bool {
	time.Sleep(e.turn.Delay)
	if e.n == e.breakAt && e.turn.Break != NoBreak {
		switch e.turn.Break {
		case Cut:
			e.w.Write(event[:len(event)/2])
			e.rc.Flush()
			panic(http.ErrAbortHandler) // drop the connection mid-event
		case Malformed:
			e.w.Write(malformed)
			e.rc.Flush()
		case ErrorEvent:
			e.w.Write(errEvent)
			e.rc.Flush()
			return false
		}
	}
	e.n++
	if _, err := e.w.Write(event); err != nil {
		return false
	}
	e.rc.Flush()
	return true
}

// writeJSON answers a whole JSON body; a turn with a Break promises the
// whole body and sends half of it.
func writeJSON(w http.ResponseWriter, turn Turn, v any) {
	time.Sleep(turn.Delay)
	body, _ := marshal(v)
	w.Header().Set("Content-Type", "application/json")
	if turn.Break == NoBreak {
		w.Write(body)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body[:len(body)/2])
	http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler)
}

// str, boolean and number decode raw into v only if it is that JSON type.
func str(raw json.RawMessage, v *string) bool {
	return jsonKind(raw) == '"' && json.Unmarshal(raw, v) == nil
}

func boolean(raw json.RawMessage, v *bool) bool {
	k := jsonKind(raw)
	return (k == 't' || k == 'f') && json.Unmarshal(raw, v) == nil
}

func number(raw json.RawMessage, v *float64) bool {
	k := jsonKind(raw)
	return (k == '-' || (k >= '0' && k <= '9')) && json.Unmarshal(raw, v) == nil
}

// jsonKind is the first byte of a JSON value: '{', '[', '"', 't', 'f',
// 'n', or a number's first character; 0 for nothing.
func jsonKind(raw json.RawMessage) byte {
	s := strings.TrimSpace(string(raw))
	if s == "" {
		return 0
	}
	return s[0]
}
