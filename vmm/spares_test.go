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
