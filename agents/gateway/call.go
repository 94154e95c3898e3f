package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"time"

	"hearth/agents/stream"
)

var (
	errNoResponse = errors.New("no response from the upstream")
	errClientGone = errors.New("the agent closed the connection before the answer ended")
)

type callKey struct{}

// call is one metered model call, from admission to the end of the answer.
type call struct {
	g     *Gateway
	ex    *execution
	pr    protocol
	prov  *provider
	ctx   context.Context // the agent's request
	model string          // as requested
	price Price           // of the requested model
	start time.Time
	id    string // shared by its start and finish records
	raw   []byte // the body as the agent sent it
	// inBound and inSource are the bound on its input tokens and where
	// it came from (see plan); with maxOut, what it is charged at when
	// its answer never reported its usage.
	inBound  int64
	inSource string
	maxOut   int64

	status int // the upstream's HTTP status; 0 until it answered
	m      meter
	once   sync.Once

	answered sync.Once // runs the execution's Answered hook once (see answer)
	snapshot string    // what Answered returned
}

// modifyResponse starts metering an upstream answer.
func (g *Gateway) modifyResponse(resp *http.Response) error {
	c, _ := resp.Request.Context().Value(callKey{}).(*call)
	if c == nil {
		return nil // count_tokens: not metered
	}
	c.status = resp.StatusCode
	c.m.p = c.pr
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode >= 400:
		c.m.kind = kindError
	case ct == "text/event-stream":
		c.m.kind = kindSSE
	default:
		c.m.kind = kindJSON
	}
	// Before any of the answer goes on: the agent, waiting for it, has
	// done nothing with it yet.
	c.answer()
	resp.Body = &meteredBody{ReadCloser: resp.Body, c: c}
	return nil
}

// upstreamError answers a call the upstream never answered.
func (g *Gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	writeAPIError(w, http.StatusBadGateway, "api_error", "model gateway: the provider could not be reached")
	if c, _ := r.Context().Value(callKey{}).(*call); c != nil {
		if c.ctx.Err() != nil {
			err = errClientGone
		}
		c.finish(err)
	}
}

// meteredBody feeds the meter every byte the agent is sent.
type meteredBody struct {
	io.ReadCloser
	c *call
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.c.m.write(p[:n])
	switch {
	case err == io.EOF:
		b.c.finish(nil)
	case err != nil && b.c.ctx.Err() != nil:
		b.c.finish(errClientGone)
	case err != nil:
		b.c.finish(err)
	}
	return n, err
}

func (b *meteredBody) Close() error {
	err := b.ReadCloser.Close()
	b.c.finish(errClientGone) // a no-op once the body was read to its end
	return err
}

// answer runs the execution's Answered hook once: when the upstream's
// answer arrives, before any of it is passed on, or, for a call the
// upstream never answered, when it finishes.
func (c *call) answer() {
	c.answered.Do(func() {
		if c.ex.Answered != nil {
			c.snapshot = c.ex.Answered()
		}
	})
}

// abandon ends a call that was never forwarded.
func (c *call) abandon() { c.once.Do(func() { <-c.ex.slot }) }

