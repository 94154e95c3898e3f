package scheduler

import "time"

// Clock tells the scheduler the time and wakes it. Tests give a fake one;
// nil means the real clock.
type Clock interface {
	Now() time.Time
	// WakeAt returns a channel that receives when the clock reaches t, or
	// earlier (the scheduler checks Now again), and a func releasing it.
	WakeAt(t time.Time) (<-chan time.Time, func())
}

// maxSleep bounds one wait on the real clock, so a wall-clock change or a
// suspended host delays a run by at most this much.
const maxSleep = time.Minute

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) WakeAt(t time.Time) (<-chan time.Time, func()) {
	timer := time.NewTimer(min(time.Until(t), maxSleep))
	return timer.C, func() { timer.Stop() }
}
