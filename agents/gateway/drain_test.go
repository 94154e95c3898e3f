package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
)

// TestDrain: a draining gateway lets a slow stream in flight finish whole
// and metered, and answers new calls 529 with Retry-After, which the
// agent's client retries, without reaching the provider.
func TestDrain(t *testing.T) {
	const delay = 60 * time.Millisecond // ten events: most of a second
	usage := modeltest.Usage{InputTokens: 1000, OutputTokens: 102}
	h := newHarness(t, []modeltest.Turn{{Blocks: []modeltest.Block{modeltest.Text("a slow answer in pieces")}, Usage: usage, Delay: delay}})
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	other := h.gw.Register(Execution{Session: "s", ID: "e2"})
	r := startStream(t, h, token)
	drained := make(chan error, 1)
	go func() { drained <- h.gw.Drain(context.Background()) }()
	for !h.gw.isDraining() {
		time.Sleep(time.Millisecond)
	}

	for _, tok := range []string{token, other} {
		refused := h.post(t, tok, request(true, hello))
		var e struct{ Error apiError }
		json.Unmarshal(readAll(t, refused), &e)
		if refused.StatusCode != 529 || e.Error.Type != "overloaded_error" || refused.Header.Get("Retry-After") == "" ||
			refused.Header.Get("x-should-retry") != "true" {
			t.Errorf("a call while draining: %d %+v Retry-After %q x-should-retry %q; want a retryable 529",
				refused.StatusCode, e, refused.Header.Get("Retry-After"), refused.Header.Get("x-should-retry"))
		}
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) with a stream in flight", err)
	default:
	}
	rest, err := io.ReadAll(r)
	if err != nil || !strings.HasSuffix(string(rest), "data: {\"type\":\"message_stop\"}\n\n") {
		t.Fatalf("the stream in flight: %v, ends %q; want it whole", err, rest[max(0, len(rest)-60):])
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("Drain: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return once the stream in flight ended")
	}
	calls := h.modelCalls(t)
	if len(calls) != 1 || calls[0].Status != 200 || calls[0].Cut || calls[0].OutputTokens != 102 {
		t.Errorf("model_call events %+v, want the one call, whole, with its 102 output tokens", calls)
	}
	if n := len(h.up.Requests()); n != 1 {
		t.Errorf("%d calls reached the provider, want 1", n)
	}
}

// TestDrainBound: Drain gives up when its context ends, saying calls are
// still in flight.
func TestDrainBound(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{{Blocks: []modeltest.Block{modeltest.Text("very slow")}, Delay: time.Second}})
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	startStream(t, h, token)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := h.gw.Drain(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "in flight") || time.Since(t0) > 5*time.Second {
		t.Errorf("Drain with a call in flight past its bound: %v after %v", err, time.Since(t0))
	}
}

// TestRevoke: Revoke refuses the token's new calls at once, waits for
// its call in flight to be metered, so its events come before what the
// caller writes next, and gives up at its bound, saying so.
func TestRevoke(t *testing.T) {
	const delay = 60 * time.Millisecond
	usage := modeltest.Usage{InputTokens: 1000, OutputTokens: 102}
	slow := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("a slow answer in pieces")}, Usage: usage, Delay: delay}
	verySlow := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("very slow")}, Delay: time.Second}
	h := newHarness(t, []modeltest.Turn{slow, verySlow})
	token := h.gw.Register(Execution{Session: "s", ID: "e"})
	r := startStream(t, h, token)
	revoked := make(chan error, 1)
	go func() { revoked <- h.gw.Revoke(context.Background(), token) }()
	// Until Revoke has taken the token out, a new call may still get in.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		h.gw.mu.RLock()
		_, in := h.gw.execs[token]
		h.gw.mu.RUnlock()
		if !in {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Revoke did not take the token out in 10s")
		}
	}
	if refused := h.post(t, token, request(true, hello)); refused.StatusCode != 401 {
		t.Errorf("a call after Revoke: %d, want 401", refused.StatusCode)
	}
	select {
	case err := <-revoked:
		t.Fatalf("Revoke returned (%v) with a call in flight", err)
	default:
	}
	if _, err := io.ReadAll(r); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-revoked:
		if err != nil {
			t.Fatalf("Revoke: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Revoke did not return once the call in flight ended")
	}
	// Revoke returned: the call's end is already among the events.
	if calls := h.modelCalls(t); len(calls) != 1 || calls[0].OutputTokens != 102 {
		t.Errorf("model_call events when Revoke returned: %+v, want the one call, metered", calls)
	}
	if err := h.gw.Revoke(context.Background(), token); err != nil {
		t.Errorf("Revoke again: %v, want nothing to do", err)
	}

	stuck := h.gw.Register(Execution{Session: "s", ID: "e2"})
	startStream(t, h, stuck)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := h.gw.Revoke(ctx, stuck)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "in flight") || time.Since(t0) > 5*time.Second {
		t.Errorf("Revoke with a call in flight past its bound: %v after %v", err, time.Since(t0))
	}
}

// startStream starts a streamed call with token and returns its body
// once its first line, message_start, has come: the call is in flight.
func startStream(t *testing.T, h *harness, token string) *bufio.Reader {
	t.Helper()
	resp := h.post(t, token, request(true, hello))
	t.Cleanup(func() { resp.Body.Close() })
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); err != nil || line != "event: message_start\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	return r
}
