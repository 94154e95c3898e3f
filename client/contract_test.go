package client

import (
	"math"
	"testing"

	"hearth/agents/store"
	"hearth/appliance/api"
)

// The client repeats two rules of the daemon so that it need not link
// the daemon's store: which statuses are final, and which amounts of
// dollars the ledger takes. These tests hold the copies to the originals
// (test files may import the store; the package may not).

func TestTerminalMatchesStore(t *testing.T) {
	all := []api.ExecutionStatus{api.ExecutionStatusPending, api.ExecutionStatusRunning, api.ExecutionStatusCompleted,
		api.ExecutionStatusFailed, api.ExecutionStatusBudgetExceeded, api.ExecutionStatusTimedOut,
		api.ExecutionStatusCancelled, api.ExecutionStatusInterrupted, "no-such-status", ""}
	for _, s := range all {
		if got, want := Terminal(s), store.Status(s).Terminal(); got != want {
			t.Errorf("Terminal(%q) = %v, the store says %v", s, got, want)
		}
	}
}

func TestCheckUSDMatchesStore(t *testing.T) {
	if MaxUSD != store.MaxUSD {
		t.Fatalf("MaxUSD = %v, the store's is %v", float64(MaxUSD), float64(store.MaxUSD))
	}
	for _, usd := range []float64{0, 1, 0.25, 1e-6, 4e-7, 5e-7, 6e-7, 1e-9, -1, -1e-9, 1e9, 1e9 + 1, math.NaN(), math.Inf(1), math.Inf(-1), math.MaxFloat64, math.SmallestNonzeroFloat64} {
		got, want := CheckUSD(usd), store.CheckUSD(usd)
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Errorf("CheckUSD(%v) = %v, the store says %v", usd, got, want)
		}
	}
}
