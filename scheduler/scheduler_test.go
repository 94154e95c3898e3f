package scheduler_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"hearth/scheduler"
)

var t0 = time.Date(2025, 3, 3, 9, 30, 0, 0, time.UTC) // a Monday

func at(h, m int) time.Time {
	return t0.Truncate(24 * time.Hour).Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
}

// testJob records the runs it is given; each blocks until released (or its
// context ends) unless the job is free.
type testJob struct {
	started chan scheduler.Run
	release chan struct{}
	free    bool
}

func newTestJob(free bool) *testJob {
	return &testJob{started: make(chan scheduler.Run, 100), release: make(chan struct{}), free: free}
}

func (j *testJob) run(ctx context.Context, r scheduler.Run) (string, error) {
	j.started <- r
	if !j.free {
		select {
		case <-j.release:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return "exec-" + r.ID, nil
}

func (j *testJob) next(t *testing.T) scheduler.Run {
	t.Helper()
	select {
	case r := <-j.started:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no run started")
		return scheduler.Run{}
	}
}

func (j *testJob) none(t *testing.T) {
	t.Helper()
	select {
	case r := <-j.started:
		t.Fatalf("unexpected run %+v", r)
	case <-time.After(20 * time.Millisecond):
	}
}

type env struct {
	dir   string
	clock *fakeClock
	job   *testJob
}

func newEnv(t *testing.T, free bool) *env {
	checkGoroutines(t)
	return &env{dir: t.TempDir(), clock: newFakeClock(t0), job: newTestJob(free)}
}

// open makes a Scheduler on the env's directory, as after a (re)start.
func (e *env) open(t *testing.T) *scheduler.Scheduler {
	t.Helper()
	st, err := scheduler.OpenFileStore(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := scheduler.New(st, e.job.run, scheduler.Options{Clock: e.clock, Location: time.UTC})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			t.Errorf("%d goroutines leaked", n-before)
		}
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func history(t *testing.T, s *scheduler.Scheduler, id string) []scheduler.Run {
	t.Helper()
	runs, err := s.History(context.Background(), id, 0)
	if err != nil {
		t.Fatalf("History(%s): %v", id, err)
	}
	return runs
}

func status(t *testing.T, s *scheduler.Scheduler, id string) scheduler.Status {
	t.Helper()
	for _, st := range s.List() {
		if st.Schedule.ID == id {
			return st
		}
	}
	t.Fatalf("List() has no %s", id)
	return scheduler.Status{}
}

func mustAdd(t *testing.T, s *scheduler.Scheduler, sc scheduler.Schedule) {
	t.Helper()
	if err := s.Add(sc); err != nil {
		t.Fatalf("Add(%+v): %v", sc, err)
	}
}

func TestNext(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	cases := []struct {
		name, spec string
		loc        *time.Location
		from, want time.Time
	}{
		{"utc", "0 9 * * *", time.UTC, at(9, 30), at(24+9, 0)},
		{"location option", "0 9 * * *", ny, at(9, 30), at(14, 0)}, // EST is UTC-5
		{"cron tz beats option", "CRON_TZ=Europe/Paris 0 9 * * *", ny, at(7, 0), at(8, 0)},
		{"cron tz summer", "CRON_TZ=Europe/Paris 0 9 * * *", time.UTC,
			time.Date(2025, 7, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 7, 1, 7, 0, 0, 0, time.UTC)},
		{"daily", "@daily", time.UTC, at(9, 30), at(24, 0)},
		{"daily in tz", "CRON_TZ=Asia/Tokyo @daily", time.UTC, at(9, 30), at(15, 0)},
		{"every", "@every 90m", time.UTC, at(9, 30), at(11, 0)},
		{"weekdays", "0 9 * * 1-5", time.UTC, time.Date(2025, 3, 7, 10, 0, 0, 0, time.UTC), time.Date(2025, 3, 10, 9, 0, 0, 0, time.UTC)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sched, err := scheduler.ParseSpec(tc.spec, tc.loc)
			if err != nil {
				t.Fatalf("ParseSpec(%q): %v", tc.spec, err)
			}
			if got := sched.Next(tc.from); !got.Equal(tc.want) {
				t.Errorf("ParseSpec(%q).Next(%v) = %v, want %v", tc.spec, tc.from, got, tc.want)
			}
		})
	}
	t.Run("status", func(t *testing.T) {
		e := newEnv(t, true)
		s := e.open(t)
		mustAdd(t, s, scheduler.Schedule{ID: "paris", Spec: "CRON_TZ=Europe/Paris 0 9 * * *"})
		if got := status(t, s, "paris").Next; !got.IsZero() {
			t.Errorf("Next before Start = %v, want zero", got)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if got, want := status(t, s, "paris").Next, at(24+8, 0); !got.Equal(want) {
			t.Errorf("Next = %v, want %v", got, want)
		}
		mustAdd(t, s, scheduler.Schedule{ID: "paris", Spec: "CRON_TZ=Europe/Paris 0 9 * * *", Paused: true})
		if got := status(t, s, "paris").Next; !got.IsZero() {
			t.Errorf("Next when paused = %v, want zero", got)
		}
	})
}

func TestAddInvalid(t *testing.T) {
	cases := []struct {
		name string
		sc   scheduler.Schedule
		want string
	}{
		{"empty spec", scheduler.Schedule{ID: "a"}, "write five fields"},
		{"four fields", scheduler.Schedule{ID: "a", Spec: "0 9 * *"}, "write five fields"},
		{"seconds field", scheduler.Schedule{ID: "a", Spec: "0 0 9 * * *"}, "write five fields"},
		{"out of range", scheduler.Schedule{ID: "a", Spec: "61 * * * *"}, "write five fields"},
		{"bad descriptor", scheduler.Schedule{ID: "a", Spec: "@fortnightly"}, "@daily"},
		{"bad zone", scheduler.Schedule{ID: "a", Spec: "CRON_TZ=Mars/Base 0 9 * * *"}, "CRON_TZ=Europe/Paris"},
		{"zone alone", scheduler.Schedule{ID: "a", Spec: "CRON_TZ=Europe/Paris"}, "needs a schedule"},
		{"bad id", scheduler.Schedule{ID: "../x", Spec: "@daily"}, "use letters"},
		{"bad overlap", scheduler.Schedule{ID: "a", Spec: "@daily", Overlap: "wait"}, "write skip, queue or allow"},
		{"bad catch-up", scheduler.Schedule{ID: "a", Spec: "@daily", CatchUp: "all"}, "write none or once"},
		{"bad payload", scheduler.Schedule{ID: "a", Spec: "@daily", Payload: []byte("{")}, "not valid JSON"},
		{"every 0s", scheduler.Schedule{ID: "a", Spec: "@every 0s"}, "at least 1m0s apart"},
		{"every -5s", scheduler.Schedule{ID: "a", Spec: "@every -5s"}, "at least 1m0s apart"},
		{"every 1ns", scheduler.Schedule{ID: "a", Spec: "@every 1ns"}, "at least 1m0s apart"},
		{"every 59s in a zone", scheduler.Schedule{ID: "a", Spec: "CRON_TZ=Europe/Paris @every 59s"}, "at least 1m0s apart"},
	}
	e := newEnv(t, true)
	s := e.open(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Add(tc.sc)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Add(%+v) = %v, want an error containing %q", tc.sc, err, tc.want)
			}
		})
	}
	if got := s.List(); len(got) != 0 {
		t.Errorf("List() after invalid Adds = %+v, want none", got)
	}
}

