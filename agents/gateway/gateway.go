// Package gateway is the metering model gateway: a reverse proxy on the
// host for model APIs (Anthropic's Messages API, OpenAI's Responses and
// Chat Completions, Google's Gemini generateContent; see protocol.go)
// that every model call of a sandboxed agent goes through. It swaps the
// execution's token for the provider's real API key, passes streams
// through unbuffered, meters tokens and dollars from the bytes the
// provider returned, asks the execution's Budget before each call and
// bounds its worst case so that spend never passes a dollar limit
// (lowering the protocol's output cap, refusing a call that cannot fit;
// see bound.go), adds a wrap-up instruction to the call that could pass 90%,
// can hold a call at a limit until a top-up (Execution.Hold), and reports
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
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
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
	// Upstream is Anthropic's base URL, e.g. https://api.anthropic.com;
	// empty (with no APIKey and Prices) when the gateway serves no
	// Anthropic calls, or when Providers has its entry.
	Upstream string
	// APIKey is the real key, sent upstream as x-api-key. It never leaves
	// the host.
	APIKey string
	// Prices prices every call; a request for a model it cannot price is
	// refused.
	Prices *Prices
	// Providers are the other providers served, by name (ProviderOpenAI,
	// ProviderGemini; ProviderAnthropic when Upstream is empty). A call
	// in the protocol of a provider not configured is answered 404.
	Providers map[string]Provider
	// Unpriced says what to do with a call for a model the price table
	// prices only through a family's entry or the default one:
	// UnpricedFallback (or "") forwards it at that price, with a warning
	// event once per execution and a log line; UnpricedRefuse refuses it.
	Unpriced string
	// Log, if set, gets a line for each model priced by a fallback.
	Log *slog.Logger
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
	// MinOutput is the least answer, in output tokens, a call must be
	// able to pay for under a dollar limit to be forwarded; 0 means
	// DefaultMinOutput.
	MinOutput int64
	// InputMargin is added to the bound of every call's input tokens for
	// what the provider adds to a request; 0 means DefaultInputMargin.
	InputMargin int64
	// CountTimeout bounds asking the provider to count a call's input
	// tokens (see count.go); 0 means DefaultCountTimeout, a negative
	// value never counts (the byte bound stays).
	CountTimeout time.Duration
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
	// Hold, if set, is called when a call is refused for dollars (a
	// dollar limit reached, or the call's worst case not fitting in what
	// is left), instead of refusing it at once: it blocks until the limit
	// was raised (true: the call is bounded again and goes on) or will
	// not be (false: refused as at any limit). ctx ends when the agent
	// hangs up or the gateway drains (the call is then answered with a
	// retryable 529). The call keeps the execution's one slot meanwhile.
	Hold func(ctx context.Context, d Decision) bool
	// Answered, if set, is called once for each forwarded call, while
	// the call holds the execution's slot (so calls reach it one at a
	// time, in order): when the upstream's answer arrives, before any of
	// it goes on to the agent, so the agent, waiting for it, has done
	// nothing with it yet; or, for a call the upstream never answered,
	// when it finishes. What it returns is the finish record's Snapshot.
	// It cannot fail the call: the call is metered whatever it does.
	Answered func() string
}

// Gateway is the metering proxy, an http.Handler. It is safe for
// concurrent use; it starts no goroutines of its own but the one Drain
// waits with and one for each call held for a top-up.
type Gateway struct {
	cfg   Config
	provs map[string]*provider
	proxy *httputil.ReverseProxy

	mu       sync.RWMutex
	execs    map[string]*execution // by token
	draining bool                  // Drain was called: new requests are refused
	drained  chan struct{}         // closed by Drain: held calls let go
	inflight sync.WaitGroup        // requests being served; Add only while !draining
}

