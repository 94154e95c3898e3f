package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrWriteFailed wraps a write the database refused for a reason outside
// the caller's control (the disk is full, an I/O error, the file went
// read-only). Spend, Release and an UpdateExecution that ends an
// execution are then kept in memory and written once the store can be
// written again (see WriteError); other writes are simply refused.
var ErrWriteFailed = errors.New("store write failed")

// retryEvery is how often kept writes are tried again.
const retryEvery = 250 * time.Millisecond

// writes is the store's record of failed writes and of what it keeps to
// write once it can.
type writes struct {
	// endMu orders UpdateExecution and the retrier's writes of kept final
	// records, so a kept record never lands over a later update.
	endMu    sync.Mutex
	mu       sync.Mutex
	err      error     // the latest write failure; nil once a write succeeds
	since    time.Time // of the first failure in a row
	last     error     // the latest write failure, kept after a success (LastWriteFailure)
	lastAt   time.Time
	kept     []keptWrite
	ended    map[string]Execution // by id: final records not written yet
	watchers []func(err error, executions []string)
	wake     chan struct{} // capacity 1: something was kept
}

// keptWrite is a ledger write waiting for the disk, in order.
type keptWrite struct {
	what string
	fn   func(ctx context.Context) error
}

func (w *writes) init() {
	w.ended = map[string]Execution{}
	w.wake = make(chan struct{}, 1)
}

// writeFailure reports whether err is the database failing to write
// (rather than the caller's mistake, such as a constraint or a missing
// row).
func writeFailure(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err != nil && pgWriteFailure(err)
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN,
		sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_PROTOCOL:
		return true
	}
	return false
}

// WriteError returns since when writes have been failing and the latest
// write the database refused (wrapping ErrWriteFailed), or a nil error
// once a write has succeeded since. The daemon reports it as the store's
// health.
func (s *Store) WriteError() (since time.Time, err error) {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	if s.wr.err == nil {
		return time.Time{}, nil
	}
	return s.wr.since, fmt.Errorf("%w: %w", ErrWriteFailed, s.wr.err)
}

// LastWriteFailure returns when the database last refused a write and
// that write's error, even once writes succeed again (WriteError is then nil): a disk
// that filled, stopped executions and was freed, or that still fills up
// with writes going through in between, stays visible. Nil if none has
// failed since the store was opened.
func (s *Store) LastWriteFailure() (at time.Time, err error) {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	if s.wr.last == nil {
		return time.Time{}, nil
	}
	return s.wr.lastAt, fmt.Errorf("%w: %w", ErrWriteFailed, s.wr.last)
}

// OnWriteFailure calls fn, in its own goroutine, each time the database
// refuses a write, with the executions whose record or events it lost
// (none for writes that concern no execution). The runner uses it to
// stop those executions. fn must not block for long.
func (s *Store) OnWriteFailure(fn func(err error, executions []string)) {
	s.wr.mu.Lock()
	s.wr.watchers = append(s.wr.watchers, fn)
	s.wr.mu.Unlock()
}

// wrote notes the outcome of a write: a success clears the store's write
// error, a write failure sets it and tells the watchers which executions
// it concerns. It returns err.
func (s *Store) wrote(err error, executions ...string) error {
	if err != nil && !writeFailure(err) {
		return err
	}
	s.wr.mu.Lock()
	if err == nil {
		s.wr.err, s.wr.since = nil, time.Time{}
		s.wr.mu.Unlock()
		return nil
	}
	if s.wr.err == nil {
		s.wr.since = time.Now()
	}
	s.wr.err = err
	s.wr.last, s.wr.lastAt = err, time.Now()
	watchers := slices.Clone(s.wr.watchers)
	s.wr.mu.Unlock()
	slices.Sort(executions)
	executions = slices.Compact(executions)
	for _, fn := range watchers {
		go fn(fmt.Errorf("%w: %w", ErrWriteFailed, err), executions)
	}
	return err
}

