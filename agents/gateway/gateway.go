// Package gateway is the metering model gateway: an Anthropic Messages API
// reverse proxy on the host that every model call of a sandboxed agent
// goes through. It swaps the execution's token for the real API key,
// passes streams through unbuffered, meters tokens and dollars from the
// bytes the provider returned, asks the execution's Budget before each
// call (adding a wrap-up instruction at 90%, refusing at 100%) and reports
// model_call and budget events. A token is admitted only through the
// channel of the machine it was issued to (package channel); each
// call's start and finish can be recorded durably (Config.Record) so that
// calls a dead daemon left in flight are settled at the next start; and
// Drain lets the calls in flight finish before a daemon stops. Importers:
// agents and appliance.
package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"hearth/agents/channel"
	"hearth/agents/stream"
)

// DefaultWrapUp is the instruction added to requests once a limit is at
// 90%.
const DefaultWrapUp = "Budget nearly used up: stop starting new work, write your results to outputs/ now and finish."

// DefaultMaxBody bounds a request body, as the API's own 32 MB limit does.
const DefaultMaxBody = 32 << 20

// Config is what a Gateway needs.
type Config struct {
	// Upstream is the provider's base URL, e.g. https://api.anthropic.com.
	Upstream string
	// APIKey is the real key, sent upstream as x-api-key. It never leaves
	// the host.
	APIKey string
	// Prices prices every call; a request for a model it cannot price is
	// refused.
	Prices *Prices
	// OnEvent receives model_call, budget and error events. It is called
	// from request goroutines, possibly concurrently, and should not block.
	OnEvent func(stream.Event)
	// Record, if set, stores model_call records durably (see
	// ModelCallPayload): a call whose start cannot be recorded is refused
	// with a retryable 529, so none is served unrecorded. Those records
	// then do not go to OnEvent, unless a finish cannot be recorded (it
	// was served: OnEvent gets it, and an error event says so).
	Record func(stream.Event) error
	// WrapUp is the instruction added at 90%; empty means DefaultWrapUp.
	WrapUp string
	// Transport reaches the upstream; nil means a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// MaxBody bounds request bodies; 0 means DefaultMaxBody.
	MaxBody int64
}

// Execution is what the gateway knows about the execution behind a token.
type Execution struct {
	Session string
	ID      string
	// Models, if not empty, are the model patterns (as in a price table)
	// the execution may call.
	Models []string
	// Budget is asked before and charged after every call; nil means no
	// limit.
	Budget Budget
	// Token, if set, is the token to admit: an execution re-attached after
	// a daemon restart keeps the one its agent holds. Empty: a new one.
	Token string
	// Channel, if set, is the only channel (see package channel) the token is
	// admitted on: that of the execution's machine.
	Channel string
}

// Gateway is the metering proxy, an http.Handler. It is safe for
// concurrent use; it starts no goroutines of its own but the one Drain
// waits with.
type Gateway struct {
	cfg      Config
	upstream *url.URL
	proxy    *httputil.ReverseProxy

	mu       sync.RWMutex
	execs    map[string]*execution // by token
	draining bool                  // Drain was called: new requests are refused
	inflight sync.WaitGroup        // requests being served; Add only while !draining
}

// execution is a registered Execution and its gateway-side state.
type execution struct {
	Execution
	// slot holds one token while a model call is in flight: calls of one
	// execution run one at a time, so spend can pass a limit by at most
	// the one call in flight when it was reached.
	slot chan struct{}

	mu     sync.Mutex
	warned map[string]bool // limits a warn event was written for
	seen   map[string]bool // message ids already metered
}

// New makes a Gateway from cfg.
func New(cfg Config) (*Gateway, error) {
	u, err := url.Parse(cfg.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("gateway: upstream %q is not an http(s) URL", cfg.Upstream)
	}
	if cfg.APIKey == "" {
		return nil, errors.New("gateway: no API key")
	}
	if cfg.Prices == nil {
		return nil, errors.New("gateway: no price table")
	}
	if cfg.WrapUp == "" {
		cfg.WrapUp = DefaultWrapUp
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64 // many executions share one provider host
		cfg.Transport = t
	}
	g := &Gateway{cfg: cfg, upstream: u, execs: map[string]*execution{}}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      cfg.Transport,
		FlushInterval:  -1, // every chunk reaches the agent as it arrives
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.upstreamError,
		ErrorLog:       log.New(io.Discard, "", 0), // failures become events
	}
	return g, nil
}

// Register admits an execution and returns its token, which the sandbox
// sends as its API key.
func (g *Gateway) Register(e Execution) (token string) {
	if e.Budget == nil {
		e.Budget = unlimited{}
	}
	token = e.Token
	if token == "" {
		token = "hearth-" + rand.Text()
	}
	ex := &execution{Execution: e, slot: make(chan struct{}, 1), warned: map[string]bool{}, seen: map[string]bool{}}
	g.mu.Lock()
	g.execs[token] = ex
	g.mu.Unlock()
	return token
}