// execution is a registered Execution and its gateway-side state.
type execution struct {
	Execution
	// slot holds one token while a model call is in flight: calls of one
	// execution run one at a time, so each is bounded by what the last
	// one left.
	slot chan struct{}

	mu     sync.Mutex
	warned map[string]bool // limits a warn event was written for, and "price:"+model for fallback prices
	seen   map[string]bool // message ids already metered
	// priceWarnings counts the models warned of as priced by a fallback.
	priceWarnings int
	counts        []counted // the last calls' bodies and counted input, newest last

	requests int           // requests being served, under mu
	revoked  bool          // by Revoke: no more requests are taken
	idle     chan struct{} // closed when requests drop to 0 after Revoke
}

// begin counts a request of the execution in, unless it was revoked.
func (ex *execution) begin() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.revoked {
		return false
	}
	ex.requests++
	return true
}

// end counts a request out.
func (ex *execution) end() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.requests--
	if ex.requests == 0 && ex.idle != nil {
		close(ex.idle)
		ex.idle = nil
	}
}

// recent returns the last calls' counted bodies.
func (ex *execution) recent() []counted {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.counts
}

// counted keeps a finished call's body and the input tokens counted for it.
func (ex *execution) counted(body []byte, tokens int64) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.counts = append(ex.counts, counted{body, tokens})
	if len(ex.counts) > recentBodies {
		ex.counts = append([]counted(nil), ex.counts[len(ex.counts)-recentBodies:]...)
	}
}