func TestOverlap(t *testing.T) {
	hourly := func(o scheduler.Overlap) scheduler.Schedule {
		return scheduler.Schedule{ID: "h", Spec: "0 * * * *", Overlap: o, Payload: []byte(`{"agent":"a"}`)}
	}
	t.Run("skip", func(t *testing.T) {
		e := newEnv(t, false)
		s := e.open(t)
		mustAdd(t, s, hourly(scheduler.OverlapSkip))
		s.Start()
		e.clock.Set(at(10, 0))
		r := e.job.next(t)
		if !r.Scheduled.Equal(at(10, 0)) || string(r.Payload) != `{"agent":"a"}` {
			t.Errorf("run = %+v, want one due 10:00 with the payload", r)
		}
		if h := history(t, s, "h"); len(h) != 1 || h[0].ID != r.ID || h[0].Started.IsZero() || !h[0].Ended.IsZero() {
			t.Errorf("history while the 10:00 run goes = %+v, want it recorded as started", h)
		}
		e.clock.Set(at(11, 0))
		waitFor(t, "skipped run", func() bool { return len(history(t, s, "h")) == 2 })
		if got := history(t, s, "h")[0]; got.Skipped == "" || !got.Scheduled.Equal(at(11, 0)) {
			t.Errorf("history = %+v, want the 11:00 run skipped", got)
		}
		e.job.none(t)
		e.job.release <- struct{}{}
		waitFor(t, "run recorded", func() bool { return !history(t, s, "h")[1].Ended.IsZero() })
		got := history(t, s, "h")[1] // it keeps its place, before the skipped one
		if got.Result != "exec-"+r.ID || got.Skipped != "" || !got.Ended.Equal(at(11, 0)) {
			t.Errorf("history[0] = %+v, want the 10:00 run ended", got)
		}
		if st := status(t, s, "h"); st.Running != 0 || !st.Next.Equal(at(12, 0)) || st.Last.ID != r.ID {
			t.Errorf("status = %+v, want idle, next 12:00, last %s", st, r.ID)
		}
	})
	t.Run("queue", func(t *testing.T) {
		e := newEnv(t, false)
		s := e.open(t)
		mustAdd(t, s, hourly(scheduler.OverlapQueue))
		s.Start()
		e.clock.Set(at(10, 0))
		e.job.next(t)
		e.clock.Set(at(11, 0))
		waitFor(t, "queued run", func() bool { return status(t, s, "h").Queued })
		e.clock.Set(at(12, 0))
		waitFor(t, "skipped run", func() bool { return len(history(t, s, "h")) == 2 })
		if got := history(t, s, "h")[0]; got.Skipped == "" || !got.Scheduled.Equal(at(12, 0)) {
			t.Errorf("history = %+v, want the 12:00 run skipped", got)
		}
		e.job.none(t)
		e.job.release <- struct{}{}
		if r := e.job.next(t); !r.Scheduled.Equal(at(11, 0)) {
			t.Errorf("queued run = %+v, want the 11:00 one", r)
		}
		if st := status(t, s, "h"); st.Queued || st.Running != 1 {
			t.Errorf("status = %+v, want one running, none queued", st)
		}
		e.job.release <- struct{}{}
		waitFor(t, "runs recorded", func() bool { return len(history(t, s, "h")) == 3 })
	})
	t.Run("allow", func(t *testing.T) {
		e := newEnv(t, false)
		s := e.open(t)
		mustAdd(t, s, hourly(scheduler.OverlapAllow))
		s.Start()
		e.clock.Set(at(10, 0))
		e.job.next(t)
		e.clock.Set(at(11, 0))
		e.job.next(t)
		if st := status(t, s, "h"); st.Running != 2 {
			t.Errorf("Running = %d, want 2", st.Running)
		}
		e.job.release <- struct{}{}
		e.job.release <- struct{}{}
		waitFor(t, "runs recorded", func() bool { return len(history(t, s, "h")) == 2 })
	})
	t.Run("missed hours collapse", func(t *testing.T) {
		e := newEnv(t, true)
		s := e.open(t)
		mustAdd(t, s, hourly(scheduler.OverlapAllow))
		s.Start()
		e.clock.Set(at(15, 30))
		if r := e.job.next(t); !r.Scheduled.Equal(at(10, 0)) {
			t.Errorf("run = %+v, want the 10:00 one", r)
		}
		e.job.none(t)
		waitFor(t, "next computed", func() bool { return status(t, s, "h").Next.Equal(at(16, 0)) })
	})
}

