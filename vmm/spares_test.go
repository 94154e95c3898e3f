package vmm

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestSpares: keep spares per shape for the last shapes used, each
// taken once, older shapes' and untaken ones discarded exactly once, a
// failed preparation never discarded, Close waiting for all of it.
func TestSpares(t *testing.T) {
	var mu sync.Mutex
	n := 0
	var discarded []int
	prepare := func(ctx context.Context, s string) (int, error) {
		if s == "bad" {
			return 0, errors.New("no")
		}
		mu.Lock()
		defer mu.Unlock()
		n++
		return n, nil
	}
	discard := func(m int, why string) {
		mu.Lock()
		defer mu.Unlock()
		discarded = append(discarded, m)
	}
	p := NewSpares(2, 2, prepare, discard)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.Used("a")
	if err := p.WaitReady(ctx, "a"); err != nil {
		t.Fatalf("WaitReady(a) = %v", err)
	}
	if got := len(p.List()); got != 2 {
		t.Fatalf("after Used(a): %d spares, want 2", got)
	}
	sp := p.Take("a")
	<-sp.Ready()
	if sp.Err != nil || sp.M == 0 {
		t.Fatalf("Take(a) = %v, %v", sp.M, sp.Err)
	}
	if p.Take("b") != nil {
		t.Fatal("Take(b) gave a spare of another shape")
	}
	p.Used("b")
	p.Used("c") // a is no longer among the 2 recent shapes: its spare goes
	if err := p.WaitReady(ctx, "c"); err != nil {
		t.Fatalf("WaitReady(c) = %v", err)
	}
	for _, s := range p.List() {
		if s.Shape == "a" {
			t.Fatal("a spare of shape a outlived its shape")
		}
	}
	p.Used("bad")
	if err := p.WaitReady(ctx, "bad"); !errors.Is(err, ErrNoSpare) {
		t.Fatalf("WaitReady(bad) = %v, want ErrNoSpare", err)
	}
	p.Close()
	p.Close()
	p.Used("a") // after Close: nothing is prepared
	if len(p.List()) != 0 {
		t.Fatalf("spares after Close: %d", len(p.List()))
	}
	mu.Lock()
	defer mu.Unlock()
	// Every prepared spare but the one taken was discarded, once.
	want := []int{}
	for i := 1; i <= n; i++ {
		if i != sp.M {
			want = append(want, i)
		}
	}
	slices.Sort(discarded)
	if !slices.Equal(discarded, want) {
		t.Fatalf("discarded %v, want %v (taken: %d)", discarded, want, sp.M)
	}
}

// TestSparesSettle: a spare waits its settle time before it is prepared,
// unless it is taken or waited for first; one discarded while it
// settles is never prepared; Close ends the wait.
func TestSparesSettle(t *testing.T) {
	var mu sync.Mutex
	var prepared []time.Time
	prepare := func(ctx context.Context, s string) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		prepared = append(prepared, time.Now())
		return len(prepared), nil
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(prepared)
	}
	const settle = time.Hour // only hurrying gets anything prepared
	p := NewSpares(1, 2, prepare, func(int, string) {})
	p.SetSettle(settle)
	p.Used("a")
	time.Sleep(50 * time.Millisecond)
	if n := count(); n != 0 {
		t.Fatalf("%d spares prepared during the settle time, want none", n)
	}
	sp := p.Take("a")
	select {
	case <-sp.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("a spare taken while it settled was not prepared at once")
	}
	if sp.Err != nil || count() != 1 {
		t.Fatalf("taken spare: %v, %d prepared; want it prepared", sp.Err, count())
	}

	p.Used("b") // a's replacement, and one of b, both settle
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx, "b"); err != nil {
		t.Fatalf("WaitReady(b) while it settled = %v, want it hurried", err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d prepared after WaitReady(b), want 2 (a's replacement still settles)", n)
	}
	p.Used("c") // a's settling spare is no longer among the recent shapes
	time.Sleep(50 * time.Millisecond)
	if n := count(); n != 2 {
		t.Fatalf("%d prepared: a spare discarded while it settled was prepared", n)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the settle time")
	}
	if n := count(); n != 2 {
		t.Fatalf("%d prepared after Close, want 2", n)
	}
}
