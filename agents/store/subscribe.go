package store

import (
	"context"
	"fmt"
	"sync"

	"hearth/agents/stream"
)

// A Subscription delivers the events of one execution (or of all, from
// SubscribeAll) on C, in seq order, with no gap and no duplicate. C is
// closed when the subscription ends: then Err says why (nil after Close,
// ErrTooSlow when the subscriber fell behind, ErrClosed when the store
// closed). After ErrTooSlow, subscribe again from the last seq received.
type Subscription struct {
	C <-chan stream.Event

	c         chan stream.Event
	hub       *hub
	execution string // "" for all executions

	// Guarded by hub.mu.
	state    subState
	err      error
	pending  []stream.Event // live events that came during the replay
	overflow bool           // pending was dropped: read them from the table
	stop     chan struct{}  // closed to stop the replay
	floor    int64          // live: deliver only seqs above it (the last delivered, or the subscriber asked for those)
}

type subState int

const (
	replaying subState = iota // a goroutine sends stored events on c and owns it
	live                      // the writer sends on c, never blocking
	done                      // c is closed, or is being closed by the replay
)

// replayPage is how many stored events a replay reads at once.
const replayPage = 1000

// defaultMaxPending bounds the live events a replaying subscription
// holds; past it they are dropped and read back from the table, which
// has them.
const defaultMaxPending = 16384

// Subscribe delivers the events of an execution with seq > afterSeq:
// first those already stored, then new ones as they are appended. The
// subscriber must keep reading C: when it falls a buffer behind the live
// stream it is dropped (ErrTooSlow) so that it never slows Append. An
// unknown execution is ErrNotFound.
func (s *Store) Subscribe(execution string, afterSeq int64) (*Subscription, error) {
	if s.closed() {
		return nil, fmt.Errorf("subscribe: %w", ErrClosed)
	}
	if _, err := s.executionSession(context.Background(), execution); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	sub := s.newSubscription(execution)
	if err := s.hub.add(sub, replaying, func() {
		s.wg.Add(1)
		go s.replay(sub, afterSeq)
	}); err != nil {
		return nil, err
	}
	return sub, nil
}

// SubscribeAll delivers every event appended to any execution from now
// on, in the order they are stored; it replays nothing. To miss nothing,
// subscribe before listing executions. The same ErrTooSlow rule applies.
func (s *Store) SubscribeAll() (*Subscription, error) {
	sub := s.newSubscription("")
	if err := s.hub.add(sub, live, nil); err != nil {
		return nil, err
	}
	return sub, nil
}

func (s *Store) newSubscription(execution string) *Subscription {
	c := make(chan stream.Event, s.subBuffer)
	return &Subscription{C: c, c: c, hub: &s.hub, execution: execution, stop: make(chan struct{})}
}

// Close ends the subscription and closes C. Idempotent.
func (sub *Subscription) Close() {
	sub.hub.mu.Lock()
	defer sub.hub.mu.Unlock()
	sub.hub.end(sub, nil)
}

// Err says why C was closed: nil if by Close, ErrTooSlow or ErrClosed.
// Before C is closed it returns nil.
func (sub *Subscription) Err() error {
	sub.hub.mu.Lock()
	defer sub.hub.mu.Unlock()
	return sub.err
}

// replay sends the stored events after afterSeq, then the live events
// that arrived meanwhile, and hands the subscription over to the writer
// once nothing is left to catch up on. Seqs decide: anything at or below
// the last one sent is a duplicate; a hole means the rest is read from
// the table, which holds every event published.
func (s *Store) replay(sub *Subscription, afterSeq int64) {
	defer s.wg.Done()
	last := afterSeq
	fromTable := true
	for {
		if fromTable && !s.replayTable(sub, &last) {
			return
		}
		evs, step := s.hub.catchUp(sub, last)
		switch step {
		case ended, wentLive:
			return
		case readTable:
			fromTable = true
		case sendHeld:
			fromTable = false
			if !sub.send(evs, &last) {
				return
			}
		}
	}
}

// replayTable sends the stored events after *last until the table has no
// more, and reports false if the subscription ended meanwhile.
func (s *Store) replayTable(sub *Subscription, last *int64) bool {
	for {
		evs, err := s.Events(context.Background(), sub.execution, *last, replayPage)
		if err != nil {
			s.hub.fail(sub, err)
			return false
		}
		if !sub.send(evs, last) {
			return false
		}
		if len(evs) < replayPage {
			return true
		}
	}
}

