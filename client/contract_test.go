package client

import (
	"testing"

	"hearth/agents/store"
	"hearth/appliance/api"
)

// The client repeats a rule of the daemon so that it need not link the
// daemon's store: which statuses are final. This test holds the copy to
// the original (test files may import the store; the package may not).
// The rule for dollars is shared, in internal/money.

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
