package vmm

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Spares is the bookkeeping of machines a driver prepares ahead of time
// (booted VMs, assembled jails) so that a Create of the same shape
// claims one instead of starting from nothing: Keep spares for each of
// the Shapes shapes last created, older shapes' spares discarded. A spare
// is taken once and never comes back. The driver says what a shape is
// (S: whatever its spares' start depends on), how to prepare one and how
// to discard one (M: its prepared machine); vmm/qemu and vmm/jail use it.
type Spares[S comparable, M any] struct {
	keep, shapes int
	prepare      func(ctx context.Context, s S) (M, error)
	discard      func(m M, why string)
	settle       time.Duration // see SetSettle

	ctx    context.Context // ends at Close, and with it the preparations
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	spares []*Spare[S, M] // oldest first
	recent []S            // shapes last created, most recent first
}

// Spare is one machine being prepared or prepared.
type Spare[S comparable, M any] struct {
	Shape S
	M     M     // valid once Ready is closed and Err is nil
	Err   error // valid once Ready is closed
	ready chan struct{}
	hurry chan struct{} // closed by hurryUp: the settle time ends
	once  sync.Once
	drop  atomic.Bool // discarded while it settled: not prepared at all
}

// hurryUp ends sp's settle time, if it still settles.
func (sp *Spare[S, M]) hurryUp() { sp.once.Do(func() { close(sp.hurry) }) }

// Ready is closed when preparing the spare has ended; Err says how.
func (sp *Spare[S, M]) Ready() <-chan struct{} { return sp.ready }

// ErrNoSpare is WaitReady's answer when no spare of the shape is being
// prepared: the pool is closed, or every preparation failed.
var ErrNoSpare = errors.New("no spare is being prepared (the driver is closed, or preparing failed)")

// NewSpares keeps keep spares for each of the shapes shapes last used.
// prepare runs in a goroutine of its own, its context ending at Close;
// discard is called once for each prepared spare that is not taken.
func NewSpares[S comparable, M any](keep, shapes int, prepare func(ctx context.Context, s S) (M, error), discard func(m M, why string)) *Spares[S, M] {
	ctx, cancel := context.WithCancel(context.Background())
	return &Spares[S, M]{keep: keep, shapes: shapes, prepare: prepare, discard: discard, ctx: ctx, cancel: cancel}
}

// SetSettle makes each spare wait d before it is prepared: the machine
// whose Create asked for it (the one that took its predecessor, most
// often) then does its first work without a preparation competing for
// the host's cores. A spare taken or waited for while it settles is
// prepared at once. Call it before the pool is used.
func (p *Spares[S, M]) SetSettle(d time.Duration) { p.settle = d }

// Take removes a spare of shape s from the pool and returns it (maybe
// still being prepared: wait for Ready); nil if there is none.
func (p *Spares[S, M]) Take(s S) *Spare[S, M] {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, sp := range p.spares {
		if sp.Shape == s {
			p.spares = slices.Delete(p.spares, i, i+1)
			sp.hurryUp()
			return sp
		}
	}
	return nil
}

// Used notes that a machine of shape s was created: spares of shapes no
// longer among the recent ones are discarded, and spares of s prepared
// until there are keep of them.
func (p *Spares[S, M]) Used(s S) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	recent := []S{s}
	for _, r := range p.recent {
		if r != s && len(recent) < p.shapes {
			recent = append(recent, r)
		}
	}
	p.recent = recent
	have := 0
	keep := p.spares[:0]
	for _, sp := range p.spares {
		switch {
		case sp.Shape == s:
			have++
			keep = append(keep, sp)
		case slices.Contains(p.recent, sp.Shape):
			keep = append(keep, sp)
		default:
			p.Discard(sp, "its shape was not used lately")
		}
	}
	p.spares = keep
	for ; have < p.keep; have++ {
		p.spares = append(p.spares, p.start(s))
	}
}

// start starts preparing a spare of shape s. Called with p.mu held.
func (p *Spares[S, M]) start(s S) *Spare[S, M] {
	sp := &Spare[S, M]{Shape: s, ready: make(chan struct{}), hurry: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(sp.ready)
		if p.settle > 0 {
			t := time.NewTimer(p.settle)
			select {
			case <-t.C:
			case <-sp.hurry:
			case <-p.ctx.Done():
			}
			t.Stop()
			if err := p.ctx.Err(); err != nil {
				sp.Err = err
				return
			}
			if sp.drop.Load() {
				sp.Err = errors.New("discarded before it was prepared")
				return
			}
		}
		sp.M, sp.Err = p.prepare(p.ctx, s)
	}()
	return sp
}

// Discard discards a spare, taken or not, once it is prepared (a failed
// one has nothing to discard; one still settling is never prepared).
func (p *Spares[S, M]) Discard(sp *Spare[S, M], why string) {
	sp.drop.Store(true)
	sp.hurryUp()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		<-sp.ready
		if sp.Err == nil {
			p.discard(sp.M, why)
		}
	}()
}

// WaitReady waits until a spare of shape s is prepared.
func (p *Spares[S, M]) WaitReady(ctx context.Context, s S) error {
	for {
		p.mu.Lock()
		var pending *Spare[S, M]
		for _, sp := range p.spares {
			if sp.Shape != s {
				continue
			}
			select {
			case <-sp.ready:
				if sp.Err == nil {
					p.mu.Unlock()
					return nil
				}
			default:
				pending = sp
			}
		}
		if pending != nil {
			pending.hurryUp()
		}
		p.mu.Unlock()
		if pending == nil {
			return ErrNoSpare
		}
		select {
		case <-pending.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close stops the preparations, discards every spare and waits.
// Idempotent.
func (p *Spares[S, M]) Close() {
	p.mu.Lock()
	p.closed = true
	for _, sp := range p.spares {
		p.Discard(sp, "the driver closed")
	}
	p.spares = nil
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
}

// List returns the spares in the pool now, oldest first (for tests and
// diagnostics: they stay the pool's).
func (p *Spares[S, M]) List() []*Spare[S, M] {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.spares)
}