func TestCatchUp(t *testing.T) {
	cases := []struct {
		name    string
		policy  scheduler.CatchUp
		restart time.Time
		want    time.Time // the catch-up run's due time; zero for none
	}{
		{"once after downtime", scheduler.CatchUpOnce, at(14, 30), at(14, 0)},
		{"none after downtime", scheduler.CatchUpNone, at(14, 30), time.Time{}},
		{"once without a missed run", scheduler.CatchUpOnce, at(10, 45), time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, true)
			s := e.open(t)
			mustAdd(t, s, scheduler.Schedule{ID: "h", Spec: "0 * * * *", CatchUp: tc.policy})
			s.Start()
			e.clock.Set(at(10, 0))
			e.job.next(t)
			waitFor(t, "run recorded", func() bool { return len(history(t, s, "h")) == 1 })
			if err := s.Close(context.Background()); err != nil {
				t.Fatal(err)
			}

			e.clock.Set(tc.restart) // nothing runs while down
			s = e.open(t)
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.want.IsZero() {
				e.job.none(t)
			} else {
				r := e.job.next(t)
				if !r.CatchUp || !r.Scheduled.Equal(tc.want) || !r.Started.Equal(tc.restart) {
					t.Errorf("catch-up run = %+v, want due %v started %v", r, tc.want, tc.restart)
				}
				e.job.none(t)
				waitFor(t, "catch-up recorded", func() bool { return len(history(t, s, "h")) == 2 })
			}
			if got, want := status(t, s, "h").Next, tc.restart.Truncate(time.Hour).Add(time.Hour); !got.Equal(want) {
				t.Errorf("Next = %v, want %v", got, want)
			}
		})
	}
	t.Run("never ran", func(t *testing.T) {
		e := newEnv(t, true)
		s := e.open(t)
		mustAdd(t, s, scheduler.Schedule{ID: "d", Spec: "@daily", CatchUp: scheduler.CatchUpOnce})
		s.Close(context.Background())
		e.clock.Set(at(48+1, 0))
		s = e.open(t)
		s.Start()
		if r := e.job.next(t); !r.CatchUp || !r.Scheduled.Equal(at(48, 0)) {
			t.Errorf("catch-up run = %+v, want one due %v", r, at(48, 0))
		}
	})
}

