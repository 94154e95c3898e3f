package scheduler

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
)

// Job does one run. ctx is cancelled when Close gives up waiting; run
// says which schedule, due time and Payload it is for. The result (for the
// appliance, the execution's id) and error are recorded in the history.
type Job func(ctx context.Context, run Run) (result string, err error)

// Options tune a Scheduler; the zero value is ready to use.
type Options struct {
	// Clock defaults to the real clock.
	Clock Clock
	// Location is the time zone of specs without CRON_TZ=; default Local.
	Location *time.Location
	// Logger reports store errors the scheduler cannot return; default
	// slog.Default().
	Logger *slog.Logger
	// Aligned puts "@every D" due times on multiples of D since the Unix
	// epoch rather than D after the previous one, so that schedulers
	// started at different times (a cluster's nodes) agree on them.
	Aligned bool
}

// Status is a schedule as it stands.
type Status struct {
	Schedule Schedule
	// Next is the next due time; zero when paused or not started.
	Next time.Time
	// Last is the latest recorded run, if any.
	Last    *Run
	Running int
	Queued  bool
}

type entry struct {
	sched   Schedule
	spec    cron.Schedule
	next    time.Time
	last    *Run
	running int
	queued  *Run
}

// Scheduler runs Jobs on Schedules. Create it with New, then Start; Close
// stops it.
type Scheduler struct {
	store Store
	job   Job
	clock Clock
	loc   *time.Location
	log   *slog.Logger
	// aligned: see Options.Aligned.
	aligned bool

	ctx    context.Context // of runs; cancelled when Close gives up
	cancel context.CancelFunc
	wake   chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup

	mu        sync.Mutex
	entries   map[string]*entry
	started   bool
	closed    bool
	running   int // runs going, of all schedules, removed ones included
	closeOnce sync.Once
	idle      chan struct{} // closed once every goroutine has exited
}

// New loads the saved schedules and their last runs from store. Nothing
// runs until Start.
func New(store Store, job Job, opts Options) (*Scheduler, error) {
	s := &Scheduler{
		store: store, job: job, clock: opts.Clock, loc: opts.Location, log: opts.Logger, aligned: opts.Aligned,
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
		entries: make(map[string]*entry), idle: make(chan struct{}),
	}
	if s.clock == nil {
		s.clock = realClock{}
	}
	if s.loc == nil {
		s.loc = time.Local
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	ctx := context.Background()
	saved, err := store.LoadSchedules(ctx)
	if err != nil {
		return nil, fmt.Errorf("load schedules: %w", err)
	}
	for _, sc := range saved {
		e, err := s.newEntry(sc)
		if errors.Is(err, ErrTooOften) {
			// Saved before MinEvery existed: keep it, paused, so it
			// neither fires every second nor stops the daemon.
			s.log.Error("scheduler: paused a saved schedule that runs too often: remove it and add it again less often", "schedule", sc.ID, "err", err)
			e, err = s.savedEntry(sc)
		}
		if err != nil {
			return nil, fmt.Errorf("saved %w", err)
		}
		if e.last, err = s.closeInterrupted(ctx, sc.ID); err != nil {
			return nil, err
		}
		s.entries[sc.ID] = e
	}
	return s, nil
}

// closeInterrupted marks the runs of schedule id that were recorded as
// started but never ended (the process died under them) as ended now with
// ErrInterrupted, and returns the latest run. A run whose record cannot be
// updated is logged and left as it was: its history entry still shows it.
func (s *Scheduler) closeInterrupted(ctx context.Context, id string) (*Run, error) {
	runs, err := s.store.ListRuns(ctx, id, 0)
	if err != nil {
		return nil, fmt.Errorf("schedule %s: load history: %w", id, err)
	}
	now := s.clock.Now()
	for i := range runs {
		r := &runs[i]
		if r.Started.IsZero() || !r.Ended.IsZero() || r.Skipped != "" {
			continue
		}
		r.Ended, r.Err = now, ErrInterrupted.Error()
		if err := s.store.AppendRun(ctx, *r); err != nil {
			s.log.Error("scheduler: record interrupted run", "schedule", id, "run", r.ID, "err", err)
		}
	}
	if len(runs) == 0 {
		return nil, nil
	}
	return &runs[0], nil
}

func (s *Scheduler) newEntry(sc Schedule) (*entry, error) {
	if err := sc.normalize(); err != nil {
		return nil, err
	}
	spec, err := ParseSpec(sc.Spec, s.loc)
	if err != nil {
		return nil, fmt.Errorf("schedule %s: %w", sc.ID, err)
	}
	return &entry{sched: sc, spec: spec}, nil
}

// savedEntry is newEntry, paused, for a spec only MinEvery refuses.
func (s *Scheduler) savedEntry(sc Schedule) (*entry, error) {
	sc.Paused = true
	if err := sc.normalize(); err != nil {
		return nil, err
	}
	spec, err := parseSpec(sc.Spec, s.loc)
	if err != nil {
		return nil, fmt.Errorf("schedule %s: %w", sc.ID, err)
	}
	return &entry{sched: sc, spec: spec}, nil
}

// Start catches up missed runs (for schedules with CatchUp once), computes
// next times and starts the timing goroutine. Calling it again does
// nothing; after Close it returns ErrClosed.
func (s *Scheduler) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.started {
		return nil
	}
	s.started = true
	now := s.clock.Now()
	for _, e := range s.sortedEntries() {
		if !e.sched.Paused && e.sched.CatchUp == CatchUpOnce {
			if missed, ok := lastMissed(e, now); ok {
				s.dispatchLocked(e, Run{Scheduled: missed, CatchUp: true}, false)
			}
		}
		s.planLocked(e, now)
	}
	s.wg.Add(1)
	go s.loop()
	return nil
}

