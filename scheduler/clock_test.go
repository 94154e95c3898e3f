package scheduler_test

import (
	"sync"
	"time"
)

// fakeClock moves only when told to, so tests cross hours in microseconds.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters map[*waiter]bool
}

type waiter struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock(now time.Time) *fakeClock {
	return &fakeClock{now: now, waiters: map[*waiter]bool{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) WakeAt(t time.Time) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := &waiter{at: t, c: make(chan time.Time, 1)}
	if !t.After(c.now) {
		w.c <- c.now
		return w.c, func() {}
	}
	c.waiters[w] = true
	return w.c, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.waiters, w)
	}
}

// Set moves the clock to t and wakes whoever waits for t or earlier.
func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	for w := range c.waiters {
		if !w.at.After(t) {
			w.c <- t
			delete(c.waiters, w)
		}
	}
}