// send delivers events with seqs after *last, blocking (the replay is the
// subscriber's own goroutine), and reports false when the subscription
// ended meanwhile, in which case the channel is closed here.
func (sub *Subscription) send(evs []stream.Event, last *int64) bool {
	for _, ev := range evs {
		if ev.Seq <= *last {
			continue
		}
		select {
		case sub.c <- ev:
			*last = ev.Seq
		case <-sub.stop:
			close(sub.c)
			return false
		}
	}
	return true
}

// hub hands committed events to subscriptions.
type hub struct {
	maxPending int

	mu     sync.Mutex
	closed bool
	byExec map[string]map[*Subscription]struct{}
	all    map[*Subscription]struct{}
}

func (h *hub) init() {
	h.maxPending = defaultMaxPending
	h.byExec = make(map[string]map[*Subscription]struct{})
	h.all = make(map[*Subscription]struct{})
}

// add registers sub in state st, then runs start under the lock so that
// the store cannot finish closing in between.
func (h *hub) add(sub *Subscription, st subState, start func()) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return fmt.Errorf("subscribe: %w", ErrClosed)
	}
	sub.state = st
	if sub.execution == "" {
		h.all[sub] = struct{}{}
	} else {
		m := h.byExec[sub.execution]
		if m == nil {
			m = make(map[*Subscription]struct{})
			h.byExec[sub.execution] = m
		}
		m[sub] = struct{}{}
	}
	if start != nil {
		start()
	}
	return nil
}

// end unregisters sub with reason err and closes its channel, or tells
// its replay to. Called with h.mu held; idempotent.
func (h *hub) end(sub *Subscription, err error) {
	if sub.state == done {
		return
	}
	if sub.execution == "" {
		delete(h.all, sub)
	} else if m := h.byExec[sub.execution]; m != nil {
		delete(m, sub)
		if len(m) == 0 {
			delete(h.byExec, sub.execution)
		}
	}
	sub.err, sub.pending = err, nil
	if sub.state == live {
		close(sub.c)
	} else {
		close(sub.stop) // the replay goroutine closes c
	}
	sub.state = done
}

// fail ends a replaying subscription whose replay hit err.
func (h *hub) fail(sub *Subscription, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sub.state == done { // already ended: the replay still owns c
		close(sub.c)
		return
	}
	h.end(sub, err)
	close(sub.c)
}

// What a replay does next.
type replayStep int

const (
	ended     replayStep = iota // the subscription ended; its channel is closed
	wentLive                    // caught up: the writer delivers from now on
	readTable                   // held events were dropped or do not follow: read the table
	sendHeld                    // send the held events returned, then ask again
)

// catchUp is the replay's step after it sent everything up to last: it
// takes the live events held meanwhile, or, when there are none, turns
// the subscription live, under the same lock as publish so that no event
// falls between the two.
func (h *hub) catchUp(sub *Subscription, last int64) ([]stream.Event, replayStep) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sub.state == done {
		close(sub.c)
		return nil, ended
	}
	evs, overflow := sub.pending, sub.overflow
	sub.pending, sub.overflow = nil, false
	for len(evs) > 0 && evs[0].Seq <= last {
		evs = evs[1:]
	}
	switch {
	case overflow:
		return nil, readTable
	case len(evs) == 0:
		sub.state, sub.floor = live, last
		return nil, wentLive
	case evs[0].Seq != last+1: // not expected: events are published after they commit
		return nil, readTable
	}
	return evs, sendHeld
}

// publish offers the stored events of a batch to subscriptions, never
// blocking: a live subscription whose buffer is full is ended with
// ErrTooSlow.
func (h *hub) publish(batch []*appendReq) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || (len(h.byExec) == 0 && len(h.all) == 0) {
		return
	}
	for _, r := range batch {
		if r.err != nil {
			continue
		}
		for _, ev := range r.evs {
			for sub := range h.byExec[ev.Execution] {
				h.offer(sub, ev)
			}
			for sub := range h.all {
				h.offer(sub, ev)
			}
		}
	}
}

func (h *hub) offer(sub *Subscription, ev stream.Event) {
	switch sub.state {
	case replaying:
		if len(sub.pending) >= h.maxPending {
			sub.pending, sub.overflow = nil, true
		}
		if !sub.overflow {
			sub.pending = append(sub.pending, ev)
		}
	case live:
		if sub.execution != "" && ev.Seq <= sub.floor {
			return // already delivered (another node's events can be read twice)
		}
		select {
		case sub.c <- ev:
			if sub.execution != "" {
				sub.floor = ev.Seq
			}
		default:
			h.end(sub, ErrTooSlow)
		}
	}
}

// closeAll ends every subscription with err and refuses new ones.
func (h *hub) closeAll(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, m := range h.byExec {
		for sub := range m {
			h.end(sub, err)
		}
	}
	for sub := range h.all {
		h.end(sub, err)
	}
}
