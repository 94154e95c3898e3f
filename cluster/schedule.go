package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// scheduleArgs is one due time of one schedule. River's uniqueness on
// (kind, args) makes a second Fire of the same due time a no-op, whichever
// node calls it.
type scheduleArgs struct {
	Schedule string    `json:"schedule" river:"unique"`
	Due      time.Time `json:"due" river:"unique"`
	Payload  []byte    `json:"payload,omitempty"`
}

func (scheduleArgs) Kind() string { return "hearth_schedule" }

// Fire is what a clustered daemon calls where its local scheduler would
// start a run: every node's scheduler computes the same due times from
// the shared schedules and calls Fire, and only the first call for a
// (schedule, due) pair queues a firing; Hooks.Schedule runs it once, on
// any node. It reports whether this call was the first.
func (m *Member) Fire(ctx context.Context, schedule string, due time.Time, payload []byte) (bool, error) {
	if err := checkName("schedule id", schedule); err != nil {
		return false, err
	}
	if due.IsZero() {
		return false, fmt.Errorf("%w: fire schedule %s: give its due time", ErrBadJob, schedule)
	}
	// The payload is left out of the unique key (river:"unique" tags):
	// two nodes holding different versions of a schedule still fire its
	// due time once.
	args := scheduleArgs{Schedule: schedule, Due: due.UTC().Truncate(time.Millisecond), Payload: payload}
	res, err := m.client.Insert(ctx, args, &river.InsertOpts{
		Queue: clusterQueue, MaxAttempts: 5,
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	})
	if err != nil {
		return false, fmt.Errorf("fire schedule %s at %s: %w", schedule, args.Due, err)
	}
	return !res.UniqueSkippedAsDuplicate, nil
}

type scheduleWorker struct {
	river.WorkerDefaults[scheduleArgs]
	m *Member
}

func (w *scheduleWorker) Work(ctx context.Context, job *river.Job[scheduleArgs]) error {
	if w.m.fence.Err() != nil {
		return river.JobSnooze(busyRetry) // for another node
	}
	return w.m.hooks.Schedule(ctx, Fired{Schedule: job.Args.Schedule, Due: job.Args.Due, Payload: job.Args.Payload})
}