// keep queues a ledger write to be retried, in order, once the database
// can be written again.
func (s *Store) keep(what string, fn func(ctx context.Context) error) {
	s.wr.mu.Lock()
	s.wr.kept = append(s.wr.kept, keptWrite{what, fn})
	s.wr.mu.Unlock()
	s.wr.signal()
}

// keepEnded holds an execution's final record, which the database
// refused, so that reads return it at once and the retrier writes it.
func (s *Store) keepEnded(e Execution) {
	s.wr.mu.Lock()
	s.wr.ended[e.ID] = e
	s.wr.mu.Unlock()
	s.wr.signal()
}

func (w *writes) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// forgetEnded drops the final record of id held in memory, if any.
func (s *Store) forgetEnded(id string) {
	s.wr.mu.Lock()
	delete(s.wr.ended, id)
	s.wr.mu.Unlock()
}

// keptEnded returns the final record of id held in memory, if any.
func (s *Store) keptEnded(id string) (Execution, bool) {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	e, ok := s.wr.ended[id]
	return e, ok
}

// overlay replaces, in list, the executions whose final record is held in
// memory, and drops those the filter's statuses no longer select.
func (s *Store) overlay(list []Execution, statuses []Status) []Execution {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	if len(s.wr.ended) == 0 {
		return list
	}
	out := list[:0]
	for _, e := range list {
		if k, ok := s.wr.ended[e.ID]; ok {
			e = k
		}
		if len(statuses) == 0 || slices.Contains(statuses, e.Status) {
			out = append(out, e)
		}
	}
	return out
}

// retrier writes what was kept, oldest first, until it is all written;
// at Close it tries once more.
func (s *Store) retrier() {
	defer s.wg.Done()
	t := time.NewTicker(retryEvery)
	defer t.Stop()
	for {
		select {
		case <-s.wr.wake:
		case <-t.C:
		case <-s.closing:
			s.writeKept()
			return
		}
		s.writeKept()
	}
}

// writeKept tries the kept ledger writes in order, stopping at the first
// that fails, then the kept final records.
func (s *Store) writeKept() {
	ctx := context.Background()
	for {
		s.wr.mu.Lock()
		if len(s.wr.kept) == 0 {
			s.wr.mu.Unlock()
			break
		}
		k := s.wr.kept[0]
		s.wr.mu.Unlock()
		if err := k.fn(ctx); writeFailure(err) {
			s.wrote(err)
			return
		}
		// Done, or refused for good (a caller's error cannot heal): either
		// way it leaves the queue.
		s.wr.mu.Lock()
		s.wr.kept = s.wr.kept[1:]
		s.wr.mu.Unlock()
	}
	s.wr.mu.Lock()
	ended := make([]Execution, 0, len(s.wr.ended))
	for _, e := range s.wr.ended {
		ended = append(ended, e)
	}
	s.wr.mu.Unlock()
	for _, e := range ended {
		err := s.writeEnded(ctx, e)
		if writeFailure(err) {
			s.wrote(err)
			return
		}
		s.wr.mu.Lock()
		if cur, ok := s.wr.ended[e.ID]; ok && cur.Status == e.Status && cur.Ended.Equal(e.Ended) {
			delete(s.wr.ended, e.ID)
		}
		s.wr.mu.Unlock()
	}
}

// writeEnded writes a kept final record, unless the stored one has moved
// on in a way it cannot follow.
func (s *Store) writeEnded(ctx context.Context, e Execution) error {
	s.wr.endMu.Lock()
	defer s.wr.endMu.Unlock()
	if k, ok := s.keptEnded(e.ID); !ok || k.Status != e.Status || !k.Ended.Equal(e.Ended) {
		return nil // an update was written over it since
	}
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	old, err := getExecution(ctx, tx, e.ID)
	if err != nil {
		return err
	}
	if !old.Status.CanBecome(e.Status) {
		return nil
	}
	micros, tokens := withTotals(old, &e)
	if err := writeExecution(ctx, tx, &e); err != nil {
		return err
	}
	if err := addTotals(ctx, tx, e.ID, micros, tokens); err != nil {
		return err
	}
	return s.wrote(tx.Commit())
}
