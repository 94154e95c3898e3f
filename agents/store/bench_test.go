package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"hearth/agents/stream"
)

// ingestTarget is the goal of issue 4: 20,000 events/s with 10 live
// subscribers.
const ingestTarget = 20000

// BenchmarkEventIngest appends the stream of one busy execution, one
// event per call as an agent's adapter produces them, while live
// subscribers follow it. One op is 50,000 events and runs until every
// subscriber has received the last one (or, with none, until Flush).
//
// mode=async is the adapter's path (AppendAsync: the producer never waits
// for the disk, group commit takes what accumulated). mode=sync waits for
// each commit, so one producer is bound by SQLite's commit latency; more
// producers share commits. subscribers=0 is the baseline of each mode.
func BenchmarkEventIngest(b *testing.B) {
	for _, tc := range []struct {
		mode                   string
		subscribers, producers int
	}{
		{"async", 0, 1}, {"async", 10, 1},
		{"sync", 0, 1}, {"sync", 10, 1}, {"sync", 10, 4},
	} {
		b.Run(fmt.Sprintf("mode=%s/subscribers=%d/producers=%d", tc.mode, tc.subscribers, tc.producers), func(b *testing.B) {
			benchIngest(b, tc.mode == "async", tc.subscribers, tc.producers)
		})
	}
}

func benchIngest(b *testing.B, async bool, subscribers, producers int) {
	const events = 50000
	s := openTest(b)
	payload := map[string]any{"id": "toolu_01", "name": "Bash", "input": map[string]string{"command": "wc -l inputs/q2.csv"}}
	var drops atomic.Int64
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		e := newExec(b, s)
		var followers sync.WaitGroup
		for range subscribers {
			sub, err := s.Subscribe(e.ID, 0)
			if err != nil {
				b.Fatal(err)
			}
			followers.Go(func() { drops.Add(int64(consume(b, s, sub, e.ID, events))) })
		}
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() {
				for i := p; i < events; i += producers {
					ev := stream.New(e.Session, e.ID, stream.ToolCall, payload)
					var err error
					if async {
						_, err = s.AppendAsync(ev)
					} else {
						_, err = s.Append(ctx, ev)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := s.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		followers.Wait()
		total += time.Since(start)
	}
	perSec := float64(events*b.N) / total.Seconds()
	b.ReportMetric(perSec, "events/s")
	b.ReportMetric(perSec/ingestTarget, "x-target")
	b.ReportMetric(float64(drops.Load())/float64(b.N), "drops/op")
}

// consume reads a subscription until seq upto, resubscribing after
// ErrTooSlow, and returns how often it was dropped.
func consume(b *testing.B, s *Store, sub *Subscription, execution string, upto int64) (drops int) {
	var last int64
	for {
		for ev := range sub.C {
			last = ev.Seq
			if last == upto {
				sub.Close()
				return drops
			}
		}
		if !errors.Is(sub.Err(), ErrTooSlow) {
			b.Errorf("subscription ended at seq %d: %v", last, sub.Err())
			return drops
		}
		drops++
		var err error
		if sub, err = s.Subscribe(execution, last); err != nil {
			b.Error(err)
			return drops
		}
	}
}
