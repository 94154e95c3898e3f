package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"hearth/agents/gateway"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// A daemon that dies (SIGKILL, power loss) while model calls are in
// flight leaves their start records (gateway.Config.Record) without a
// finish, and perhaps finish records not yet charged to the ledger. The
// next start settles both with SettleCalls before it marks the execution
// interrupted, so that what was served, what was metered and what the
// ledger charged agree again, and then records the execution's totals
// from its events (CallTotals): an interrupted execution shows what it
// spent, not zero.

// Settlement is what SettleCalls did for one execution.
type Settlement struct {
	Started  int     // calls with a start record
	Finished int     // of those, calls that had a finish record
	Cut      int     // calls without one: now recorded as cut
	CutUSD   float64 // what those were charged
	Charged  float64 // ledger spend added so that it matches the records
}

// SettleCalls records each call of an execution that started and never
// finished as cut (model_call with cut and recovered set), charged the
// most it could cost (its start record's max_usd), capped by what is left
// of the execution's credit reservation (with credits) or of its USD
// limit; then, with credits, it charges the ledger whatever the records
// hold that it has not charged yet. Run it before the execution's
// reservation is released (store.InterruptRunning), and only for an
// execution no daemon is serving.
func SettleCalls(ctx context.Context, st *store.Store, exec store.Execution, credits bool) (Settlement, error) {
	var s Settlement
	evs, err := allEvents(ctx, st, exec.ID)
	if err != nil {
		return s, fmt.Errorf("settle the model calls of %s: %w", exec.ID, err)
	}
	var starts []gateway.ModelCallPayload
	finished := map[string]bool{}
	for _, ev := range evs {
		var p gateway.ModelCallPayload
		if ev.Type != stream.ModelCall || json.Unmarshal(ev.Payload, &p) != nil {
			continue
		}
		if p.Phase == gateway.PhaseStart {
			starts = append(starts, p)
		} else if p.Call != "" {
			finished[p.Call] = true
		}
	}
	usd, _, _ := CallTotals(evs)
	spent, held, err := ledger(ctx, st, exec.ID, credits)
	if err != nil {
		return s, err
	}
	// What is left to charge a cut call from: the reservation not yet
	// spent by the records, or the rest of the USD limit.
	left := math.Inf(1)
	switch {
	case credits:
		left = held - max(0, usd-spent)
	case exec.Limits.USD > 0:
		left = exec.Limits.USD - usd
	}
	var cut []stream.Event
	for _, p := range starts {
		s.Started++
		if finished[p.Call] {
			s.Finished++
			continue
		}
		charge := max(0, min(p.MaxUSD, left))
		left -= charge
		s.Cut++
		s.CutUSD += charge
		cut = append(cut, stream.New(exec.Session, exec.ID, stream.ModelCall, gateway.ModelCallPayload{
			Call: p.Call, Model: p.Model, USD: charge, Status: 502, Cut: true, Recovered: true,
			Error: fmt.Sprintf("the daemon stopped while the call was in flight; settled at the next start at $%.6f, "+
				"the most it could cost (%s), as its tokens were never seen", charge, capNote(p.MaxUSD, charge)),
		}))
	}
	if len(cut) > 0 {
		if _, err := st.Append(ctx, cut...); err != nil {
			return s, fmt.Errorf("settle the model calls of %s: record the cut ones: %w", exec.ID, err)
		}
	}
	if owed := usd + s.CutUSD - spent; credits && owed >= 1e-6 {
		if err := st.Spend(ctx, exec.ID, owed); err != nil {
			return s, fmt.Errorf("settle the model calls of %s: charge the ledger: %w", exec.ID, err)
		}
		s.Charged = owed
	}
	return s, nil
}

func capNote(maxUSD, charge float64) string {
	if charge < maxUSD {
		return fmt.Sprintf("its $%.6f at most, capped by what was left of the execution's budget", maxUSD)
	}
	return "its input at full price and its max_tokens of output"
}

// ledger is what the credit ledger has charged an execution, and what is
// left of its reservation; zero without credits.
func ledger(ctx context.Context, st *store.Store, execution string, credits bool) (spent, held float64, err error) {
	if !credits {
		return 0, 0, nil
	}
	entries, err := st.CreditEntries(ctx, execution)
	if err != nil {
		return 0, 0, fmt.Errorf("settle the model calls of %s: %w", execution, err)
	}
	for _, e := range entries {
		switch e.Kind {
		case store.CreditSpent:
			spent += e.USD
			held -= e.FromReservation
		case store.CreditReserved:
			held += e.USD
		case store.CreditReleased:
			held -= e.USD
		}
	}
	return spent, held, nil
}

// CallTotals adds up an execution's model calls from its events: dollars,
// turns (calls with a message id, each counted once, as the gateway
// counts them) and tokens. Start records carry no figures.
func CallTotals(evs []stream.Event) (usd float64, turns int, tokens store.Tokens) {
	for _, ev := range evs {
		var p gateway.ModelCallPayload
		if ev.Type != stream.ModelCall || json.Unmarshal(ev.Payload, &p) != nil || p.Phase == gateway.PhaseStart {
			continue
		}
		usd += p.USD
		if p.MessageID != "" && !p.Duplicate {
			turns++
		}
		tokens.Input += p.InputTokens
		tokens.Output += p.OutputTokens
		tokens.CacheRead += p.CacheReadTokens
		tokens.CacheCreation += p.CacheCreationTokens
	}
	return usd, turns, tokens
}

// RecordTotals sets an ended execution's totals from its events, and its
// dollars to at least what the ledger charged it (with credits).
func RecordTotals(ctx context.Context, st *store.Store, execution string, credits bool) (store.Execution, error) {
	evs, err := allEvents(ctx, st, execution)
	if err != nil {
		return store.Execution{}, fmt.Errorf("record the totals of %s: %w", execution, err)
	}
	usd, turns, tokens := CallTotals(evs)
	spent, _, err := ledger(ctx, st, execution, credits)
	if err != nil {
		return store.Execution{}, err
	}
	return st.UpdateExecution(ctx, execution, func(e *store.Execution) error {
		e.USD, e.Turns, e.Tokens = max(usd, spent), turns, tokens
		return nil
	})
}