func TestPersistence(t *testing.T) {
	e := newEnv(t, true)
	s := e.open(t)
	mustAdd(t, s, scheduler.Schedule{ID: "a", Spec: "@hourly", Overlap: scheduler.OverlapQueue, Payload: []byte(`{"prompt":"hi"}`)})
	mustAdd(t, s, scheduler.Schedule{ID: "b", Spec: "CRON_TZ=Europe/Paris 0 9 * * *", Paused: true})
	mustAdd(t, s, scheduler.Schedule{ID: "c", Spec: "@daily"})
	if err := s.Remove("c"); err != nil {
		t.Fatalf("Remove(c): %v", err)
	}
	if err := s.Remove("c"); !errors.Is(err, scheduler.ErrNotFound) {
		t.Errorf("Remove(c) again = %v, want ErrNotFound", err)
	}
	s.Start()
	e.clock.Set(at(10, 0))
	r := e.job.next(t)
	waitFor(t, "run recorded", func() bool { return len(history(t, s, "a")) == 1 })
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := s.Add(scheduler.Schedule{ID: "d", Spec: "@daily"}); !errors.Is(err, scheduler.ErrClosed) {
		t.Errorf("Add after Close = %v, want ErrClosed", err)
	}

	s = e.open(t)
	got := s.List()
	if len(got) != 2 || got[0].Schedule.ID != "a" || got[1].Schedule.ID != "b" {
		t.Fatalf("List() after reopen = %+v, want a, b", got)
	}
	a, b := got[0], got[1]
	if a.Schedule.Overlap != scheduler.OverlapQueue || a.Schedule.CatchUp != scheduler.CatchUpNone || !a.Schedule.Created.Equal(t0) ||
		a.Last == nil || a.Last.ID != r.ID || a.Last.Result != "exec-"+r.ID {
		t.Errorf("a after reopen = %+v (last %+v)", a, a.Last)
	}
	if !b.Schedule.Paused || b.Schedule.Spec != "CRON_TZ=Europe/Paris 0 9 * * *" || b.Last != nil {
		t.Errorf("b after reopen = %+v", b)
	}
}