// lastMissed returns the latest due time in (reference, now], where the
// reference is when the schedule last ran (or was due, or was created).
func lastMissed(e *entry, now time.Time) (time.Time, bool) {
	ref := e.sched.Created
	if e.last != nil {
		ref = e.last.Scheduled
		if e.last.Started.After(ref) {
			ref = e.last.Started
		}
	}
	if ref.IsZero() {
		return time.Time{}, false
	}
	var missed time.Time
	// Bounded: an every-minute schedule down for years stops counting.
	for t, i := e.spec.Next(ref), 0; !t.IsZero() && !t.After(now) && i < 1_000_000; t, i = e.spec.Next(t), i+1 {
		missed = t
	}
	return missed, !missed.IsZero()
}

func (s *Scheduler) planLocked(e *entry, now time.Time) {
	e.next = time.Time{}
	if !e.sched.Paused && s.started && !s.closed {
		e.next = e.spec.Next(now)
		if every, ok := e.spec.(cron.ConstantDelaySchedule); ok && s.aligned {
			e.next = now.Truncate(every.Delay).Add(every.Delay)
		}
	}
}

func (s *Scheduler) sortedEntries() []*entry {
	ids := make([]string, 0, len(s.entries))
	for id := range s.entries {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]*entry, len(ids))
	for i, id := range ids {
		out[i] = s.entries[id]
	}
	return out
}

// loop fires due schedules and sleeps until the next due time, a change,
// or Close.
func (s *Scheduler) loop() {
	defer s.wg.Done()
	for {
		next := s.fireDue()
		var c <-chan time.Time
		release := func() {}
		if !next.IsZero() {
			c, release = s.clock.WakeAt(next)
		}
		select {
		case <-c:
		case <-s.wake:
		case <-s.stop:
			release()
			return
		}
		release()
	}
}