// finish meters the call once: dedupe by message id, price, charge the
// budget, write the model_call event, and let the execution's next call
// in. err is why the answer ended early, or nil.
func (c *call) finish(err error) {
	c.once.Do(func() {
		defer func() { <-c.ex.slot }()
		if err == nil {
			c.m.end()
		}
		status, msg := c.outcome(err)
		usage := c.m.usage
		if c.status >= 400 {
			usage = Usage{} // an error answer costs nothing
		}
		// A message that started but did not end was cut: it is metered
		// from what was delivered, and says so.
		cut := c.status < 400 && c.m.id != "" && !c.m.stopped
		estimated := cut && !c.m.final
		if estimated {
			usage.OutputTokens = c.m.estimatedOutput()
			msg = join(msg, fmt.Sprintf("output tokens estimated from what was delivered (%d content deltas, %d bytes)", c.m.deltas, c.m.content))
		}
		// Protocols that report usage only at the end (OpenAI, Gemini):
		// an answer without it (cut, malformed, or a stream that never
		// sent it) is charged at the call's bound, and an error event
		// says so.
		unreported := c.pr.usageRequired() && c.status > 0 && c.status < 400 && !c.m.final
		if unreported {
			usage = Usage{InputTokens: c.inBound, OutputTokens: c.maxOut}
			if c.maxOut <= 0 {
				usage.OutputTokens = c.m.estimatedOutput()
			}
			estimated = true
			note := fmt.Sprintf("the answer ended without its usage: metered at the call's bound (%d input tokens, %d output tokens)", usage.InputTokens, usage.OutputTokens)
			msg = join(msg, note)
			c.g.emit(c.ex, stream.Error, errorPayload{Message: "a model call could not be metered from the provider's bytes: " + note, Model: c.model})
		}
		dup := c.m.id != "" && c.ex.markSeen(c.m.id)
		if dup {
			usage = Usage{}
		}
		model, price := c.model, c.price
		if c.m.model != "" {
			model = c.m.model
			if p, _, ok := c.prov.prices.Lookup(model); ok {
				price = p
			}
		}
		usd, turns := price.Cost(usage), 0
		if c.m.id != "" && !dup {
			turns = 1
		}
		p := ModelCallPayload{
			Call: c.id, Model: model, MessageID: c.m.id,
			InputTokens: usage.InputTokens, OutputTokens: usage.OutputTokens,
			CacheReadTokens: usage.CacheReadTokens, CacheCreationTokens: usage.CacheCreationTokens, ReasoningTokens: usage.ReasoningTokens,
			USD: usd, LatencyMS: time.Since(c.start).Milliseconds(), InputBound: c.inBound, InputBoundSource: c.inSource,
			Status: status, Error: msg, Duplicate: dup, Cut: cut, OutputEstimated: estimated,
		}
		c.answer()
		p.Snapshot = c.snapshot
		// Recorded before it is charged: a daemon that dies in between
		// leaves a record the next start charges from (RecoverCalls),
		// never a charge without its record.
		if err := c.g.record(c.ex, p); err != nil {
			c.g.emit(c.ex, stream.Error, errorPayload{Message: "a model call's metering could not be recorded: " + err.Error(), Model: model})
			c.g.emit(c.ex, stream.ModelCall, p)
		}
		if usd > 0 || turns > 0 {
			c.ex.Budget.Charge(usd, turns)
		}
		if in := usage.InputTokens + usage.CacheReadTokens + usage.CacheCreationTokens; c.m.id != "" && !dup && in > 0 {
			c.ex.counted(c.raw, in)
		}
	})
}

// markSeen records a message id and reports whether it was seen before.
func (ex *execution) markSeen(id string) bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.seen[id] {
		return true
	}
	ex.seen[id] = true
	return false
}

// outcome is the status the model_call event reports, and why it is not
// a clean answer. A broken answer reports 502 (or the status matching a
// mid-stream error event); a vanished agent 499, as nginx logs it.
func (c *call) outcome(err error) (status int, msg string) {
	m := &c.m
	switch {
	case m.errType != "":
		return statusOf(m.errType, c.status), m.errType + ": " + m.errMsg
	case errors.Is(err, errClientGone) && c.status > 0 && c.status < 400 && m.stopped && (m.final || !c.pr.usageRequired()):
		// The message had ended, with its usage, before the agent let go
		// (Codex closes a stream at response.completed): it lost nothing.
		return c.status, m.problem
	case errors.Is(err, errClientGone):
		return 499, err.Error()
	case c.status == 0:
		return http.StatusBadGateway, "upstream: " + errOr(err, errNoResponse).Error()
	case err != nil:
		return http.StatusBadGateway, "upstream answer broke: " + err.Error()
	case c.status >= 400:
		return c.status, join("upstream error without an error object", m.problem)
	case !m.stopped:
		return http.StatusBadGateway, join("upstream answer ended before the message did", m.problem)
	}
	return c.status, m.problem
}

func join(msg, detail string) string {
	if detail == "" || msg == "" {
		return msg + detail
	}
	return msg + ": " + detail
}

func errOr(err, fallback error) error {
	if err != nil {
		return err
	}
	return fallback
}

// statusOf is the HTTP status that goes with an API error type, for
// errors sent inside a 200 stream.
func statusOf(errType string, status int) int {
	if status >= 400 {
		return status
	}
	switch errType {
	case "invalid_request_error":
		return 400
	case "authentication_error":
		return 401
	case "permission_error":
		return 403
	case "not_found_error":
		return 404
	case "request_too_large":
		return 413
	case "rate_limit_error":
		return 429
	case "api_error":
		return 500
	case "overloaded_error":
		return 529
	}
	return http.StatusBadGateway
}
