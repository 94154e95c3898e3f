package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"hearth/agents/stream"
)

// follow reads an execution's stream from after until it has seen seq
// upto, resubscribing after ErrTooSlow as a client would, and checks the
// seqs run after+1..upto with no gap or duplicate. It returns how many
// times it was dropped.
func follow(t *testing.T, s *Store, e Execution, after, upto int64, pause time.Duration) (drops int) {
	t.Helper()
	last := after
	for last < upto {
		sub, err := s.Subscribe(e.ID, last)
		if err != nil {
			t.Errorf("Subscribe(%s, %d): %v", e.ID, last, err)
			return drops
		}
		for ev := range sub.C {
			if ev.Seq != last+1 {
				t.Errorf("subscriber from %d: got seq %d after %d", after, ev.Seq, last)
				sub.Close()
				return drops
			}
			last = ev.Seq
			if last == upto {
				sub.Close()
				break
			}
			if pause > 0 && last%100 == 0 {
				time.Sleep(pause)
			}
		}
		switch err := sub.Err(); {
		case errors.Is(err, ErrTooSlow):
			drops++
		case err != nil:
			t.Errorf("subscription ended: %v", err)
			return drops
		}
	}
	return drops
}

// TestSubscribeReplayThenLive subscribes at different points while a
// producer appends, so that subscriptions switch from replay to live in
// the middle of the stream.
func TestSubscribeReplayThenLive(t *testing.T) {
	s := openTest(t)
	s.subBuffer = 64 // small, so that some subscribers are dropped and resubscribe
	s.hub.maxPending = 100
	e := newExec(t, s)
	const stored, total = 3000, 12000
	batch := make([]stream.Event, stored)
	for i := range batch {
		batch[i] = text(e, fmt.Sprint(i))
	}
	if _, err := s.Append(ctx, batch...); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		for i := stored; i < total; i++ {
			if _, err := s.Append(ctx, text(e, fmt.Sprint(i))); err != nil {
				t.Errorf("Append: %v", err)
				return
			}
		}
	})
	var mu sync.Mutex
	drops := 0
	for i, after := range []int64{0, 0, 1500, stored, stored + 10, 8000} {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 5 * time.Millisecond)
			pause := time.Duration(0)
			if i%2 == 1 {
				pause = time.Millisecond // a slower reader: exercises held events and drops
			}
			d := follow(t, s, e, after, total, pause)
			mu.Lock()
			drops += d
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("subscribers were dropped and resubscribed %d times", drops)
}

func TestSlowSubscriberIsDropped(t *testing.T) {
	s := openTest(t)
	s.subBuffer = 16
	e := newExec(t, s)
	stuck, err := s.Subscribe(e.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitLive(t, s, stuck)

	const n = 2000
	fast := make(chan int)
	go func() { fast <- follow(t, s, e, 0, n, 0) }()
	appended := make(chan time.Duration)
	go func() {
		start := time.Now()
		for i := range n {
			if _, err := s.Append(ctx, text(e, fmt.Sprint(i))); err != nil {
				t.Errorf("Append: %v", err)
			}
		}
		appended <- time.Since(start)
	}()
	select {
	case d := <-appended:
		t.Logf("%d appends with a stuck subscriber took %v", n, d)
	case <-time.After(30 * time.Second):
		t.Fatal("Append blocked behind a subscriber that does not read")
	}
	got := 0
	for range stuck.C {
		got++
	}
	if !errors.Is(stuck.Err(), ErrTooSlow) || got != 16 {
		t.Errorf("stuck subscriber: %d events then %v; want its buffer of 16 then ErrTooSlow", got, stuck.Err())
	}
	if drops := <-fast; drops > 0 {
		t.Logf("the reading subscriber was dropped %d times", drops)
	}
	// Resubscribing from the last seq received gives the rest.
	if d := follow(t, s, e, int64(got), n, 0); d > 0 {
		t.Logf("resubscriber dropped %d times", d)
	}
}

// waitLive waits until a subscription has finished its replay.
func waitLive(t *testing.T, s *Store, sub *Subscription) {
	t.Helper()
	for range 1000 {
		s.hub.mu.Lock()
		st := sub.state
		s.hub.mu.Unlock()
		if st == live {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("subscription never went live")
}

func TestSubscribeAll(t *testing.T) {
	s := openTest(t)
	a, b := newExec(t, s), newExec(t, s)
	s.Append(ctx, text(a, "before"))
	sub, err := s.SubscribeAll()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		e := a
		if i%2 == 1 {
			e = b
		}
		if _, err := s.Append(ctx, text(e, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	last := map[string]int64{a.ID: 1}
	for i := range 10 {
		ev := <-sub.C
		if ev.Seq != last[ev.Execution]+1 {
			t.Errorf("event %d: %s seq %d, want %d", i, ev.Execution, ev.Seq, last[ev.Execution]+1)
		}
		last[ev.Execution] = ev.Seq
	}
	if last[a.ID] != 6 || last[b.ID] != 5 {
		t.Errorf("last seqs %v, want a=6 b=5", last)
	}
	sub.Close()
	sub.Close()
	if _, ok := <-sub.C; ok || sub.Err() != nil {
		t.Errorf("after Close: channel open=%v, Err %v; want closed, nil", ok, sub.Err())
	}
}

func TestSubscribeEdges(t *testing.T) {
	s := openTest(t)
	if _, err := s.Subscribe("exec-00000000", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Subscribe(unknown) = %v, want ErrNotFound", err)
	}
	e := newExec(t, s)
	s.Append(ctx, text(e, "a"), text(e, "b"))
	sub, err := s.Subscribe(e.ID, 2) // nothing to replay
	if err != nil {
		t.Fatal(err)
	}
	waitLive(t, s, sub)
	s.Append(ctx, text(e, "c"))
	if ev := <-sub.C; ev.Seq != 3 {
		t.Errorf("first event after seq 2 = %d, want 3", ev.Seq)
	}
	sub.Close()
	// Closing during the replay, with the subscriber not reading.
	big := make([]stream.Event, 3000)
	for i := range big {
		big[i] = text(e, "x")
	}
	s.Append(ctx, big...)
	s.subBuffer = 1
	sub, _ = s.Subscribe(e.ID, 0)
	<-sub.C
	sub.Close()
	for range sub.C {
	}
	if sub.Err() != nil {
		t.Errorf("Err after Close during replay = %v, want nil", sub.Err())
	}
}