// fireDue dispatches every schedule due by now and returns the earliest
// next due time (zero if none).
func (s *Scheduler) fireDue() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var earliest time.Time
	for _, e := range s.sortedEntries() {
		if e.next.IsZero() {
			continue
		}
		if !e.next.After(now) {
			// Due times passed while asleep collapse into this one run.
			s.dispatchLocked(e, Run{Scheduled: e.next}, false)
			e.next = e.spec.Next(now)
		}
		if !e.next.IsZero() && (earliest.IsZero() || e.next.Before(earliest)) {
			earliest = e.next
		}
	}
	return earliest
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// dispatchLocked starts r, queues it or records it as skipped, following
// the schedule's overlap policy. With strict, a run that cannot start now
// is refused with ErrBusy instead.
func (s *Scheduler) dispatchLocked(e *entry, r Run, strict bool) (string, error) {
	r.ID = rand.Text()
	r.Schedule = e.sched.ID
	r.Payload = e.sched.Payload
	if e.running > 0 {
		switch {
		case e.sched.Overlap == OverlapAllow:
		case e.sched.Overlap == OverlapQueue && e.queued == nil:
			e.queued = &r
			return r.ID, nil
		case strict:
			return "", fmt.Errorf("schedule %s: %w (overlap policy %s)", e.sched.ID, ErrBusy, e.sched.Overlap)
		case e.sched.Overlap == OverlapQueue:
			r.Skipped = "a run is already queued behind the running one"
			s.recordLocked(e, r)
			return r.ID, nil
		default:
			r.Skipped = "the previous run was still running"
			s.recordLocked(e, r)
			return r.ID, nil
		}
	}
	s.startLocked(e, r)
	return r.ID, nil
}

func (s *Scheduler) startLocked(e *entry, r Run) {
	e.running++
	s.running++
	r.Started = s.clock.Now()
	// Recorded now, not only at the end, so a crash leaves it in the history.
	s.recordLocked(e, r)
	s.wg.Add(1)
	go s.run(e, r)
}

func (s *Scheduler) run(e *entry, r Run) {
	defer s.wg.Done()
	rep := &reporter{s: s, e: e, r: r}
	result, err := s.job(context.WithValue(s.ctx, reporterKey{}, rep), r)
	rep.done()
	s.mu.Lock()
	defer s.mu.Unlock()
	r.Ended = s.clock.Now()
	r.Result = result
	if err != nil {
		r.Err = err.Error()
	}
	s.recordLocked(e, r)
	e.running--
	s.running--
	if q := e.queued; q != nil && e.running == 0 {
		e.queued = nil
		if s.closed {
			q.Skipped = "the scheduler closed before the queued run could start"
			s.recordLocked(e, *q)
		} else {
			s.startLocked(e, *q)
		}
	}
}

// recordLocked appends r to the history. The store is called under the
// lock so history order matches event order; a Store is expected to be
// quick (a file append, an SQLite insert).
func (s *Scheduler) recordLocked(e *entry, r Run) {
	e.last = &r
	if err := s.store.AppendRun(context.Background(), r); err != nil {
		s.log.Error("scheduler: record run", "schedule", r.Schedule, "run", r.ID, "err", err)
	}
}

// Add validates sc and saves it, replacing any schedule with the same ID
// (its running runs carry on). Errors say what to write instead.
func (s *Scheduler) Add(sc Schedule) error { return s.add(sc, true) }

// Create is Add for a new schedule only: one with the same ID is
// ErrExists, checked and saved under one lock.
func (s *Scheduler) Create(sc Schedule) error { return s.add(sc, false) }

func (s *Scheduler) add(sc Schedule, replace bool) error {
	e, err := s.newEntry(sc)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if old := s.entries[sc.ID]; old != nil && !replace {
		return fmt.Errorf("schedule %s: %w", sc.ID, ErrExists)
	}
	if old := s.entries[sc.ID]; old != nil {
		e.last, e.running, e.queued = old.last, old.running, old.queued
		if e.sched.Created.IsZero() {
			e.sched.Created = old.sched.Created
		}
	}
	if e.sched.Created.IsZero() {
		e.sched.Created = s.clock.Now()
	}
	entries := withEntry(s.entries, e)
	if err := s.saveLocked(entries); err != nil {
		return err
	}
	s.entries = entries
	s.planLocked(e, s.clock.Now())
	s.poke()
	return nil
}

