package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/modeltest"
)

// TestInputBound: the bound is the byte count plus the margin, or less
// when a counted body shares a prefix and a suffix with the new one.
func TestInputBound(t *testing.T) {
	conv := func(msgs ...string) []byte {
		return []byte(`{"messages":[` + strings.Join(msgs, ",") + `],"tools":[` + strings.Repeat(`{"name":"x"},`, 50) + `{"name":"y"}]}`)
	}
	first := conv(`"a"`)
	second := conv(`"a"`, `"bb"`)
	cases := []struct {
		name   string
		body   []byte
		recent []counted
		want   int64
	}{
		{"first call: bytes", first, nil, int64(len(first)) + 100},
		{"appended: counted + the new bytes", second, []counted{{first, 40}}, 40 + 5 + 100},
		{"counted higher than bytes: bytes", second, []counted{{first, 10_000}}, int64(len(second)) + 100},
		{"unrelated body: bytes", second, []counted{{[]byte("zzz"), 1}}, int64(len(second)) + 100},
		{"the best of several", second, []counted{{[]byte("zzz"), 1}, {first, 40}, {[]byte(`{"q":1}`), 2}}, 40 + 5 + 100},
		{"same body, replaced middle", conv(`"x"`), []counted{{first, 40}}, 40 + 1 + 100},
		{"shorter body", first, []counted{{second, 40}}, 40 + 100},
	}
	for _, c := range cases {
		if got := inputBound(c.body, c.recent, 100); got != c.want {
			t.Errorf("%s: inputBound = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestBoundTable: bodies, counted tokens and prices to the max_tokens
// forwarded, or a refusal.
func TestBoundTable(t *testing.T) {
	opus := Price{Input: 5, Output: 25, CacheRead: 0.5, CacheWrite: 6.25}
	freeOut := Price{Input: 5, CacheWrite: 6.25}
	body := func(size int, maxTokens string) []byte {
		b := []byte(`{"model":"m","max_tokens":` + maxTokens + `,"messages":[{"role":"user","content":"`)
		b = append(b, bytes.Repeat([]byte("x"), max(0, size-len(b)-4))...)
		return append(b, `"}]}`...)
	}
	cases := []struct {
		name   string
		body   []byte
		recent []counted
		price  Price
		room   float64
		want   int64 // max_tokens forwarded; -1 refused
	}{
		// 10,000 bytes + 1,024 margin = 11,024 tokens at $6.25/M =
		// $0.0689; $1 leaves $0.9311 = 37,244 tokens at $25/M.
		{"asks less than fits", body(10_000, "32000"), nil, opus, 1, 32000},
		{"lowered", body(10_000, "64000"), nil, opus, 1, int64(math.Floor((1-11024*6.25/1e6)*1e6/25)) - 1},
		{"just a minimal answer", body(10_000, "64000"), nil, opus, 11024*6.25/1e6 + 257*25/1e6, 256},
		{"not even a minimal answer", body(10_000, "64000"), nil, opus, 11024*6.25/1e6 + 255*25/1e6, -1},
		{"the input alone does not fit", body(200_000, "100"), nil, opus, 1, -1},
		// 200 kB, but the last call counted 20,000 tokens for all but the
		// last 1,000 bytes: 21,000 + 1,024 tokens = $0.1377.
		{"counted: fits", body(200_000, "64000"), []counted{{body(199_000, "64000"), 20_000}}, opus, 0.2, int64(math.Floor((0.2-(20_000+1000+1024)*6.25/1e6)*1e6/25)) - 1},
		{"output free: as asked", body(1000, "64000"), nil, freeOut, 1, 64000},
	}
	for _, c := range cases {
		in := inputBound(c.body, c.recent, DefaultInputMargin)
		out := fit(c.room, in, c.price)
		got := int64(-1)
		if out >= DefaultMinOutput {
			_, n, err := capRequest(c.body, out)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			got = n
			if worst := worstCost(in, n, c.price); worst > c.room {
				t.Errorf("%s: worst case $%v over the $%v left", c.name, worst, c.room)
			}
		}
		if got != c.want {
			t.Errorf("%s: max_tokens %d, want %d (input bound %d, fit %d)", c.name, got, c.want, in, out)
		}
	}
}

// TestCapRequest: max_tokens and thinking as the provider will read them.
func TestCapRequest(t *testing.T) {
	cases := []struct {
		body, wantMax, wantThinking string
		limit                       int64
		bad                         bool
	}{
		{body: `{"max_tokens":32000}`, limit: 1000, wantMax: "1000"},
		{body: `{"max_tokens":500}`, limit: 1000, wantMax: "500"},
		{body: `{"max_tokens":1e5}`, limit: 1000, wantMax: "1000"},
		{body: `{"max_tokens":100.0}`, limit: 1000, wantMax: "100"},
		{body: `{"max_tokens":10,"max_tokens":99999}`, limit: 1000, wantMax: "1000"},
		{body: `{"max_tokens":99999,"max\u005ftokens":10}`, limit: 1000, wantMax: "10"},
		{body: `{"max_tokens":"99999"}`, limit: 1000, bad: true},
		{body: `{"max_tokens":null}`, limit: 1000, bad: true},
		{body: `{"max_tokens":0}`, limit: 1000, bad: true},
		{body: `{"max_tokens":-5}`, limit: 1000, bad: true},
		{body: `{"max_tokens":1.5}`, limit: 1000, bad: true},
		{body: `{"model":"m"}`, limit: 1000, bad: true},
		{body: `[1]`, limit: 1000, bad: true},
		{body: `{"max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":16000}}`, limit: 20000, wantMax: "20000", wantThinking: `{"budget_tokens":16000,"type":"enabled"}`},
		{body: `{"max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":16000}}`, limit: 8000, wantMax: "8000", wantThinking: `{"budget_tokens":4000,"type":"enabled"}`},
		{body: `{"max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":16000}}`, limit: 1500, wantMax: "1500", wantThinking: `{"budget_tokens":1024,"type":"enabled"}`},
		{body: `{"max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":16000}}`, limit: 1000, wantMax: "1000", wantThinking: `{"type":"disabled"}`},
		{body: `{"max_tokens":32000,"thinking":{"type":"enabled","budget_tokens":"16000"}}`, limit: 1000, bad: true},
		{body: `{"max_tokens":32000,"thinking":{"type":"adaptive"}}`, limit: 1000, wantMax: "1000", wantThinking: `{"type":"adaptive"}`},
		{body: `{"max_tokens":32000,"thinking":5}`, limit: 1000, bad: true},
	}
	for _, c := range cases {
		out, n, err := capRequest([]byte(c.body), c.limit)
		if c.bad {
			if err == nil {
				t.Errorf("%s: forwarded %s, want it refused", c.body, out)
			}
			continue
		}
		var got map[string]json.RawMessage
		if err != nil || json.Unmarshal(out, &got) != nil {
			t.Errorf("%s: %s, %v", c.body, out, err)
			continue
		}
		if string(got["max_tokens"]) != c.wantMax || n != mustInt(c.wantMax) || string(got["thinking"]) != c.wantThinking {
			t.Errorf("%s: forwarded %s (max %d), want max_tokens %s thinking %s", c.body, out, n, c.wantMax, c.wantThinking)
		}
		if topKeys(t, out)["max_tokens"] != 1 {
			t.Errorf("%s: forwarded %s, want max_tokens once", c.body, out)
		}
	}
}

// topKeys counts a JSON object's top-level keys, as written (a reader
// that keeps the first of duplicate keys would see another value).
func topKeys(t *testing.T, b []byte) map[string]int {
	d := json.NewDecoder(bytes.NewReader(b))
	keys := map[string]int{}
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%s: not an object", b)
	}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		keys[tok.(string)]++
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
	}
	return keys
}

func mustInt(s string) int64 {
	var n int64
	json.Unmarshal([]byte(s), &n)
	return n
}

// FuzzCapRequest: whatever the agent sends, a body the gateway forwards
// has one max_tokens, an integer at most the limit, that every JSON
// reader (first key wins or last) sees the same, and an enabled thinking
// budget below it.
func FuzzCapRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":32000,"messages":[]}`,
		`{"max_tokens":10,"max_tokens":99999}`,
		`{"max_tokens":"99999"}`,
		`{"max\u005ftokens":99999,"max_tokens":1}`,
		`{"max_tokens":1e9,"thinking":{"type":"enabled","budget_tokens":1e8,"budget_tokens":5}}`,
		`{"max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":4000}}`,
		`{"max_tokens":1.0e3}`, `{"max_tokens":-0}`, `{}`, `[]`, `null`,
	} {
		f.Add([]byte(s), uint32(1000))
	}
	f.Fuzz(func(t *testing.T, body []byte, limit uint32) {
		lim := int64(limit%100_000) + 1
		out, n, err := capRequest(body, lim)
		if err != nil {
			return
		}
		if n < 1 || n > lim {
			t.Fatalf("max_tokens %d, limit %d", n, lim)
		}
		if !json.Valid(out) {
			// Passed as it is: the provider refuses it, for free. Its one
			// max_tokens as the gateway read it was still within the limit.
			if raw, k := scanKey(out, "max_tokens"); k != 1 || !plainInt(raw) || mustInt(string(raw)) > lim {
				t.Fatalf("forwarded %s, not JSON, with max_tokens %s (%d times)", out, raw, k)
			}
			return
		}
		if k := topKeys(t, out); k["max_tokens"] != 1 {
			t.Fatalf("forwarded %s: max_tokens %d times, want once", out, k["max_tokens"])
		}
		// Maps, not structs: encoding/json matches struct fields without
		// regard to case, the provider does not.
		var req map[string]json.RawMessage
		if err := json.Unmarshal(out, &req); err != nil {
			t.Fatalf("forwarded %s: not JSON: %v", out, err)
		}
		if got, ok := wholeNumber(req["max_tokens"]); !ok || got != n || string(req["max_tokens"]) != fmt.Sprint(n) {
			t.Fatalf("forwarded %s: max_tokens %s, want %d", out, req["max_tokens"], n)
		}
		var th map[string]json.RawMessage
		if json.Unmarshal(req["thinking"], &th) == nil && string(th["type"]) == `"enabled"` {
			if b, ok := wholeNumber(th["budget_tokens"]); !ok || b >= n {
				t.Fatalf("forwarded %s: thinking budget %s not below max_tokens %d", out, th["budget_tokens"], n)
			}
		}
	})
}