// Unregister revokes a token; later requests with it get 401. A call in
// flight finishes and is metered. Unregistering an unknown token does
// nothing.
func (g *Gateway) Unregister(token string) {
	g.mu.Lock()
	delete(g.execs, token)
	g.mu.Unlock()
}

// lookup finds the execution whose token r carries, admitted on the
// channel r came through.
func (g *Gateway) lookup(r *http.Request) *execution {
	ex := g.byToken(r.Header)
	if ex == nil || ex.Channel == "" {
		return ex
	}
	if ch := channel.Of(r.Context()); ch != ex.Channel {
		g.emit(ex, stream.Error, errorPayload{Message: fmt.Sprintf(
			"a model call with this execution's gateway token came through another channel (%q) and was refused: the token may have leaked", ch)})
		return nil
	}
	return ex
}

func (g *Gateway) byToken(h http.Header) *execution {
	token := h.Get("x-api-key")
	if token == "" {
		token, _ = strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	}
	if token == "" {
		return nil
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.execs[token]
}

// ServeHTTP serves POST /v1/messages (metered, budgeted) and
// /v1/messages/count_tokens (free: forwarded only); any other path is
// answered 404, as the API does, without reaching the provider.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.enter() {
		refuseDraining(w)
		return
	}
	defer g.inflight.Done()
	metered := r.URL.Path == "/v1/messages"
	if !metered && r.URL.Path != "/v1/messages/count_tokens" {
		writeAPIError(w, http.StatusNotFound, "not_found_error", "Not Found")
		return
	}
	ex := g.lookup(r)
	if ex == nil {
		writeAPIError(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key: not a token of a running execution")
		return
	}
	if !metered {
		g.proxy.ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodPost {
		writeAPIError(w, http.StatusMethodNotAllowed, "invalid_request_error", "Method Not Allowed")
		return
	}
	g.serveMessages(w, r, ex)
}

// serveMessages runs one model call: admit it, ask the budget, forward it
// and meter the answer.
func (g *Gateway) serveMessages(w http.ResponseWriter, r *http.Request, ex *execution) {
	body, model, price, ok := g.admit(w, r, ex)
	if !ok {
		return
	}
	select {
	case ex.slot <- struct{}{}:
	case <-r.Context().Done():
		return // the agent gave up waiting
	}
	if g.isDraining() { // it waited for a call that the drain let finish
		<-ex.slot
		refuseDraining(w)
		return
	}
	c := &call{g: g, ex: ex, ctx: r.Context(), model: model, price: price, start: time.Now(), id: "call_" + rand.Text()[:16]}
	defer c.finish(errNoResponse) // if nothing else finished it
	d := ex.Budget.Check()
	if d.Level == Deny {
		g.refuse(w, ex, d)
		c.abandon()
		return
	}
	if d.Level == Warn {
		g.warn(ex, d)
		if b, err := injectWrapUp(body, g.cfg.WrapUp); err == nil {
			body = b
		}
	}
	maxUSD := price.Cost(Usage{InputTokens: int64(len(body)+3) / 4, OutputTokens: peekMaxTokens(body)})
	if err := g.record(ex, ModelCallPayload{Phase: PhaseStart, Call: c.id, Model: model, MaxUSD: maxUSD}); err != nil {
		g.emit(ex, stream.Error, errorPayload{Message: "a model call was refused: its start could not be recorded: " + err.Error(), Model: model})
		w.Header().Set("Retry-After", strconv.Itoa(DrainRetryAfter))
		w.Header().Set("x-should-retry", "true")
		writeAPIError(w, 529, "overloaded_error", "model gateway: the call could not be recorded; retry shortly")
		c.abandon()
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	g.proxy.ServeHTTP(w, r)
}

// admit reads the body and checks what can be checked before a call: the
// body is JSON naming a model, the execution may use that model, and the
// price table prices it. It answers the request itself when not ok.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, ex *execution) (body []byte, model string, price Price, ok bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBody))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeAPIError(w, http.StatusRequestEntityTooLarge, "request_too_large", "request exceeds the maximum allowed size")
		return nil, "", Price{}, false
	case err != nil:
		return nil, "", Price{}, false // the agent went away mid-request
	}
	model, ok = peekModel(body)
	if !ok {
		writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "request body: must be a JSON object with a model")
		return nil, "", Price{}, false
	}
	if !ex.allows(model) {
		g.refuseModel(w, ex, model, fmt.Sprintf("model %q is not allowed for this execution (allowed: %s)", model, strings.Join(ex.Models, ", ")))
		return nil, "", Price{}, false
	}
	if price, _, ok = g.cfg.Prices.Lookup(model); !ok {
		g.refuseModel(w, ex, model, fmt.Sprintf("model %q has no price in the price table and there is no default entry; the call was refused", model))
		return nil, "", Price{}, false
	}
	return body, model, price, true
}