// withEntry returns a copy of m with e set, so a failed save changes nothing.
func withEntry(m map[string]*entry, e *entry) map[string]*entry {
	out := make(map[string]*entry, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	out[e.sched.ID] = e
	return out
}

func (s *Scheduler) saveLocked(entries map[string]*entry) error {
	ids := make([]string, 0, len(entries))
	for id := range entries {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	list := make([]Schedule, len(ids))
	for i, id := range ids {
		list[i] = entries[id].sched
	}
	if err := s.store.SaveSchedules(context.Background(), list); err != nil {
		return fmt.Errorf("save schedules: %w", err)
	}
	return nil
}

// Remove deletes a schedule; its running runs carry on and are recorded,
// its history stays. An unknown id is ErrNotFound.
func (s *Scheduler) Remove(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.entries[id] == nil {
		return fmt.Errorf("schedule %s: %w", id, ErrNotFound)
	}
	entries := make(map[string]*entry, len(s.entries))
	for k, v := range s.entries {
		if k != id {
			entries[k] = v
		}
	}
	if err := s.saveLocked(entries); err != nil {
		return err
	}
	s.entries[id].queued = nil
	s.entries = entries
	s.poke()
	return nil
}

// List returns every schedule's status, sorted by ID.
func (s *Scheduler) List() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Status
	for _, e := range s.sortedEntries() {
		st := Status{Schedule: e.sched, Next: e.next, Running: e.running, Queued: e.queued != nil}
		if e.last != nil {
			last := *e.last
			st.Last = &last
		}
		out = append(out, st)
	}
	return out
}

// RunNow starts a manual run of schedule id, paused or not, and returns
// the run's ID. The overlap policy applies: while a run is going, skip
// refuses with ErrBusy, queue queues it (ErrBusy if one already waits),
// allow starts it. It works before Start, not after Close.
func (s *Scheduler) RunNow(id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", ErrClosed
	}
	e := s.entries[id]
	if e == nil {
		return "", fmt.Errorf("schedule %s: %w", id, ErrNotFound)
	}
	return s.dispatchLocked(e, Run{Scheduled: s.clock.Now(), Manual: true}, true)
}

// History returns up to limit of schedule id's runs, newest first; limit
// <= 0 means all.
func (s *Scheduler) History(ctx context.Context, id string, limit int) ([]Run, error) {
	runs, err := s.store.ListRuns(ctx, id, limit)
	if err != nil {
		return nil, fmt.Errorf("schedule %s: history: %w", id, err)
	}
	return runs, nil
}

// Close stops scheduling, drops queued runs (recorded as skipped) and
// waits for running jobs until ctx is done; then it cancels their context
// and returns an error naming how many were left. It is idempotent: every
// call waits the same way.
func (s *Scheduler) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for _, e := range s.entries {
			e.next = time.Time{}
		}
		s.mu.Unlock()
		close(s.stop)
		// Not counted in wg: it is the one waiting on it, and exits then.
		go func() {
			s.wg.Wait()
			s.cancel()
			close(s.idle)
		}()
	})
	select {
	case <-s.idle:
		return nil
	case <-ctx.Done():
	}
	s.cancel()
	s.mu.Lock()
	n := s.running
	s.mu.Unlock()
	return fmt.Errorf("close scheduler: %d runs still going after cancelling them: %w", n, ctx.Err())
}

type reporterKey struct{}

// reporter lets a Job record its result while it is still going.
type reporter struct {
	s     *Scheduler
	e     *entry
	mu    sync.Mutex
	r     Run
	ended bool
}

func (rep *reporter) done() {
	rep.mu.Lock()
	rep.ended = true
	rep.mu.Unlock()
}

// ReportResult records result (for the appliance, the execution's id) in
// the history of the run whose Job was given ctx, before the Job returns:
// if the process dies during the run, its history entry still names what
// it started. Outside a Job, or once the Job has returned, it does
// nothing. The Job's own return value is what is recorded at the end.
func ReportResult(ctx context.Context, result string) {
	rep, _ := ctx.Value(reporterKey{}).(*reporter)
	if rep == nil {
		return
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.ended {
		return
	}
	rep.r.Result = result
	rep.s.mu.Lock()
	defer rep.s.mu.Unlock()
	rep.s.recordLocked(rep.e, rep.r)
}