// TestHostileMaxTokens: an agent cannot escape the cap through the
// request: a huge max_tokens is lowered, a missing or odd one (a string,
// duplicate keys, an escaped key) is refused or read as the provider
// reads it, and spend stays within the limit whatever it sends.
func TestHostileMaxTokens(t *testing.T) {
	big := modeltest.Usage{InputTokens: 10, OutputTokens: 1_000_000}
	turns := make([]modeltest.Turn, 8)
	for i := range turns {
		turns[i] = modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("x")}, Usage: big}
	}
	h := newHarness(t, turns)
	budget := &Limits{USD: 1}
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget})
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, body := range []string{
		`{"model":"claude-opus-4","max_tokens":1000000,"stream":true,` + msgs + `}`,
		`{"model":"claude-opus-4","max_tokens":1,"max_tokens":1000000,` + msgs + `}`,
		`{"model":"claude-opus-4","max_tokens":1000000,"max\u005ftokens":2000000,` + msgs + `}`,
		`{"model":"claude-opus-4","max_tokens":"1000000",` + msgs + `}`,
		`{"model":"claude-opus-4",` + msgs + `}`,
		`{"model":"claude-opus-4","max_tokens":1e12,"stream":true,` + msgs + `}`,
		`{"model":"claude-opus-4","max_tokens":1000000,"stream":true,"thinking":{"type":"enabled","budget_tokens":999999},` + msgs + `}`,
	} {
		resp := h.post(t, token, body)
		answer := readAll(t, resp)
		if resp.StatusCode != 200 && resp.StatusCode != 400 {
			t.Errorf("%s: status %d %s", body, resp.StatusCode, answer)
		}
	}
	for _, r := range h.up.MessageRequests() {
		var seen struct {
			MaxTokens int64 `json:"max_tokens"`
		}
		json.Unmarshal(r.Body, &seen)
		if seen.MaxTokens > 10_000 || topKeys(t, r.Body)["max_tokens"] != 1 {
			t.Errorf("the provider was sent %s", r.Body)
		}
	}
	// Many at once: one at a time, each bounded by what the last left.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			resp := h.post(t, token, `{"model":"claude-opus-4","max_tokens":1000000,"stream":true,`+msgs+`}`)
			io.Copy(io.Discard, resp.Body)
		})
	}
	wg.Wait()
	// The gateway is no way to the appliance's API: a top-up is a 404.
	req, _ := http.NewRequest("POST", h.url+"/v1/executions/e/topup", strings.NewReader(`{"usd":100}`))
	req.Header.Set("x-api-key", token)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 404 {
		t.Errorf("a top-up through the gateway: %v, %v; want 404", resp, err)
	} else {
		resp.Body.Close()
	}
	if usd, _ := budget.Spent(); usd > 1 || budget.USD != 1 {
		t.Errorf("spent $%v of a limit now $%v, want at most $1 of $1", usd, budget.USD)
	}
	if n := len(h.up.MessageRequests()); n == 0 {
		t.Error("no call reached the provider: the test tests nothing")
	}
}