// New makes a Gateway from cfg.
func New(cfg Config) (*Gateway, error) {
	all := map[string]Provider{}
	for name, p := range cfg.Providers {
		switch name {
		case ProviderAnthropic, ProviderOpenAI, ProviderGemini:
		default:
			return nil, fmt.Errorf("gateway: unknown provider %q (want %s, %s or %s)", name, ProviderAnthropic, ProviderOpenAI, ProviderGemini)
		}
		all[name] = p
	}
	if cfg.Upstream != "" || cfg.APIKey != "" || cfg.Prices != nil {
		if _, ok := all[ProviderAnthropic]; ok {
			return nil, errors.New("gateway: Anthropic is configured twice (Upstream and Providers)")
		}
		all[ProviderAnthropic] = Provider{Upstream: cfg.Upstream, APIKey: cfg.APIKey, Prices: cfg.Prices}
	}
	if len(all) == 0 {
		return nil, errors.New("gateway: no provider configured")
	}
	provs := map[string]*provider{}
	for name, p := range all {
		u, err := url.Parse(p.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("gateway: %s upstream %q is not an http(s) URL", name, p.Upstream)
		}
		if p.APIKey == "" {
			return nil, fmt.Errorf("gateway: no API key for %s", name)
		}
		if p.Prices == nil {
			return nil, fmt.Errorf("gateway: no price table for %s", name)
		}
		provs[name] = &provider{name: name, upstream: u, key: p.APIKey, prices: p.Prices}
	}
	if err := checkUnpriced(cfg.Unpriced); err != nil {
		return nil, err
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
	if cfg.MinOutput == 0 {
		cfg.MinOutput = DefaultMinOutput
	}
	if cfg.InputMargin == 0 {
		cfg.InputMargin = DefaultInputMargin
	}
	if cfg.CountTimeout == 0 {
		cfg.CountTimeout = DefaultCountTimeout
	}
	g := &Gateway{cfg: cfg, provs: provs, execs: map[string]*execution{}, drained: make(chan struct{})}
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

// Revoke unregisters a token, then waits until ctx ends for its requests
// in flight to finish, so that every event they write is in the stream
// before whatever the caller writes next (an execution's final status).
// It returns an error wrapping ctx's if some did not finish in time.
func (g *Gateway) Revoke(ctx context.Context, token string) error {
	g.mu.Lock()
	ex := g.execs[token]
	delete(g.execs, token)
	g.mu.Unlock()
	if ex == nil {
		return nil
	}
	ex.mu.Lock()
	ex.revoked = true
	if ex.requests == 0 {
		ex.mu.Unlock()
		return nil
	}
	idle := make(chan struct{}) // the token is out of the map: one Revoke per execution
	ex.idle = idle
	n := ex.requests
	ex.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gateway: %d request(s) of execution %s still in flight: %w", n, ex.ID, ctx.Err())
	}
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

// byToken finds the execution whose token a request carries, in
// whichever header its CLI sends a key in: x-api-key (Anthropic),
// Authorization: Bearer (Anthropic's auth token, OpenAI) or
// x-goog-api-key (Gemini). Never from the URL: a key there ends up in
// logs.
func (g *Gateway) byToken(h http.Header) *execution {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, token := range []string{h.Get("x-api-key"), trimBearer(h.Get("Authorization")), h.Get("x-goog-api-key")} {
		if ex := g.execs[token]; token != "" && ex != nil {
			return ex
		}
	}
	return nil
}

// ServeHTTP serves the model calls of every configured provider's
// protocol (see route: POST /v1/messages, /v1/responses,
// /v1/chat/completions, /v1beta/models/{model}:generateContent and
// :streamGenerateContent; metered, budgeted) and their token counting
// (free: forwarded only); any other path is answered 404, as the APIs
// do, without reaching a provider. Every answer the gateway writes itself
// has the protocol's own error shape.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pr, metered, known := route(r)
	if pr != nil {
		w = &protoWriter{ResponseWriter: w, p: pr}
	}
	if !g.enter() {
		refuseDraining(w)
		return
	}
	defer g.inflight.Done()
	if !known {
		writeAPIError(w, http.StatusNotFound, "not_found_error", "Not Found")
		return
	}
	prov := g.provs[pr.provider()]
	if prov == nil {
		writeAPIError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("model gateway: no %s provider is configured (see [providers.%s] in the daemon's config)", pr.provider(), pr.provider()))
		return
	}
	ex := g.lookup(r)
	if ex == nil || !ex.begin() {
		writeAPIError(w, http.StatusUnauthorized, "authentication_error", "invalid API key: not a token of a running execution")
		return
	}
	defer ex.end()
	r = r.WithContext(context.WithValue(r.Context(), providerKey{}, prov))
	if !metered {
		g.proxy.ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodPost {
		writeAPIError(w, http.StatusMethodNotAllowed, "invalid_request_error", "Method Not Allowed")
		return
	}
	g.serveCall(w, r, ex, pr, prov)
}

type providerKey struct{}

// serveCall runs one model call: admit it, ask the budget, bound its
// worst case, forward it and meter the answer.
func (g *Gateway) serveCall(w http.ResponseWriter, r *http.Request, ex *execution, pr protocol, prov *provider) {
	body, model, price, ok := g.admit(w, r, ex, pr, prov)
	if !ok {
		return
	}
	if body, ok = g.prepare(w, body, pr); !ok {
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
	c := &call{g: g, ex: ex, pr: pr, prov: prov, ctx: r.Context(), model: model, price: price, start: time.Now(), id: "call_" + rand.Text()[:16], raw: body}
	defer c.finish(errNoResponse) // if nothing else finished it
	var count func() (int64, bool)
	if _, ok := pr.(anthropicProto); ok { // the count_tokens endpoint is Anthropic's
		count = g.counter(r.Context(), r, prov, ex, model, body)
	}
	var p plan
	for {
		p = g.plan(ex, pr, body, price, count)
		if p.bad != nil {
			pr.writeError(w, http.StatusBadRequest, "invalid_request_error", strings.TrimPrefix(p.bad.Error(), errBadRequest.Error()+": "))
			c.abandon()
			return
		}
		if p.d.Level != Deny {
			break
		}
		g.warn(ex, p.d) // the warning always comes before the stop
		if !p.dollars || ex.Hold == nil {
			g.refuse(w, ex, p.d, p.note)
			c.abandon()
			return
		}
		switch g.hold(r.Context(), ex, p.d) {
		case heldRaised:
			continue // topped up: planned again, with the new limit
		case heldDrained:
			refuseDraining(w)
			c.abandon()
			return
		}
		g.refuse(w, ex, p.d, p.note)
		c.abandon()
		return
	}
	if p.d.Level == Warn {
		g.warn(ex, p.d)
	}
	c.inBound, c.inSource = p.inBound, p.inSource
	if err := g.record(ex, ModelCallPayload{Phase: PhaseStart, Call: c.id, Model: model, MaxUSD: p.worst, InputBound: p.inBound, InputBoundSource: p.inSource}); err != nil {
		g.emit(ex, stream.Error, errorPayload{Message: "a model call was refused: its start could not be recorded: " + err.Error(), Model: model})
		w.Header().Set("Retry-After", strconv.Itoa(DrainRetryAfter))
		w.Header().Set("x-should-retry", "true")
		writeAPIError(w, 529, "overloaded_error", "model gateway: the call could not be recorded; retry shortly")
		c.abandon()
		return
	}
	c.maxOut = p.maxOut
	r = r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	r.Body = io.NopCloser(bytes.NewReader(p.body))
	r.ContentLength = int64(len(p.body))
	g.proxy.ServeHTTP(w, r)
}

// plan is what the gateway does with one call.
type plan struct {
	d       Decision // Deny: refused (or held); Warn: it carries the wrap-up
	dollars bool     // the denial is about dollars: a top-up lifts it
	note    string   // why a call refused for dollars is, beyond the figures
	bad     error    // a request that cannot be bounded: answered 400
	body    []byte   // the body to forward
	worst   float64  // the most it can cost, in dollars
	// inBound bounds the input tokens (wrap-up included), from inSource
	// (BoundBytes, BoundPrefix or BoundCounted).
	inBound  int64
	inSource string
	maxOut   int64 // the output cap it carries; 0 if none
	// constrained says the input bound changed what is done with the
	// call: refused for dollars, the output cap lowered, or warned at
	// 90% for want of room below it. A lower bound could change it back.
	constrained bool
}

// plan asks the budget about a call and bounds its worst case (see
// bound.go): the body to forward has a max_tokens the dollars left can
// pay, and carries the wrap-up instruction when the call could take
// spend past 90% of a limit. count, if not nil, asks the provider for
// the body's input tokens (count.go); it is called only when the byte
// bound is all there is and it decides the call.
func (g *Gateway) plan(ex *execution, pr protocol, body []byte, price Price, count func() (int64, bool)) plan {
	price = price.dearest() // a long prompt's rates, if dearer: the prompt's length is not known yet
	d := ex.Budget.Check()
	if d.Level == Deny {
		return plan{d: d, dollars: dollarsOnly(d)}
	}
	use, limited := ex.Budget.Remaining()
	if !limited {
		in := int64(len(body)) + g.cfg.InputMargin
		asked, _ := pr.maxOutput(body)
		p := plan{d: d, body: body, worst: worstCost(in, asked, price), inBound: in, inSource: BoundBytes, maxOut: asked}
		if d.Level == Warn {
			p.body = g.wrapUp(pr, body)
		}
		return p
	}
	// The wrap-up text may be added: its bytes are bounded too.
	extra := int64(len(g.cfg.WrapUp)) + 64
	in, uncounted := inputBoundOf(body, ex.recent(), g.cfg.InputMargin)
	src := BoundPrefix
	if uncounted == int64(len(body)) {
		src = BoundBytes
	}
	p := g.bound(d, use, pr, body, price, in+extra)
	if p.constrained && uncounted >= CountMinBytes && count != nil {
		// What is forwarded is what was counted: the body with each
		// top-level key once, as countBody sent it.
		if n, ok := count(); ok && countedBound(n, g.cfg.InputMargin) < in {
			if one, err := normalize(body); err == nil {
				body, in, src = one, countedBound(n, g.cfg.InputMargin), BoundCounted
				p = g.bound(d, use, pr, body, price, in+extra)
			}
		}
	}
	p.inBound, p.inSource = in+extra, src
	return p
}

// bound plans a call under the dollar limit use (the tightest, with what
// is left of it) given in, the bound on its input tokens.
func (g *Gateway) bound(d Decision, use LimitUse, pr protocol, body []byte, price Price, in int64) plan {
	d.Limits = slices.Clip(d.Limits) // planned twice when counted: each plan appends to its own
	room := use.Max - use.Used
	out := fit(room, in, price)
	if out < g.cfg.MinOutput {
		use.Level = Deny
		return plan{d: Decide(append(d.Limits, use)...), dollars: true, constrained: true, note: fmt.Sprintf(
			"the next call could cost up to %s (%d input tokens at most, at %s per million, and at least %d output tokens), more than the %s left",
			fmtAmount("usd", worstCost(in, g.cfg.MinOutput, price)), in, fmtAmount("usd", price.inputPrice()), g.cfg.MinOutput, fmtAmount("usd", room))}
	}
	asked, ok := pr.maxOutput(body)
	if !ok {
		asked = math.MaxInt64 // the provider's default cap: as much as it allows
	}
	constrained := out < asked
	// While a fair answer fits below the 90% mark, the call is bounded
	// there and goes unwarned; the call that cannot is the last that can
	// still be told to wrap up, and may use what is left to 100%.
	if !hasLimit(d, use.Limit) {
		below := fit(WarnAt*use.Max-use.Used, in, price)
		if below >= min(max(asked, 1), FairAnswer) {
			out = min(out, below)
			constrained = constrained || below < asked
		} else {
			use.Level = Warn
			d = Decide(append(d.Limits, use)...)
			constrained = true
		}
	}
	fwd, maxTokens, err := pr.capOutput(body, out)
	if err != nil {
		return plan{bad: err}
	}
	if !ok && out >= MaxAnswerTokens {
		// The dollars pay for more than any model writes in one answer:
		// a cap would bind nothing, and a provider may refuse one above
		// the model's own maximum. The body goes without (capOutput
		// still checked it), bounded at MaxAnswerTokens.
		fwd, maxTokens = body, MaxAnswerTokens
	}
	p := plan{d: d, body: fwd, worst: worstCost(in, maxTokens, price), maxOut: maxTokens, constrained: constrained}
	if p.d.Level == Warn {
		p.body = g.wrapUp(pr, fwd)
	}
	return p
}

// wrapUp adds the wrap-up instruction to body, in the protocol's own
// message format; a body it cannot be added to goes as it is (the
// provider refuses a malformed one).
func (g *Gateway) wrapUp(pr protocol, body []byte) []byte {
	if b, err := pr.wrapUp(body, g.cfg.WrapUp); err == nil {
		return b
	}
	return body
}

// prepare makes sure a call's answer can be metered (protocol.prepare);
// a body it cannot rewrite is answered 400.
func (g *Gateway) prepare(w http.ResponseWriter, body []byte, pr protocol) ([]byte, bool) {
	b, err := pr.prepare(body)
	if err != nil {
		writeAPIError(w, http.StatusBadRequest, "invalid_request_error", strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
		return nil, false
	}
	return b, true
}

func hasLimit(d Decision, limit string) bool {
	for _, u := range d.Limits {
		if u.Limit == limit {
			return true
		}
	}
	return false
}

// dollarsOnly says whether every limit d denies is a dollar limit, so
// that raising it lets the call go on.
func dollarsOnly(d Decision) bool {
	for _, u := range d.Limits {
		if u.Level == Deny && (u.Reason != "" || u.Limit == "turns" || u.Limit == "wall_time") {
			return false
		}
	}
	return true
}

type holdResult int

const (
	heldRefused holdResult = iota // not raised: refuse
	heldRaised                    // topped up: plan again
	heldDrained                   // the gateway drains: the agent retries later
)

// hold asks the execution's Hold to wait for a top-up, until the agent
// hangs up or the gateway drains.
func (g *Gateway) hold(ctx context.Context, ex *execution, d Decision) holdResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.mu.RLock()
	drained := g.drained
	g.mu.RUnlock()
	go func() {
		select {
		case <-drained:
			cancel()
		case <-ctx.Done():
		}
	}()
	if ex.Hold(ctx, d) {
		return heldRaised
	}
	select {
	case <-drained:
		return heldDrained
	default:
		return heldRefused
	}
}

// admit reads the body and checks what can be checked before a call: the
// body is JSON naming a model, the execution may use that model, and the
// price table prices it. It answers the request itself when not ok.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, ex *execution, pr protocol, prov *provider) (body []byte, model string, price Price, ok bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBody))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeAPIError(w, http.StatusRequestEntityTooLarge, "request_too_large", "request exceeds the maximum allowed size")
		return nil, "", Price{}, false
	case err != nil:
		return nil, "", Price{}, false // the agent went away mid-request
	}
	model, ok = pr.model(r, body)
	if !ok {
		writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "request body: must be a JSON object with a model")
		return nil, "", Price{}, false
	}
	if !ex.allows(model) {
		g.refuseModel(w, ex, model, fmt.Sprintf("model %q is not allowed for this execution (allowed: %s)", model, strings.Join(ex.Models, ", ")))
		return nil, "", Price{}, false
	}
	if price, ok = g.priceOf(w, ex, prov, model); !ok {
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
// invalid_request_error, which the Anthropic SDKs do not retry, and which
// is what the API itself answers when an account's credit balance is too
// low; 429 and 529 would be retried for minutes. x-should-retry: false
// says the same to clients that read it. Claude Code 2.1.197 did not
// retry it; 2.1.332 sends a 400 it does not recognise five more times
// within a second, whatever the header, and each is refused again.
func (g *Gateway) refuse(w http.ResponseWriter, ex *execution, d Decision, note string) {
	var limits, reasons []string
	for _, u := range d.Limits {
		switch {
		case u.Level != Deny:
		case u.Reason != "":
			reasons = append(reasons, u.Reason)
		default:
			g.emit(ex, stream.Budget, budgetPayload(u))
			reached := "reached"
			if u.Used < u.Max {
				reached = "nearly reached"
			}
			limits = append(limits, fmt.Sprintf("%s limit %s (%s of %s used)", u.Limit, reached, fmtAmount(u.Limit, u.Used), fmtAmount(u.Limit, u.Max)))
		}
	}
	msg := strings.Join(reasons, "; ")
	if len(limits) > 0 {
		msg = strings.Join(append([]string{"Budget exceeded: " + strings.Join(limits, "; ")}, reasons...), "; ")
	}
	if note != "" {
		msg += ": " + note
	}
	w.Header().Set("x-should-retry", "false")
	writeAPIError(w, http.StatusBadRequest, "invalid_request_error", msg+". Model calls are refused for this execution.")
}

// warn writes a warn event for each limit of d newly at 90% (or past
// it); a denied limit never warned gets its warn event first, so the
// stream always says "warn" before it says "exceeded".
func (g *Gateway) warn(ex *execution, d Decision) {
	for _, u := range d.Limits {
		if u.Reason != "" {
			continue
		}
		u.Level = Warn
		// Keyed by the limit and its figure: a limit raised by a top-up
		// warns again as it nears its new end.
		key := fmt.Sprintf("%s %g", u.Limit, u.Max)
		ex.mu.Lock()
		first := !ex.warned[key]
		ex.warned[key] = true
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
	if !g.draining {
		close(g.drained)
	}
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
//
// Every header a key can travel in is dropped, whichever the agent
// used, and the provider's own is set: x-api-key (Anthropic),
// Authorization: Bearer (OpenAI), x-goog-api-key (Gemini); a key in the
// URL (?key=) is dropped too.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	prov, _ := pr.In.Context().Value(providerKey{}).(*provider)
	pr.SetURL(prov.upstream)
	stripKey(pr.Out.URL)
	h := pr.Out.Header
	h.Del("Authorization")
	h.Del("X-Api-Key")
	h.Del("X-Goog-Api-Key")
	h.Del("Accept-Encoding")
	switch prov.name {
	case ProviderOpenAI:
		h.Set("Authorization", "Bearer "+prov.key)
	case ProviderGemini:
		h.Set("X-Goog-Api-Key", prov.key)
	default:
		h.Set("X-Api-Key", prov.key)
	}
}

// writeAPIError answers with the error shape of the request's protocol
// (see protoWriter), Anthropic's when it has none.
func writeAPIError(w http.ResponseWriter, status int, typ, msg string) {
	var pr protocol = anthropicProto{}
	if pw, ok := w.(*protoWriter); ok {
		pr = pw.p
	}
	pr.writeError(w, status, typ, msg)
}
