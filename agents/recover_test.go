package agents

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// TestSettleCallsAfterCrash: a daemon dies with model calls in flight (in
// process: its store goes away mid-stream, so no finish is recorded and
// nothing more is charged, as under SIGKILL). The next start settles
// them: every call the provider served is either metered or recorded as
// cut, the ledger charged exactly what the records say, and the
// execution's totals are those figures, not zero.
func TestSettleCallsAfterCrash(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "hearth.db")
	old, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.AddCredits(ctx, 100, "test"); err != nil {
		t.Fatal(err)
	}
	// Each execution makes two quick calls, then a slow one the crash
	// cuts.
	quick := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("quick")}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
	slow := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("a slow answer")}, Usage: modeltest.Usage{InputTokens: 2000, OutputTokens: 300}, Delay: 300 * time.Millisecond}
	model := modeltest.New(modeltest.Config{Turns: []modeltest.Turn{quick, quick, slow, quick, quick, slow, quick, quick, slow}})
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	prices := gateway.NewPrices(map[string]gateway.Price{"claude-sonnet-4-5": {Input: 3, Output: 15}})
	gw, err := gateway.New(gateway.Config{Upstream: model.URL(), APIKey: model.Key(), Prices: prices,
		Record: func(ev stream.Event) error { _, err := old.Append(ctx, ev); return err }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	defer srv.Close()

	const n = 3
	var execs []store.Execution
	var tokens []string
	for range n {
		sess, err := old.CreateSession(ctx, store.Session{Agent: "analyst"})
		if err != nil {
			t.Fatal(err)
		}
		e, err := old.CreateExecution(ctx, store.Execution{Session: sess.ID, Prompt: "work", Limits: store.Limits{USD: 2}})
		if err != nil {
			t.Fatal(err)
		}
		if err := old.Reserve(ctx, e.ID, 2); err != nil {
			t.Fatal(err)
		}
		execs = append(execs, e)
		tokens = append(tokens, gw.Register(gateway.Execution{Session: sess.ID, ID: e.ID,
			Budget: ledgerBudget{&gateway.Limits{USD: 2}, old, e.ID}}))
	}
	call := func(token string, i int) *http.Response {
		body := fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":4000,"stream":true,"messages":[{"role":"user","content":"conversation %d"}]}`, i)
		req, _ := http.NewRequest("POST", srv.URL+"/v1/messages", strings.NewReader(body))
		req.Header.Set("x-api-key", token)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var inFlight []*http.Response
	for i, tok := range tokens {
		for range 2 {
			resp := call(tok, i)
			if resp.StatusCode != 200 {
				t.Fatalf("quick call: %d", resp.StatusCode)
			}
			resp.Body.Close()
		}
		resp := call(tok, i)
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // the slow answer has begun
			t.Fatal(err)
		}
		inFlight = append(inFlight, resp)
	}

	// The crash: the store is gone; whatever the gateway does from here
	// is lost, as in a daemon killed now.
	old.Close()
	srv.CloseClientConnections()
	for _, r := range inFlight {
		r.Body.Close()
	}
	served := len(model.MessageRequests())

	st, err := store.Open(path) // the next daemon's
	if err != nil {
		t.Fatal(err)
	}
	var metered, cut int
	var recorded, ledgerSpent float64
	// As the next daemon starts: settle every execution, then release
	// their reservations, then record their totals.
	defer st.Close()
	for _, e := range execs {
		s, err := SettleCalls(ctx, st, e, true)
		if err != nil {
			t.Fatal(err)
		}
		if s.Started != 3 || s.Finished != 2 || s.Cut != 1 || s.CutUSD <= 0 {
			t.Errorf("%s: settled %+v, want 3 started, 2 finished, 1 cut and charged", e.ID, s)
		}
	}
	if _, err := st.InterruptRunning(ctx); err != nil {
		t.Fatal(err)
	}
	for _, e := range execs {
		got, err := RecordTotals(ctx, st, e.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := allEvents(ctx, st, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		var usd float64
		for _, ev := range evs {
			var p gateway.ModelCallPayload
			if ev.Type != stream.ModelCall || json.Unmarshal(ev.Payload, &p) != nil || p.Phase == gateway.PhaseStart {
				continue
			}
			usd += p.USD
			if p.Recovered {
				cut++
				if !p.Cut || p.Call == "" || p.Status != 502 {
					t.Errorf("%s: recovered record %+v, want cut, with its call id", e.ID, p)
				}
			} else {
				metered++
			}
		}
		entries, _ := st.CreditEntries(ctx, e.ID)
		var spent float64
		for _, c := range entries {
			if c.Kind == store.CreditSpent {
				spent += c.USD
			}
		}
		recorded += usd
		ledgerSpent += spent
		if math.Abs(usd-spent) > 1e-6 || math.Abs(got.USD-spent) > 1e-6 || got.Turns != 2 || got.Tokens.Input != 2000 {
			t.Errorf("%s: records $%.6f, ledger $%.6f, execution %+v; want them equal, 2 turns, 2000 input tokens", e.ID, usd, spent, got)
		}
	}
	if served != n*3 || metered+cut != served {
		t.Errorf("served %d calls, metered %d, cut %d: want served == metered + cut == %d", served, metered, cut, n*3)
	}
	t.Logf("served %d, metered %d, cut %d; records $%.6f, ledger $%.6f", served, metered, cut, recorded, ledgerSpent)

	// Settling again changes nothing.
	s, err := SettleCalls(ctx, st, execs[0], true)
	if err != nil || s.Cut != 0 || s.Charged != 0 {
		t.Errorf("settling twice: %+v, %v; want nothing to do", s, err)
	}
}