// TestHold: a call refused for dollars is held while Hold waits: a
// raised limit lets it go on (bounded again), no top-up refuses it (the
// warning before the stop), and a drain answers it with a retryable 529.
func TestHold(t *testing.T) {
	big := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("x")}, Usage: modeltest.Usage{InputTokens: 10, OutputTokens: 9000}}
	h := newHarness(t, []modeltest.Turn{big, big, big, big, big, big, big, big})
	body := `{"model":"claude-opus-4","max_tokens":9000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

	budget := &Limits{USD: 0.5}
	held := make(chan Decision, 1)
	answer := make(chan bool, 1)
	token := h.gw.Register(Execution{Session: "s", ID: "e", Budget: budget, Hold: func(ctx context.Context, d Decision) bool {
		held <- d
		select {
		case ok := <-answer:
			return ok
		case <-ctx.Done():
			return false
		}
	}})
	type result struct {
		status int
		body   string
		retry  string
	}
	results := make(chan result, 1)
	send := func() {
		go func() {
			req, _ := http.NewRequest("POST", h.url+"/v1/messages", strings.NewReader(body))
			req.Header.Set("x-api-key", token)
			req.Header.Set("anthropic-version", "2023-06-01")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- result{status: -1, body: err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- result{resp.StatusCode, string(b), resp.Header.Get("x-should-retry")}
		}()
	}
	get := func(what string) result {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer", what)
		}
		return result{}
	}

	// Calls go through, max_tokens lowered, until one cannot fit.
	untilHeld := func(what string) {
		t.Helper()
		for i := range 6 {
			send()
			select {
			case <-held:
				return
			case r := <-results:
				if r.status != 200 {
					t.Fatalf("%s: call %d: %d %s", what, i, r.status, r.body)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no answer, no call held", what)
			}
		}
		t.Fatalf("%s: no call held after 6", what)
	}
	untilHeld("at the limit")
	calls := len(h.up.MessageRequests())
	budget.Raise(1)
	answer <- true
	if r := get("after a top-up"); r.status != 200 || len(h.up.MessageRequests()) != calls+1 {
		t.Fatalf("after a top-up: %d %s; want the call forwarded", r.status, r.body)
	}
	untilHeld("at the new limit")
	answer <- false
	if r := get("no top-up"); r.status != 400 || !strings.Contains(r.body, "Budget exceeded") {
		t.Errorf("no top-up: %d %s, want refused", r.status, r.body)
	}
	got := h.budgetEvents(t)
	if n := len(got); n < 2 || got[n-1].Level != "exceeded" || got[n-2].Level != "warn" || got[n-2].Max != 1.5 {
		t.Errorf("budget events %+v: want a warn at the new limit, then exceeded", got)
	}
	budget.Raise(1)
	untilHeld("before the drain")
	go h.gw.Drain(context.Background())
	if r := get("drained"); r.status != 529 || r.retry != "true" {
		t.Errorf("drained while held: %d %s x-should-retry %q; want 529, retry", r.status, r.body, r.retry)
	}
	if usd, _ := budget.Spent(); usd > budget.USD {
		t.Errorf("spent $%v of $%v", usd, budget.USD)
	}
}
