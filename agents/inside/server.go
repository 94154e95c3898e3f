package inside

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/agents/channel"
)

// version is the server's version in the MCP handshake.
const version = "1"

// maxBody bounds a request's body.
const maxBody = 4 << 20

// Execution is what the server knows of a registered execution.
type Execution struct {
	ID      string
	Session string
	// Token, if set, is the token to admit: an execution re-attached after
	// a daemon restart keeps the one its agent holds. Empty: a new one.
	Token string
	// Channel is the only channel (see package channel) the token is
	// admitted on: that of the execution's machine. An execution without
	// one is never admitted.
	Channel string
	// Deadline is when its wall time runs out (zero: no limit); a tool
	// that waits never waits past it.
	Deadline time.Time
}

// Server is the MCP server, an http.Handler (serve it at /mcp). It is
// safe for concurrent use.
type Server struct {
	p   Platform
	mcp http.Handler

	mu    sync.RWMutex
	execs map[string]*registered // by token
}

// registered is a registered execution; done ends with its
// registration, and with it every tool call of the execution in flight.
type registered struct {
	Execution
	done     context.Context
	end      context.CancelFunc
	inFlight atomic.Int32 // its tool calls now
}

// MaxInFlight bounds the tool calls of one execution in flight at once.
// A wait holds its call for up to an hour, and with it a goroutine, a
// connection and, for wait_for_files, a subscription to the workspace's
// events that every change of the session is copied to; an agent that
// started waits in a loop would hold ever more. Parallel waits for a
// few children or files stay far below.
const MaxInFlight = 32

// New returns a server whose tools act through p.
func New(p Platform) *Server {
	s := &Server{p: p, execs: map[string]*registered{}}
	ms := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "hearth", Title: "Hearth", Version: version}, &mcpsdk.ServerOptions{
		Instructions: instructions,
		Capabilities: &mcpsdk.ServerCapabilities{},
	})
	s.addTools(ms)
	// Stateless: each request stands alone and carries its token, so a
	// daemon restart loses no MCP session of a re-attached agent.
	// A request body is at most 4 MiB: a task's prompt (at most 1 MiB)
	// and its arguments fit.
	s.mcp = mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return ms }, &mcpsdk.StreamableHTTPOptions{
		Stateless: true, MaxRequestBodyBytes: maxBody, PropagateRequestCancellation: true,
	})
	return s
}

const instructions = `You run inside Hearth, which runs AI agents each in its own isolated machine and session.
Call list_agents to see who you can hand work to, delegate_task to give one a task (wait=false starts it at once,
so several can work in parallel; wait_execution then waits for each), and read what a child wrote under
/workspace/agents/<its session>/outputs/. claim_path before you take a piece of shared work, release_path when done.`

// Register admits e's token (a new one if e.Token is empty) on e's
// channel, and returns it.
func (s *Server) Register(e Execution) (token string) {
	token = e.Token
	if token == "" {
		token = "hearth-" + rand.Text()
	}
	done, end := context.WithCancel(context.Background())
	s.mu.Lock()
	if old := s.execs[token]; old != nil {
		old.end()
	}
	s.execs[token] = &registered{Execution: e, done: done, end: end}
	s.mu.Unlock()
	return token
}

// Unregister revokes a token; later requests with it get 401, and its
// tool calls in flight (a wait) end. Unregistering an unknown token does
// nothing.
func (s *Server) Unregister(token string) {
	s.mu.Lock()
	if r := s.execs[token]; r != nil {
		r.end()
		delete(s.execs, token)
	}
	s.mu.Unlock()
}

// ServeHTTP admits a request with the bearer token of a registered
// execution that came through that execution's channel, and serves MCP
// to it; anything else gets the same 401.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.admit(r.Header, channel.Of(r.Context())); !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		http.Error(w, "not a token of a running execution", http.StatusUnauthorized)
		return
	}
	s.mcp.ServeHTTP(w, r)
}

// admit finds the execution whose token h carries, if it may come
// through channel ch.
func (s *Server) admit(h http.Header, ch string) (Execution, bool) {
	token, ok := bearer(h)
	if !ok {
		return Execution{}, false
	}
	s.mu.RLock()
	r, ok := s.execs[token]
	s.mu.RUnlock()
	// Channels are compared in constant time too, though they are not
	// secret: the check is one expression either way.
	if !ok || r.Channel == "" || subtle.ConstantTimeCompare([]byte(r.Channel), []byte(ch)) != 1 {
		return Execution{}, false
	}
	return r.Execution, true
}

// bearer is the token of an Authorization: Bearer header.
func bearer(h http.Header) (string, bool) {
	v := h.Values("Authorization")
	if len(v) != 1 {
		return "", false
	}
	scheme, token, ok := strings.Cut(v[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t") {
		return "", false
	}
	return token, true
}
