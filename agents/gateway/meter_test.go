package gateway

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"hearth/agents/stream"
)

// A stream as the API sends it today: message_delta repeats the input
// figures and output_tokens is a running total.
const sampleSSE = `event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-opus-4-8","content":[],"usage":{"input_tokens":1200,"cache_creation_input_tokens":40,"cache_read_input_tokens":300,"output_tokens":1}}}

event: ping
data: {"type": "ping"}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"message_stop \"usage\""}}

: a comment
event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":10}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":1200,"cache_creation_input_tokens":40,"cache_read_input_tokens":300,"output_tokens":25}}

event: message_stop
data: {"type":"message_stop"}

`

func TestMeterSSEAnySplit(t *testing.T) {
	want := Usage{InputTokens: 1200, OutputTokens: 25, CacheReadTokens: 300, CacheCreationTokens: 40}
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		in := strings.ReplaceAll(sampleSSE, "\n", eol)
		for cut := 0; cut <= len(in); cut++ {
			m := meter{kind: kindSSE}
			m.write([]byte(in[:cut]))
			m.write([]byte(in[cut:]))
			m.end()
			if m.id != "msg_01" || m.model != "claude-opus-4-8" || m.usage != want || !m.stopped || m.problem != "" {
				t.Fatalf("eol %q, cut at %d: id %q model %q usage %+v stopped %v problem %q",
					eol, cut, m.id, m.model, m.usage, m.stopped, m.problem)
			}
		}
	}
}

func TestMeterSSEBroken(t *testing.T) {
	m := meter{kind: kindSSE}
	m.write([]byte(sampleSSE[:strings.Index(sampleSSE, "event: message_delta")+30]))
	m.end()
	if m.stopped || m.usage.InputTokens != 1200 || m.usage.OutputTokens != 1 || m.problem == "" {
		t.Errorf("cut stream: stopped %v usage %+v problem %q", m.stopped, m.usage, m.problem)
	}

	m = meter{kind: kindSSE}
	m.write([]byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"))
	if m.errType != "overloaded_error" || m.errMsg != "Overloaded" {
		t.Errorf("error event: %q %q", m.errType, m.errMsg)
	}

	m = meter{kind: kindSSE}
	m.write([]byte("event: message_delta\ndata: {\"usage\":\n\n"))
	if !strings.Contains(m.problem, "malformed message_delta") {
		t.Errorf("malformed message_delta: problem %q", m.problem)
	}
}

func TestMeterJSON(t *testing.T) {
	body := `{"id":"msg_9","type":"message","model":"claude-opus-4-8","content":[],"usage":{"input_tokens":7,"output_tokens":9,"cache_read_input_tokens":3,"cache_creation_input_tokens":2}}`
	m := meter{kind: kindJSON}
	m.write([]byte(body[:10]))
	m.write([]byte(body[10:]))
	m.end()
	if m.id != "msg_9" || m.usage != (Usage{7, 9, 3, 2, 0}) || !m.stopped {
		t.Errorf("JSON message: %+v", m)
	}
	m = meter{kind: kindError}
	m.write([]byte(`{"type":"error","error":{"type":"api_error","message":"boom"}}`))
	m.end()
	if m.errType != "api_error" || m.usage != (Usage{}) {
		t.Errorf("error body: %+v", m)
	}
}

// TestMeterCutEstimate: a stream cut after a hundred deltas but before
// message_delta is metered from the deltas, not from message_start's
// placeholder output count of 1.
func TestMeterCutEstimate(t *testing.T) {
	var b strings.Builder
	b.WriteString(sampleSSE[:strings.Index(sampleSSE, "event: content_block_delta")])
	b.WriteString("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n")
	for range 101 {
		b.WriteString("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"wo\"}}\n\n")
	}
	m := meter{kind: kindSSE}
	m.write([]byte(b.String()))
	m.end()
	if m.final || m.stopped || m.deltas != 101 || m.content != 202 || m.usage.OutputTokens != 1 {
		t.Fatalf("meter after the cut: final %v stopped %v deltas %d content %d usage %+v", m.final, m.stopped, m.deltas, m.content, m.usage)
	}
	if got := m.estimatedOutput(); got != 101 {
		t.Errorf("estimated output %d, want 101 (one per delta with content; 202 bytes are only 51 at 4 a token)", got)
	}
	m.content = 4000
	if got := m.estimatedOutput(); got != 1000 {
		t.Errorf("estimated output of 4000 bytes in 101 deltas: %d, want 1000", got)
	}

	m = meter{kind: kindSSE}
	m.write([]byte(sampleSSE))
	m.end()
	if !m.final || m.usage.OutputTokens != 25 || m.deltas != 1 {
		t.Errorf("whole stream: final %v usage %+v deltas %d", m.final, m.usage, m.deltas)
	}
}

// TestCutStreamMetered: a provider whose stream breaks after 102 content
// deltas, before message_delta, is metered 102 output tokens (not
// message_start's 1), priced, charged, and reported cut and estimated.
func TestCutStreamMetered(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sampleSSE[:strings.Index(sampleSSE, "event: content_block_delta")])
		for range 102 {
			io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" abc\"}}\n\n")
		}
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops
	}))
	t.Cleanup(upstream.Close)
	var calls []ModelCallPayload
	var mu sync.Mutex
	gw, err := New(Config{Upstream: upstream.URL, APIKey: realKey, Prices: NewPrices(map[string]Price{"claude-opus-4-8": {Input: 1, Output: 10}}),
		OnEvent: func(e stream.Event) {
			var p ModelCallPayload
			json.Unmarshal(e.Payload, &p)
			mu.Lock()
			calls = append(calls, p)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	budget := &Limits{}
	token := gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	h := &harness{url: srv.URL}
	io.Copy(io.Discard, h.post(t, token, `{"model":"claude-opus-4-8","max_tokens":500,"stream":true,"messages":[]}`).Body)
	mu.Lock()
	defer mu.Unlock()
	wantUSD := (1200*1 + 102*10 + 300*0 + 40*0) / 1e6
	if len(calls) != 1 || calls[0].OutputTokens != 102 || !calls[0].Cut || !calls[0].OutputEstimated || calls[0].Status != 502 {
		t.Fatalf("model_call events %+v, want one cut call with 102 output tokens, estimated", calls)
	}
	if usd, turns := budget.Spent(); turns != 1 || math.Abs(usd-calls[0].USD) > 1e-12 || calls[0].USD < wantUSD {
		t.Errorf("charged $%v for %d turns, event $%v; want the 102 output tokens charged (at least $%v)", usd, turns, calls[0].USD, wantUSD)
	}
}