// refuseModel answers a call for a model the gateway will not forward,
// and says why in an error event.
func (g *Gateway) refuseModel(w http.ResponseWriter, ex *execution, model, msg string) {
	g.emit(ex, stream.Error, errorPayload{Message: msg, Model: model})
	writeAPIError(w, http.StatusBadRequest, "invalid_request_error", msg)
}

func (ex *execution) allows(model string) bool {
	if len(ex.Models) == 0 {
		return true
	}
	for _, pat := range ex.Models {
		if matchModel(pat, model) {
			return true
		}
	}
	return false
}

// refuse answers a call the budget denied. The status is 400
// invalid_request_error, which Claude Code (like the Anthropic SDKs) does
// not retry, and which is what the API itself answers when an account's
// credit balance is too low; 429 and 529 would be retried for minutes.
// x-should-retry: false says the same to clients that read it.
func (g *Gateway) refuse(w http.ResponseWriter, ex *execution, d Decision) {
	var limits, reasons []string
	for _, u := range d.Limits {
		switch {
		case u.Level != Deny:
		case u.Reason != "":
			reasons = append(reasons, u.Reason)
		default:
			g.emit(ex, stream.Budget, budgetPayload(u))
			limits = append(limits, fmt.Sprintf("%s limit reached (%s of %s used)", u.Limit, fmtAmount(u.Limit, u.Used), fmtAmount(u.Limit, u.Max)))
		}
	}
	msg := strings.Join(reasons, "; ")
	if len(limits) > 0 {
		msg = strings.Join(append([]string{"Budget exceeded: " + strings.Join(limits, "; ")}, reasons...), "; ")
	}
	w.Header().Set("x-should-retry", "false")
	writeAPIError(w, http.StatusBadRequest, "invalid_request_error", msg+". Model calls are refused for this execution.")
}

// warn writes a warn event for each limit newly at 90%.
func (g *Gateway) warn(ex *execution, d Decision) {
	for _, u := range d.Limits {
		ex.mu.Lock()
		first := !ex.warned[u.Limit]
		ex.warned[u.Limit] = true
		ex.mu.Unlock()
		if first {
			g.emit(ex, stream.Budget, budgetPayload(u))
		}
	}
}

func fmtAmount(limit string, v float64) string {
	if limit == "usd" || limit == "credits" {
		return fmt.Sprintf("$%.4f", v)
	}
	return fmt.Sprintf("%g", v)
}

// DrainRetryAfter is the Retry-After, in seconds, of the answer to a
// request refused while the gateway drains.
const DrainRetryAfter = 5

// Drain stops the gateway taking requests and waits, until ctx ends, for
// the ones in flight to finish: their answers reach the agent whole and
// are metered. A request that arrives from now on is answered 529
// overloaded_error with Retry-After and x-should-retry: true, which the
// Anthropic SDKs and Claude Code retry, so an agent whose daemon stops
// (leaving it running) retries into the next daemon's gateway rather
// than failing. Drain returns an error wrapping ctx's if they did not
// finish in time. There is no undrain: a drained gateway is one whose
// daemon is stopping.
func (g *Gateway) Drain(ctx context.Context) error {
	g.mu.Lock()
	g.draining = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.inflight.Wait(); close(done) }() // no Add after draining is set: see enter
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gateway: drain: calls still in flight: %w", ctx.Err())
	}
}

// enter counts a request in, unless the gateway drains.
func (g *Gateway) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return false
	}
	g.inflight.Add(1)
	return true
}

func (g *Gateway) isDraining() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.draining
}

// refuseDraining answers a request that came while the gateway drains,
// in the shape of the API's own overload answer, asking for a retry.
func refuseDraining(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(DrainRetryAfter))
	w.Header().Set("x-should-retry", "true")
	writeAPIError(w, 529, "overloaded_error", "model gateway: the daemon is restarting; retry shortly")
}

// rewrite aims a request at the upstream and swaps the token for the
// real key. Accept-Encoding is dropped so the transport asks for gzip
// itself and hands the meter plain bytes.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(g.upstream)
	pr.Out.Header.Del("Authorization")
	pr.Out.Header.Set("X-Api-Key", g.cfg.APIKey)
	pr.Out.Header.Del("Accept-Encoding")
}

// writeAPIError answers with the API's error shape.
func writeAPIError(w http.ResponseWriter, status int, typ, msg string) {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": apiError{Type: typ, Message: msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}
