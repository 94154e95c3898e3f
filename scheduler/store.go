package scheduler

import (
	"context"
	"encoding/json"
	"time"
)

// Run is one run of a schedule, as recorded in its history: started (and
// not ended yet), ended, or skipped with a reason. A run is recorded when
// it starts and again when it ends, so one going when the process dies
// is still in the history; New marks it ended with ErrInterrupted's text.
type Run struct {
	ID       string `json:"id"`
	Schedule string `json:"schedule"`
	// Scheduled is the due time the run is for; for a manual run, when it
	// was asked for; for a catch-up run, the latest due time missed.
	Scheduled time.Time `json:"scheduled"`
	Started   time.Time `json:"started,omitzero"`
	Ended     time.Time `json:"ended,omitzero"`
	// Result is what the Job returned (for the appliance, the execution id).
	Result string `json:"result,omitempty"`
	Err    string `json:"error,omitempty"`
	// Skipped, when set, says why the run did not start.
	Skipped string `json:"skipped,omitempty"`
	CatchUp bool   `json:"catch_up,omitempty"`
	Manual  bool   `json:"manual,omitempty"`
	// Payload is the schedule's, given to the Job; it is not recorded.
	Payload json.RawMessage `json:"-"`
}

// Store keeps schedules and run history across restarts. The scheduler
// calls it from several goroutines; implementations must be safe for
// concurrent use.
type Store interface {
	// LoadSchedules returns every saved schedule; none saved yet is an
	// empty list, not an error.
	LoadSchedules(ctx context.Context) ([]Schedule, error)
	// SaveSchedules replaces the saved schedules with these, atomically:
	// after a crash either the old list or the new one is loaded.
	SaveSchedules(ctx context.Context, s []Schedule) error
	// AppendRun adds a run to its schedule's history, durably before it
	// returns. A run whose ID is already recorded replaces that record
	// and keeps its place: a run is appended when it starts, then again
	// with its result when it ends.
	AppendRun(ctx context.Context, r Run) error
	// ListRuns returns up to limit runs of a schedule, newest first (in
	// the order first appended), each as last appended; limit <= 0 means all. An unknown schedule has
	// an empty history, not an error.
	ListRuns(ctx context.Context, schedule string, limit int) ([]Run, error)
}