// TestCreate: Create refuses an id in use (ErrExists) and leaves the
// schedule as it was, where Add replaces it.
func TestCreate(t *testing.T) {
	e := newEnv(t, true)
	s := e.open(t)
	if err := s.Create(scheduler.Schedule{ID: "a", Spec: "@hourly"}); err != nil {
		t.Fatalf("Create(a) = %v", err)
	}
	if err := s.Create(scheduler.Schedule{ID: "a", Spec: "@daily"}); !errors.Is(err, scheduler.ErrExists) {
		t.Errorf("Create(a) again = %v, want ErrExists", err)
	}
	if got := status(t, s, "a"); got.Schedule.Spec != "@hourly" {
		t.Errorf("a after a refused Create = %+v, want @hourly kept", got.Schedule)
	}
	mustAdd(t, s, scheduler.Schedule{ID: "a", Spec: "@daily"})
	if got := status(t, s, "a"); got.Schedule.Spec != "@daily" {
		t.Errorf("a after Add = %+v, want @daily", got.Schedule)
	}
}

// TestSavedTooOften: a schedule saved before the minimum interval existed
// does not stop the scheduler from opening; it is kept, paused, and
// never fires.
func TestSavedTooOften(t *testing.T) {
	e := newEnv(t, true)
	st, err := scheduler.OpenFileStore(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SaveSchedules(context.Background(), []scheduler.Schedule{{ID: "fast", Spec: "@every 1s", Created: t0}}); err != nil {
		t.Fatal(err)
	}
	s := e.open(t)
	if got := status(t, s, "fast"); !got.Schedule.Paused || !got.Next.IsZero() {
		t.Errorf("fast after open = %+v, want it paused with no next run", got)
	}
	s.Start()
	e.clock.Set(t0.Add(time.Hour))
	e.job.none(t)
}

func TestRunNow(t *testing.T) {
	e := newEnv(t, false)
	s := e.open(t)
	mustAdd(t, s, scheduler.Schedule{ID: "p", Spec: "@daily", Paused: true})
	mustAdd(t, s, scheduler.Schedule{ID: "q", Spec: "@daily", Overlap: scheduler.OverlapQueue})
	if _, err := s.RunNow("nope"); !errors.Is(err, scheduler.ErrNotFound) {
		t.Errorf("RunNow(nope) = %v, want ErrNotFound", err)
	}
	// Works before Start and on a paused schedule.
	id, err := s.RunNow("p")
	if err != nil {
		t.Fatalf("RunNow(p): %v", err)
	}
	if r := e.job.next(t); r.ID != id || !r.Manual || !r.Scheduled.Equal(t0) {
		t.Errorf("run = %+v, want manual run %s due now", r, id)
	}
	if _, err := s.RunNow("p"); !errors.Is(err, scheduler.ErrBusy) {
		t.Errorf("RunNow(p) while running = %v, want ErrBusy", err)
	}
	s.RunNow("q")
	e.job.next(t)
	if _, err := s.RunNow("q"); err != nil {
		t.Errorf("RunNow(q) while running = %v, want it queued", err)
	}
	if _, err := s.RunNow("q"); !errors.Is(err, scheduler.ErrBusy) {
		t.Errorf("RunNow(q) with one queued = %v, want ErrBusy", err)
	}
	e.job.release <- struct{}{}
	e.job.release <- struct{}{}
	e.job.next(t)
	e.job.release <- struct{}{}
	ended := func(id string, n int) bool {
		h := history(t, s, id)
		return len(h) == n && !h[0].Ended.IsZero() && !h[n-1].Ended.IsZero()
	}
	waitFor(t, "runs recorded", func() bool { return ended("p", 1) && ended("q", 2) })
	if h := history(t, s, "p"); h[0].ID != id || h[0].Result != "exec-"+id || !h[0].Manual {
		t.Errorf("history(p) = %+v", h)
	}
}

func TestClose(t *testing.T) {
	t.Run("waits for a running job", func(t *testing.T) {
		e := newEnv(t, false)
		s := e.open(t)
		mustAdd(t, s, scheduler.Schedule{ID: "a", Spec: "@daily"})
		s.Start()
		s.RunNow("a")
		e.job.next(t)
		closed := make(chan error, 1)
		go func() { closed <- s.Close(context.Background()) }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned %v while a job was running", err)
		case <-time.After(20 * time.Millisecond):
		}
		if _, err := s.RunNow("a"); !errors.Is(err, scheduler.ErrClosed) {
			t.Errorf("RunNow while closing = %v, want ErrClosed", err)
		}
		e.job.release <- struct{}{}
		if err := <-closed; err != nil {
			t.Errorf("Close = %v, want nil", err)
		}
		if h := history(t, s, "a"); len(h) != 1 || h[0].Result == "" {
			t.Errorf("history = %+v, want the run recorded before Close returned", h)
		}
	})
	t.Run("deadline cancels jobs", func(t *testing.T) {
		e := newEnv(t, false)
		s := e.open(t)
		mustAdd(t, s, scheduler.Schedule{ID: "a", Spec: "@daily", Overlap: scheduler.OverlapQueue})
		s.Start()
		s.RunNow("a")
		e.job.next(t)
		s.RunNow("a") // queued, dropped on Close
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := s.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close with a short deadline = %v, want DeadlineExceeded", err)
		}
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("second Close = %v, want nil once the job returned", err)
		}
		h := history(t, s, "a")
		if len(h) != 2 || h[0].Skipped == "" || h[1].Err != context.Canceled.Error() {
			t.Errorf("history = %+v, want the queued run skipped and the running one cancelled", h)
		}
		e.job.none(t)
	})
}

// TestAligned: with Options.Aligned, two schedulers started at different
// times put an "@every" schedule's due times on the same multiples of
// its interval (as a cluster's nodes need); without, each counts from
// its own start.
func TestAligned(t *testing.T) {
	e := newEnv(t, true)
	e.clock.Set(at(9, 7).Add(13 * time.Second))
	st, err := scheduler.OpenFileStore(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, aligned := range []bool{true, false} {
		s, err := scheduler.New(st, e.job.run, scheduler.Options{Clock: e.clock, Location: time.UTC, Aligned: aligned})
		if err != nil {
			t.Fatal(err)
		}
		mustAdd(t, s, scheduler.Schedule{ID: "tick", Spec: "@every 5m"})
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		want := at(9, 10)
		if !aligned {
			want = at(9, 12).Add(13 * time.Second)
		}
		if got := status(t, s, "tick").Next; !got.Equal(want) {
			t.Errorf("aligned %v: Next = %v, want %v", aligned, got, want)
		}
		s.Close(context.Background())
	}
}
