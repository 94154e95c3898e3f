package cluster_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"hearth/cluster"
	"hearth/scheduler"
)

// fakeClock moves only when told to, so three schedulers cross minutes at
// once; it stands for the wall clock the nodes share (NTP).
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters map[chan time.Time]time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) WakeAt(t time.Time) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if !t.After(c.now) {
		ch <- c.now
		return ch, func() {}
	}
	c.waiters[ch] = t
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.waiters, ch)
	}
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	for ch, at := range c.waiters {
		if !at.After(t) {
			ch <- t
			delete(c.waiters, ch)
		}
	}
}

// TestEveryScheduleFiresOncePerCluster: three nodes each run the real
// scheduler on the same "@every 1m" schedule, each firing through the
// cluster; across three periods the schedule's hook runs three times,
// once per due time, whichever nodes ran it.
func TestEveryScheduleFiresOncePerCluster(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	t0 := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	clock := &fakeClock{now: t0, waiters: map[chan time.Time]time.Time{}}
	var mu sync.Mutex
	calls, first := 0, 0
	for _, id := range []string{"a", "b", "c"} {
		m := join(t, url, cluster.Node{ID: id, Capacity: 1, Images: []string{"img"}}, r, cluster.Options{})
		store, err := scheduler.OpenFileStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		fire := func(ctx context.Context, run scheduler.Run) (string, error) {
			won, err := m.Fire(ctx, run.Schedule, run.Scheduled, run.Payload)
			mu.Lock()
			defer mu.Unlock()
			calls++
			if won {
				first++
			}
			r.poke()
			return "", err
		}
		s, err := scheduler.New(store, fire, scheduler.Options{Clock: clock, Location: time.UTC, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Add(scheduler.Schedule{ID: "nightly", Spec: "@every 1m", Created: t0, Payload: []byte(`{"agent":"x"}`)}); err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s.Close(ctx)
		})
	}
	for p := 1; p <= 3; p++ {
		clock.Set(t0.Add(time.Duration(p) * time.Minute))
		r.waitFor(t, 60*time.Second, "every node's scheduler to fire and the hook to run", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return calls == 3*p && len(r.fired) == p
		})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if first != 3 {
		t.Errorf("%d Fire calls were first of their due time, want 3", first)
	}
	for i, f := range r.fired {
		want := t0.Add(time.Duration(i+1) * time.Minute)
		if f.Schedule != "nightly" || !f.Due.Equal(want) || string(f.Payload) != `{"agent":"x"}` {
			t.Errorf("firing %d: %+v, want nightly due %v", i, f, want)
		}
	}
}
