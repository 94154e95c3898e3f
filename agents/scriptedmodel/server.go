// Package scriptedmodel is a scripted stand-in for a model provider: an
// HTTP server that speaks the Anthropic Messages API (POST /v1/messages,
// JSON or SSE, and POST /v1/messages/count_tokens), OpenAI's Responses
// API (POST /v1/responses) and Chat Completions (POST
// /v1/chat/completions), and Gemini's generateContent and
// streamGenerateContent (POST /v1beta/models/M:generateContent, SSE with
// ?alt=sse), each in its own file with its own validation; checks every
// request as strictly as the provider does, plays one script of turns
// (text, tool calls, usage figures, errors, broken streams) and records
// what it was sent. It is never a model: it answers what its script says,
// whatever it is asked. Tests use it (through agents/modeltest) and so
// does the demo command cmd/hearth-scripted-model, for machines that
// reach no provider; the appliance and the agents never import it.
package scriptedmodel

import (
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// DefaultKey is the API key a Server requires when Config.Key is empty.
const DefaultKey = "sk-test"

// Config is a Server's script and credentials.
type Config struct {
	// Key is the API key requests must carry in x-api-key (or as an
	// Authorization bearer token); empty means DefaultKey.
	Key string
	// Turns is the script; see Turn.Match for the order they play in.
	Turns []Turn
	// Final is played once the script has run out; nil means a text turn
	// saying "Done." with end_turn.
	Final *Turn
	// PerConversation plays the ordered turns once per conversation
	// instead of once in all: a request gets the turn at the index of the
	// number of assistant messages it carries (its place in its own
	// conversation), so any number of agents, one after another or at
	// once, each get the whole script. Reactive turns (Match) still play
	// once in all.
	PerConversation bool
	// DiscardRequests keeps no record of requests (Requests returns none),
	// for a server that runs for long.
	DiscardRequests bool
	// Count says how POST /v1/messages/count_tokens is answered (count.go).
	Count Count
	// SideCall, if set, answers every request that offers the model no
	// tools, in any protocol, and such a request takes no turn of the
	// script: the side calls CLIs make besides the task (OpenCode's title,
	// Gemini CLI's model router and loop check) then leave the script to
	// the task. Nil means side calls take turns like any request.
	SideCall *Turn
}

// Server is a scripted Messages API server. It is safe for concurrent
// use. Start it, point a client at URL, Close it.
type Server struct {
	key     string
	discard bool
	count   Count

	mu       sync.Mutex
	script   script
	requests []Request

	ids    atomic.Int64
	prefix string

	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	once sync.Once
}

// New makes a Server for cfg; it does not listen until Start.
func New(cfg Config) *Server {
	s := &Server{key: cfg.Key, discard: cfg.DiscardRequests, count: cfg.Count, prefix: strings.ToLower(rand.Text()[:8])}
	if s.key == "" {
		s.key = DefaultKey
	}
	s.script.turns = append([]Turn(nil), cfg.Turns...)
	s.script.played = make([]bool, len(cfg.Turns))
	s.script.perConversation = cfg.PerConversation
	s.script.sideCall = cfg.SideCall
	s.script.final = Turn{Blocks: []Block{Text("Done.")}}
	if cfg.Final != nil {
		s.script.final = *cfg.Final
	}
	return s
}

// Start listens on a free loopback port and serves in the background.
func (s *Server) Start() error { return s.Listen("127.0.0.1:0") }

// Listen listens on addr (host:port) and serves in the background.
func (s *Server) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("scriptedmodel: listen: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln) // returns when Close closes the listener
	}()
	return nil
}

// URL is the base URL of a started server, e.g. http://127.0.0.1:41234,
// to use as ANTHROPIC_BASE_URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Key is the API key the server requires.
func (s *Server) Key() string { return s.key }

// Close stops the server, dropping open connections, and waits for it.
// It is idempotent.
func (s *Server) Close() {
	s.once.Do(func() {
		if s.srv == nil {
			return
		}
		s.srv.Close()
		<-s.done
	})
}

