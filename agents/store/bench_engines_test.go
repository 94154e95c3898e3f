package store

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"hearth/agents/stream"
)

// BenchmarkEngines compares the PostgreSQL store with the SQLite one in
// the same run, interleaved (each op runs the same work on SQLite, then
// on PostgreSQL) after one untimed warm-up round:
//
//   - op=append: 4 producers each Append (waiting for the commit) 100
//     events of one execution; reported per event.
//   - op=credit: a Reserve, a Spend and a Release of one execution, the
//     round trip of one metered model call's ledger; reported per trip.
//
// x-sqlite is PostgreSQL's cost over SQLite's (above 1: slower). The
// PostgreSQL server is a local one with fsync off (internal/pgtest), so
// the ratio is of the engines' paths, not of a networked, durable disk.
func BenchmarkEngines(b *testing.B) {
	_, base := startPG(b)
	for _, op := range []struct {
		name, unit string
		per        int
		run        func(b *testing.B, s *Store)
	}{
		{"append", "append", 4 * 100, benchAppend},
		{"credit", "credit-trip", 50, benchCredit},
	} {
		b.Run("op="+op.name, func(b *testing.B) {
			lite, err := openSQLite(b)
			if err != nil {
				b.Fatal(err)
			}
			defer lite.Close()
			pg := openNodes(b, freshDB(b, base), 1)[0]
			for _, s := range []*Store{lite, pg} {
				if err := s.AddCredits(ctx, 1e6, "bench"); err != nil {
					b.Fatal(err)
				}
				op.run(b, s) // warm-up
			}
			var tl, tp time.Duration
			for b.Loop() {
				t0 := time.Now()
				op.run(b, lite)
				t1 := time.Now()
				op.run(b, pg)
				tl, tp = tl+t1.Sub(t0), tp+time.Since(t1)
			}
			n := float64(b.N * op.per)
			b.ReportMetric(float64(tl.Microseconds())/n, "µs/"+op.unit+"-sqlite")
			b.ReportMetric(float64(tp.Microseconds())/n, "µs/"+op.unit+"-postgres")
			b.ReportMetric(float64(tp)/float64(tl), "x-sqlite")
		})
	}
}

func benchAppend(b *testing.B, s *Store) {
	e := newExec(b, s)
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := range 100 {
				ev := stream.New(e.Session, e.ID, stream.Text, map[string]string{"text": fmt.Sprint(p, i)})
				if _, err := s.Append(ctx, ev); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func benchCredit(b *testing.B, s *Store) {
	e := newExec(b, s)
	for range 50 {
		if err := s.Reserve(ctx, e.ID, 0.5); err != nil {
			b.Fatal(err)
		}
		if err := s.Spend(ctx, e.ID, 0.001); err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, e.ID); err != nil {
			b.Fatal(err)
		}
	}
}
