package fs

import (
	"sync"
	"time"
)

// EventOp says what happened to a file.
type EventOp string

// File events, in the order a file usually sees them.
const (
	OpCreated EventOp = "created"
	OpWritten EventOp = "written" // a handle that changed the file was closed
	OpClosed  EventOp = "closed"
	OpRenamed EventOp = "renamed"
	OpRemoved EventOp = "removed"
	OpError   EventOp = "error" // the store could not do background work; Path says why
	// OpHealth: the workspace became read-only (Path says why, e.g. no
	// space for its journal) or writable again; see Store.Health.
	OpHealth EventOp = "health"
)

// Event is one file event in the workspace.
type Event struct {
	Time    time.Time
	Session string
	Path    string // relative to the session directory, e.g. "outputs/report.md"
	OldPath string // for OpRenamed
	Op      EventOp
	// Dropped counts events this subscriber missed before this one because
	// it was not reading fast enough.
	Dropped uint64
}

// Bus fans events out to subscribers. Publishing never blocks: a
// subscriber whose buffer is full misses events and is told how many.
type Bus struct {
	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	closed bool
}

// NewBus returns an empty bus.
func NewBus() *Bus { return &Bus{subs: map[*Subscription]struct{}{}} }

// Subscription receives events on C until Close.
type Subscription struct {
	C       <-chan Event
	c       chan Event
	dropped uint64 // guarded by bus.mu
	bus     *Bus
}

// Subscribe returns a subscription with room for buf events.
func (b *Bus) Subscribe(buf int) *Subscription {
	c := make(chan Event, max(buf, 1))
	sub := &Subscription{C: c, c: c, bus: b}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(c)
		return sub
	}
	b.subs[sub] = struct{}{}
	return sub
}

// Close ends the subscription and closes C. It is idempotent.
func (s *Subscription) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	if _, ok := s.bus.subs[s]; ok {
		delete(s.bus.subs, s)
		close(s.c)
	}
}

func (b *Bus) publish(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for sub := range b.subs {
		ev := e
		ev.Dropped = sub.dropped
		select {
		case sub.c <- ev:
			sub.dropped = 0
		default:
			sub.dropped++
		}
	}
}

// Close closes every subscription.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for sub := range b.subs {
		delete(b.subs, sub)
		close(sub.c)
	}
}