// Requests returns a copy of every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// MessageRequests returns the recorded requests the server accepted as
// Messages API calls.
func (s *Server) MessageRequests() []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Messages != nil {
			out = append(out, r)
		}
	}
	return out
}

// record keeps rec unless the server discards requests; the caller
// holds s.mu.
func (s *Server) record(rec Request) {
	if !s.discard {
		s.requests = append(s.requests, rec)
	}
}

// maxBody bounds a request body; the API's own limit is 32 MB.
const maxBody = 32 << 20

// ServeHTTP answers one request: it validates, records, picks a turn and
// plays it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := protocolFor(r.URL.Path); p != nil { // OpenAI's and Gemini's APIs
		s.serveProtocol(w, r, p)
		return
	}
	rec := Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone()}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	rec.Body = body
	if err != nil {
		s.reject(w, &rec, http.StatusBadRequest, "invalid_request_error", "request body: "+err.Error())
		return
	}
	if len(body) > maxBody {
		s.reject(w, &rec, http.StatusRequestEntityTooLarge, "request_too_large", "request exceeds the maximum allowed size")
		return
	}
	if status, typ, msg := s.checkHTTP(r); status != 0 {
		s.reject(w, &rec, status, typ, msg)
		return
	}
	if r.URL.Path == countPath {
		s.serveCount(w, &rec, body)
		return
	}
	req, msg := parseMessages(body)
	if msg != "" {
		s.reject(w, &rec, http.StatusBadRequest, "invalid_request_error", string(msg))
		return
	}
	rec.Messages = req
	s.mu.Lock()
	turn := s.script.next(&rec)
	rec.Status = http.StatusOK
	if turn.Error != nil {
		rec.Status, rec.Error = turn.Error.Status, turn.Error.message()
	}
	s.record(rec)
	s.mu.Unlock()
	s.play(w, r, req, turn)
}

// checkHTTP checks what is not in the body: route, method, query, key,
// version and content type. It returns a zero status when all is well.
func (s *Server) checkHTTP(r *http.Request) (status int, typ, msg string) {
	if r.URL.Path != "/v1/messages" && r.URL.Path != countPath {
		return http.StatusNotFound, "not_found_error", "Not Found"
	}
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, "invalid_request_error", "Method Not Allowed"
	}
	for k, v := range r.URL.Query() {
		if k != "beta" || len(v) != 1 || v[0] != "true" {
			return http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("unexpected query parameter %q", k)
		}
	}
	if key := apiKey(r.Header); key == "" {
		return http.StatusUnauthorized, "authentication_error", "x-api-key header is required"
	} else if key != s.key {
		return http.StatusUnauthorized, "authentication_error", "invalid x-api-key"
	}
	if r.Header.Get("anthropic-version") == "" {
		return http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required"
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return http.StatusBadRequest, "invalid_request_error", "Content-Type: must be application/json"
	}
	return 0, "", ""
}

// apiKey is the key a request carries: x-api-key, else a bearer token.
func apiKey(h http.Header) string {
	if k := h.Get("x-api-key"); k != "" {
		return k
	}
	if tok, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer "); ok {
		return tok
	}
	return ""
}

func (s *Server) reject(w http.ResponseWriter, rec *Request, status int, typ, msg string) {
	rec.Status, rec.Error = status, msg
	s.mu.Lock()
	s.record(*rec)
	s.mu.Unlock()
	writeError(w, status, typ, msg)
}

// WriteError answers with the API's error shape:
// {"type":"error","error":{"type":typ,"message":msg}}.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := marshal(errorBody(typ, msg))
	w.Write(b)
}

func errorBody(typ, msg string) map[string]any {
	return map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}}
}

func (e *APIError) message() string {
	if e.Message != "" {
		return e.Message
	}
	return strings.ReplaceAll(e.Type, "_", " ")
}

func (s *Server) newID(kind string) string {
	return fmt.Sprintf("%s_%s%06d", kind, s.prefix, s.ids.Add(1))
}
