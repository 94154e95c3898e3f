package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"hearth/agents/stream"
)

const (
	// maxBatchEvents bounds one group commit.
	maxBatchEvents = 1024
	// maxCachedExecutions bounds the cache of next seqs; past it, entries
	// with nothing in flight are forgotten (they are refilled from the
	// table when needed).
	maxCachedExecutions = 10000
	// maxQueued bounds the events accepted and not yet taken by the
	// writer: past it, appends wait for the disk (backpressure) instead
	// of growing memory without end.
	maxQueued = 4 * maxBatchEvents
)

// queue orders appends: an Append assigns its seqs and joins the queue in
// one critical section, so the queue is in seq order, and the writer
// commits it front to back.
type queue struct {
	mu       sync.Mutex
	reqs     []*appendReq
	queued   int                   // events in reqs
	space    *sync.Cond            // on mu: queued fell below maxQueued, or closed
	streams  map[string]*execState // by execution
	closed   bool
	asyncErr error // the first failure of an AppendAsync since the last Flush

	wake chan struct{} // capacity 1: the queue is not empty
}

// An appendReq is one Append call waiting for the writer.
type appendReq struct {
	evs  []stream.Event
	err  error
	done chan struct{} // nil for AppendAsync
}

// execState is what the store knows of an execution's stream.
type execState struct {
	session  string
	assigned int64 // the last seq given out
	stored   int64 // the last seq committed
}

func (q *queue) init() {
	q.streams = make(map[string]*execState)
	q.space = sync.NewCond(&q.mu)
	q.wake = make(chan struct{}, 1)
}

// Append stores events, each of an existing execution, and returns them
// with their Seq assigned (and Session filled in when empty; a Session
// that is not the execution's is ErrInvalid; an unknown execution is
// ErrNotFound). Seqs of one execution run from 1 without gaps in the
// order the store accepts events, whatever number of goroutines append.
// One call is atomic: all its events are stored or none. Events of
// concurrent calls share one transaction (group commit). When Append
// returns, the events are durable and have been offered to live
// subscribers. ctx is not consulted once the events are accepted.
func (s *Store) Append(ctx context.Context, evs ...stream.Event) ([]stream.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("append events: %w", err)
	}
	r, err := s.accept(evs, make(chan struct{}))
	if err != nil || r == nil {
		return nil, err
	}
	<-r.done
	if r.err != nil {
		return nil, r.err
	}
	return r.evs, nil
}

// AppendAsync is Append without waiting for the commit: it checks the
// events, assigns their seqs and queues them, and returns at once (unless
// the disk is so far behind that the queue is full: then it waits). They
// are stored by the next group commit, in order with every other append,
// and reach subscribers only then. If that commit fails they are lost
// (the stream stays gap-free: later events take their seqs) and Flush
// reports it. This is the producer's fast path: it never waits for disk.
func (s *Store) AppendAsync(evs ...stream.Event) ([]stream.Event, error) {
	r, err := s.accept(evs, nil)
	if err != nil || r == nil {
		return nil, err
	}
	return slices.Clone(r.evs), nil
}

// Flush waits until every event accepted before it is stored, and returns
// the error of any AppendAsync whose events were lost since the last
// Flush.
func (s *Store) Flush(ctx context.Context) error {
	r := &appendReq{done: make(chan struct{})}
	s.q.mu.Lock()
	if s.q.closed {
		s.q.mu.Unlock()
		return fmt.Errorf("flush events: %w", ErrClosed)
	}
	s.q.reqs = append(s.q.reqs, r)
	s.q.mu.Unlock()
	s.q.signal()
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("flush events: %w", ctx.Err())
	}
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	err := s.q.asyncErr
	s.q.asyncErr = nil
	return err
}

