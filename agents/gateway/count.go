package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Counting the input. When the byte bound is the only bound a call has
// (no recent counted body shares enough of it: at least CountMinBytes of
// the body would be bounded at a token per byte) and that bound changes
// what the gateway does with the call (refuses it, lowers its
// max_tokens, or makes it the warned one), the gateway asks the provider
// to count the body (POST /v1/messages/count_tokens, which is free) and
// bounds the input at that count plus a margin instead. The common case,
// a call whose byte bound already fits, costs no extra round trip. A
// count that fails in any way (error, timeout, a non-200 answer, an
// answer it cannot read) leaves the byte bound, with a log line: never
// an error for the agent.

// CountMinBytes is the least number of a body's bytes bounded at a token
// per byte for which the gateway asks the provider to count it.
const CountMinBytes = 4096

// DefaultCountTimeout bounds a count when Config.CountTimeout is 0.
const DefaultCountTimeout = 5 * time.Second

// maxCountAnswer bounds the count answer read from the provider: the
// real one is a few dozen bytes.
const maxCountAnswer = 64 << 10

// The sources of an input bound, as model_call records name them.
const (
	BoundBytes   = "bytes"   // a token per byte of the body
	BoundPrefix  = "prefix"  // a recent call's counted tokens and the bytes it does not share
	BoundCounted = "counted" // the provider's count of this body
)

// countDropped are the top-level request fields not sent to be counted:
// count_tokens refuses them and none adds input tokens (generation
// settings and metadata), or, for context_management, it can only take
// tokens away, so counting without it is conservative. Every other field
// is sent: one that count_tokens does not know makes it refuse, and the
// byte bound stays.
var countDropped = []string{"max_tokens", "stream", "metadata", "temperature", "top_k", "top_p",
	"stop_sequences", "service_tier", "context_management"}

// countedBound is the input bound from the provider's count: the count,
// 1% of it (the count "is an estimate" that may differ from the billed
// figure "by a small amount"), and margin.
func countedBound(tokens, margin int64) int64 { return tokens + tokens/100 + margin }

// countBody is body as count_tokens takes it: each top-level field once
// (the last, as decoding reads it), but those in countDropped.
func countBody(body []byte) ([]byte, error) {
	return topLevel(body, countDropped...)
}

// normalize is body with each top-level field once, as countBody reads
// it: a counted call is forwarded so, and the provider bills what it
// counted, whatever duplicate keys the agent sent.
func normalize(body []byte) ([]byte, error) { return topLevel(body) }

func topLevel(body []byte, drop ...string) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		return nil, errors.New("the request body is not a JSON object")
	}
	for _, k := range drop {
		delete(req, k)
	}
	return marshal(req)
}

// countTokens asks the provider for the input tokens of body, with the
// agent's request's version and beta headers, within the configured
// timeout.
func (g *Gateway) countTokens(ctx context.Context, r *http.Request, prov *provider, body []byte) (int64, error) {
	cb, err := countBody(body)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CountTimeout)
	defer cancel()
	u := prov.upstream.JoinPath("v1", "messages", "count_tokens")
	if r.URL.RawQuery == "beta=true" {
		u.RawQuery = r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(cb))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", prov.key)
	for _, h := range []string{"anthropic-version", "anthropic-beta"} {
		for _, v := range r.Header.Values(h) {
			req.Header.Add(h, v)
		}
	}
	resp, err := g.cfg.Transport.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxCountAnswer+1))
	if err != nil {
		return 0, fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d: %.200s", resp.StatusCode, answer)
	}
	return parseCount(answer)
}

// parseCount reads a count_tokens answer, {"input_tokens": N}: N a whole
// number from 0 to 1<<40 (far above any context window).
func parseCount(answer []byte) (int64, error) {
	if len(answer) > maxCountAnswer {
		return 0, fmt.Errorf("the answer is over %d bytes", maxCountAnswer)
	}
	var a struct {
		InputTokens json.RawMessage `json:"input_tokens"`
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		return 0, fmt.Errorf("the answer is not a JSON object: %v", err)
	}
	n, ok := wholeNumber(a.InputTokens)
	if !ok || n < 0 || n > 1<<40 {
		return 0, fmt.Errorf("the answer has no input_tokens count: %.200s", answer)
	}
	return n, nil
}

// counter returns a function that counts body once, for one call (a
// held call is planned again after a top-up, with the same count); a
// failed count is logged once and reported as not ok.
func (g *Gateway) counter(ctx context.Context, r *http.Request, prov *provider, ex *execution, model string, body []byte) func() (int64, bool) {
	var (
		tried bool
		n     int64
		err   error
	)
	return func() (int64, bool) {
		if g.cfg.CountTimeout < 0 {
			return 0, false
		}
		if !tried {
			tried = true
			start := time.Now()
			n, err = g.countTokens(ctx, r, prov, body)
			if err != nil && g.cfg.Log != nil {
				g.cfg.Log.Warn("gateway: counting a call's input tokens failed; its input is bounded at a token per byte",
					"session", ex.Session, "execution", ex.ID, "model", model, "bytes", len(body),
					"took", time.Since(start).Round(time.Millisecond), "err", err)
			}
		}
		return n, err == nil
	}
}