// accept checks events, assigns their seqs and queues them. It returns a
// nil request for no events.
func (s *Store) accept(evs []stream.Event, done chan struct{}) (*appendReq, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	r := &appendReq{evs: slices.Clone(evs), done: done}
	now := time.Now().UTC()
	for i := range r.evs {
		if err := prepare(&r.evs[i], now); err != nil {
			return nil, err
		}
	}
	q := &s.q
	q.mu.Lock()
	for q.queued >= maxQueued && !q.closed {
		q.space.Wait()
	}
	if q.closed {
		q.mu.Unlock()
		return nil, fmt.Errorf("append events: %w", ErrClosed)
	}
	if err := s.assign(r.evs); err != nil {
		q.mu.Unlock()
		return nil, err
	}
	q.reqs = append(q.reqs, r)
	q.queued += len(r.evs)
	q.mu.Unlock()
	q.signal()
	return r, nil
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// prepare checks an event before it is queued.
func prepare(ev *stream.Event, now time.Time) error {
	switch {
	case ev.Execution == "":
		return fmt.Errorf("append events: %w: event without execution", ErrInvalid)
	case ev.Type == "":
		return fmt.Errorf("append events to %s: %w: event without type", ev.Execution, ErrInvalid)
	case len(ev.Payload) == 0:
		ev.Payload = json.RawMessage("{}")
	case !json.Valid(ev.Payload):
		return fmt.Errorf("append events to %s: %w: %s payload is not JSON", ev.Execution, ErrInvalid, ev.Type)
	default:
		ev.Payload = bytes.Clone(ev.Payload) // the caller may reuse its buffer once accepted
	}
	if ev.Time.IsZero() {
		ev.Time = now
	}
	ev.Seq = 0
	return nil
}

// assign gives evs their seqs, all or none. Called with q.mu held.
func (s *Store) assign(evs []stream.Event) error {
	next := make(map[string]int64, 1)
	for i := range evs {
		ev := &evs[i]
		st, err := s.stream(ev.Execution)
		if err != nil {
			return err
		}
		if ev.Session == "" {
			ev.Session = st.session
		} else if ev.Session != st.session {
			return fmt.Errorf("append events to %s: %w: session %s, the execution's is %s", ev.Execution, ErrInvalid, ev.Session, st.session)
		}
		seq, ok := next[ev.Execution]
		if !ok {
			seq = st.assigned
		}
		seq++
		ev.Seq = seq
		next[ev.Execution] = seq
	}
	for id, seq := range next {
		s.q.streams[id].assigned = seq
	}
	return nil
}

// stream returns the state of an execution's stream, reading it from the
// table the first time. Called with q.mu held: no event of this execution
// is in flight when it is not cached, so the table's last seq is right.
func (s *Store) stream(execution string) (*execState, error) {
	if st, ok := s.q.streams[execution]; ok {
		return st, nil
	}
	if len(s.q.streams) >= maxCachedExecutions {
		for id, st := range s.q.streams {
			if st.assigned == st.stored {
				delete(s.q.streams, id)
			}
		}
	}
	st := &execState{}
	var node string
	err := s.r.QueryRow(`SELECT session_id, node, COALESCE((SELECT MAX(seq) FROM events WHERE execution_id = ?1), 0)
		FROM executions WHERE id = ?1`, execution).Scan(&st.session, &node, &st.stored)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("append events: execution %s: %w", execution, ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("append events to %s: %w", execution, err)
	}
	if node != s.node {
		// Seqs come from the owner's cache: another node's events would
		// collide with them and fail a whole group commit.
		return nil, fmt.Errorf("append events to %s: %w: the execution is owned by node %q, this is %q (Adopt it first)", execution, ErrInvalid, node, s.node)
	}
	st.assigned = st.stored
	s.q.streams[execution] = st
	return st, nil
}

// writer is the one goroutine that stores events: it takes the requests
// waiting at the front of the queue, commits them together, and publishes
// them. When the store closes it stores what was accepted, then exits.
func (s *Store) writer() {
	defer s.wg.Done()
	for {
		select {
		case <-s.q.wake:
		case <-s.closing:
		}
		for {
			batch := s.q.take()
			if len(batch) == 0 {
				break
			}
			s.commit(batch)
		}
		if s.closed() {
			return
		}
	}
}

func (s *Store) closed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// take removes up to maxBatchEvents events' worth of requests from the
// front of the queue.
func (q *queue) take() []*appendReq {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, events := 0, 0
	for n < len(q.reqs) && (n == 0 || events+len(q.reqs[n].evs) <= maxBatchEvents) {
		events += len(q.reqs[n].evs)
		n++
	}
	batch := slices.Clone(q.reqs[:n])
	q.reqs = slices.Delete(q.reqs, 0, n)
	q.queued -= events
	q.space.Broadcast()
	return batch
}

// commit stores a batch in one transaction and publishes it. If the
// transaction fails, the batch and everything queued behind it fail (their
// seqs follow the lost ones), and numbering restarts from the table.
func (s *Store) commit(batch []*appendReq) {
	wrote, err := s.insertBatch(batch)
	var lost []string // executions whose events the failure took
	q := &s.q
	q.mu.Lock()
	if err != nil {
		err = fmt.Errorf("append events: %w", err)
		behind := fmt.Errorf("append events: an earlier group commit failed: %w", err)
		for _, r := range batch {
			r.err = err
		}
		for _, r := range q.reqs {
			r.err = behind
		}
		batch = append(batch, q.reqs...)
		for _, r := range batch {
			for _, ev := range r.evs {
				lost = append(lost, ev.Execution)
			}
		}
		q.reqs, q.queued = nil, 0
		q.space.Broadcast()
		for _, st := range q.streams {
			st.assigned = st.stored
		}
		for _, r := range batch {
			if r.done == nil && len(r.evs) > 0 && q.asyncErr == nil {
				q.asyncErr = r.err
			}
		}
	} else {
		for _, r := range batch {
			for _, ev := range r.evs {
				if st := q.streams[ev.Execution]; st != nil {
					st.stored = ev.Seq
				}
			}
		}
	}
	q.mu.Unlock()
	if err != nil || wrote {
		s.wrote(err, lost...)
	}
	if err == nil {
		s.hub.publish(batch)
	}
	for _, r := range batch {
		if r.done != nil {
			close(r.done)
		}
	}
}

// insertBatch inserts the events of a batch in one transaction, and says
// whether there were any.
func (s *Store) insertBatch(batch []*appendReq) (bool, error) {
	if !slices.ContainsFunc(batch, func(r *appendReq) bool { return len(r.evs) > 0 }) {
		return false, nil // only Flush markers
	}
	tx, err := s.w.Begin()
	if err != nil {
		return true, err
	}
	defer tx.Rollback()
	stmt := tx.Stmt(s.insertEvent)
	defer stmt.Close()
	for _, r := range batch {
		for _, ev := range r.evs {
			_, err := stmt.Exec(ev.Execution, ev.Seq, ev.Session, ev.Time.UnixNano(), string(ev.Type), string(ev.Payload))
			if err != nil {
				return true, err
			}
		}
	}
	if s.dialect == postgresDialect {
		if err := s.notifyBatch(context.Background(), tx, batch); err != nil {
			return true, err
		}
	}
	return true, tx.Commit()
}

const insertEventSQL = "INSERT INTO events (execution_id, seq, session_id, time, type, payload) VALUES (?, ?, ?, ?, ?, ?)"

// Events returns up to limit events of an execution with seq > afterSeq,
// in seq order: the next page is after the last seq returned. limit 0
// means 1000, and at most 10000 are returned. Only stored events are
// returned (not those of an AppendAsync still queued). An unknown
// execution is ErrNotFound.
func (s *Store) Events(ctx context.Context, execution string, afterSeq int64, limit int) ([]stream.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.r.QueryContext(ctx, `SELECT seq, session_id, time, type, payload FROM events
		WHERE execution_id = ? AND seq > ? ORDER BY seq LIMIT ?`, execution, afterSeq, pageLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", execution, err)
	}
	defer rows.Close()
	var out []stream.Event
	for rows.Next() {
		ev := stream.Event{Execution: execution}
		var t int64
		var payload string
		if err := rows.Scan(&ev.Seq, &ev.Session, &t, &ev.Type, &payload); err != nil {
			return nil, fmt.Errorf("events of %s: %w", execution, err)
		}
		ev.Time, ev.Payload = time.Unix(0, t).UTC(), json.RawMessage(payload)
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events of %s: %w", execution, err)
	}
	if len(out) == 0 {
		if _, err := s.executionSession(ctx, execution); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// executionSession returns an execution's session, or ErrNotFound.
func (s *Store) executionSession(ctx context.Context, execution string) (string, error) {
	var session string
	err := s.r.QueryRowContext(ctx, "SELECT session_id FROM executions WHERE id = ?", execution).Scan(&session)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("execution %s: %w", execution, ErrNotFound)
	} else if err != nil {
		return "", fmt.Errorf("execution %s: %w", execution, err)
	}
	return session, nil
}
