package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"hearth/agents/stream"
)

func text(e Execution, s string) stream.Event {
	return stream.New(e.Session, e.ID, stream.Text, map[string]string{"text": s})
}

func TestAppend(t *testing.T) {
	s := openTest(t)
	e := newExec(t, s)
	first, err := s.Append(ctx, text(e, "one"), text(e, "two"))
	if err != nil {
		t.Fatal(err)
	}
	if first[0].Seq != 1 || first[1].Seq != 2 {
		t.Errorf("Append seqs %d, %d; want 1, 2", first[0].Seq, first[1].Seq)
	}
	noSession := stream.Event{Execution: e.ID, Type: stream.Status}
	got, err := s.Append(ctx, noSession)
	if err != nil || got[0].Seq != 3 || got[0].Session != e.Session || got[0].Time.IsZero() || string(got[0].Payload) != "{}" {
		t.Errorf("Append(event without session, time, payload) = %+v, %v; want seq 3 and them filled in", got, err)
	}
	stored, err := s.Events(ctx, e.ID, 0, 0)
	if err != nil || len(stored) != 3 {
		t.Fatalf("Events = %d, %v; want 3", len(stored), err)
	}
	var payload struct{ Text string }
	if json.Unmarshal(stored[1].Payload, &payload); payload.Text != "two" || stored[1].Type != stream.Text ||
		!stored[1].Time.Equal(first[1].Time) || stored[1].Session != e.Session {
		t.Errorf("Events[1] = %+v, want the second event", stored[1])
	}

	other := newExec(t, s)
	for _, tc := range []struct {
		name string
		evs  []stream.Event
		want error
	}{
		{"unknown execution", []stream.Event{{Execution: "exec-00000000", Type: stream.Text}}, ErrNotFound},
		{"no execution", []stream.Event{{Type: stream.Text}}, ErrInvalid},
		{"no type", []stream.Event{{Execution: e.ID}}, ErrInvalid},
		{"payload not JSON", []stream.Event{{Execution: e.ID, Type: stream.Text, Payload: json.RawMessage("{oops")}}, ErrInvalid},
		{"wrong session", []stream.Event{{Session: other.Session, Execution: e.ID, Type: stream.Text}}, ErrInvalid},
		{"all or nothing", []stream.Event{text(e, "kept?"), {Execution: "exec-00000000", Type: stream.Text}}, ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Append(ctx, tc.evs...); !errors.Is(err, tc.want) {
				t.Errorf("Append = %v, want %v", err, tc.want)
			}
		})
	}
	if got, _ := s.Events(ctx, e.ID, 3, 0); len(got) != 0 {
		t.Errorf("failed appends stored %v", got)
	}
	if _, err := s.Events(ctx, "exec-00000000", 0, 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Events(unknown) = %v, want ErrNotFound", err)
	}
	got, err = s.Append(ctx, text(e, "after failures"))
	if err != nil || got[0].Seq != 4 {
		t.Errorf("Append after failed appends = %v, %v; want seq 4", got, err)
	}
}

// TestAppendConcurrent appends from many goroutines to a few executions,
// mixing in requests that fail, and checks every stream is 1..n.
func TestAppendConcurrent(t *testing.T) {
	s := openTest(t)
	execs := []Execution{newExec(t, s), newExec(t, s), newExec(t, s)}
	const writers, perWriter = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				e := execs[(w+i)%len(execs)]
				evs := []stream.Event{text(e, fmt.Sprint(w, i))}
				if i%10 == 0 {
					evs = append(evs, text(e, "pair"))
				}
				got, err := s.Append(ctx, evs...)
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				if len(evs) == 2 && got[1].Seq != got[0].Seq+1 {
					t.Errorf("one call's events got seqs %d, %d; want consecutive", got[0].Seq, got[1].Seq)
				}
				if i%50 == 0 { // failures in the same batches must not disturb the others
					s.Append(ctx, stream.Event{Execution: "exec-00000000", Type: stream.Text})
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, e := range execs {
		var seqs []int64
		for after := int64(0); ; {
			page, err := s.Events(ctx, e.ID, after, 333)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			for _, ev := range page {
				seqs = append(seqs, ev.Seq)
			}
			after = page[len(page)-1].Seq
		}
		for i, seq := range seqs {
			if seq != int64(i+1) {
				t.Fatalf("execution %s: seq %d at position %d, want gap-free 1..n", e.ID, seq, i)
			}
		}
		total += len(seqs)
	}
	if want := writers * perWriter * 11 / 10; total != want {
		t.Errorf("stored %d events, want %d", total, want)
	}
}

// TestSeqsSurviveReopen checks that numbering continues from the table
// after a restart, not from a fresh cache.
func TestSeqsSurviveReopen(t *testing.T) {
	open := openSame(t)
	s, err := open()
	if err != nil {
		t.Fatal(err)
	}
	e := newExec(t, s)
	for range 5 {
		s.Append(ctx, text(e, "x"))
	}
	s.Close()
	s, err = open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Append(ctx, text(e, "after restart"))
	if err != nil || got[0].Seq != 6 {
		t.Errorf("Append after reopen = %v, %v; want seq 6", got, err)
	}
}

func TestEventsPaging(t *testing.T) {
	s := openTest(t)
	e := newExec(t, s)
	batch := make([]stream.Event, 2500)
	for i := range batch {
		batch[i] = text(e, fmt.Sprint(i))
	}
	if _, err := s.Append(ctx, batch...); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		after      int64
		limit      int
		first, len int64
	}{
		{0, 0, 1, 1000},
		{0, 10, 1, 10},
		{2490, 100, 2491, 10},
		{2500, 10, 0, 0},
		{0, 50000, 1, 2500},
	} {
		got, err := s.Events(ctx, e.ID, tc.after, tc.limit)
		if err != nil || int64(len(got)) != tc.len || (len(got) > 0 && got[0].Seq != tc.first) {
			t.Errorf("Events(after %d, limit %d) = %d events, %v; want %d from %d", tc.after, tc.limit, len(got), err, tc.len, tc.first)
		}
	}
	if !testing.Short() {
		start := time.Now()
		if _, err := s.Events(ctx, e.ID, 0, 10000); err != nil {
			t.Fatal(err)
		}
		t.Logf("read 2500 events in %v", time.Since(start))
	}
}

func TestAppendAsync(t *testing.T) {
	open := openSame(t)
	s, err := open()
	if err != nil {
		t.Fatal(err)
	}
	e := newExec(t, s)
	const n = 3 * maxQueued // enough to meet the queue's bound
	payload := []byte(`{"text":"reused buffer"}`)
	for i := range n {
		ev := stream.Event{Execution: e.ID, Type: stream.Text, Payload: payload}
		got, err := s.AppendAsync(ev)
		if err != nil || got[0].Seq != int64(i+1) {
			t.Fatalf("AppendAsync #%d = %v, %v; want seq %d", i, got, err, i+1)
		}
		copy(payload, `{"text":"overwritten!!"}`) // the store kept its own copy
		copy(payload, `{"text":"reused buffer"}`)
	}
	mixed, err := s.Append(ctx, text(e, "sync after async"))
	if err != nil || mixed[0].Seq != n+1 {
		t.Fatalf("Append after AppendAsync = %v, %v; want seq %d", mixed, err, n+1)
	}
	if _, err := s.AppendAsync(stream.Event{Execution: "exec-00000000", Type: stream.Text}); !errors.Is(err, ErrNotFound) {
		t.Errorf("AppendAsync(unknown execution) = %v, want ErrNotFound at once", err)
	}
	for i := range 100 { // accepted just before Close: Close stores them
		s.AppendAsync(text(e, fmt.Sprint("last ", i)))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendAsync(text(e, "too late")); !errors.Is(err, ErrClosed) {
		t.Errorf("AppendAsync after Close = %v, want ErrClosed", err)
	}
	if err := s.Flush(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close = %v, want ErrClosed", err)
	}

	s, err = open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var count int64
	for after := int64(0); ; {
		page, err := s.Events(ctx, e.ID, after, 10000)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, ev := range page {
			count++
			if ev.Seq != count || (ev.Seq <= n && string(ev.Payload) != `{"text":"reused buffer"}`) {
				t.Fatalf("stored event %d = seq %d %s", count, ev.Seq, ev.Payload)
			}
		}
		after = page[len(page)-1].Seq
	}
	if count != n+101 {
		t.Errorf("stored %d events, want %d", count, n+101)
	}
}

// TestCommitFailure makes the database refuse one event (a trigger) and
// checks that the failure is reported, loses only what it must, and that
// the stream stays gap-free afterwards.
func TestCommitFailure(t *testing.T) {
	s := openTest(t)
	e := newExec(t, s)
	poison := []string{`CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.payload LIKE '%poison%'
		BEGIN SELECT RAISE(ABORT, 'poisoned event'); END`}
	if s.dialect == postgresDialect {
		poison = []string{`CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'poisoned event'; END $$`,
			`CREATE TRIGGER poison BEFORE INSERT ON events FOR EACH ROW
			WHEN (NEW.payload LIKE '%poison%') EXECUTE FUNCTION poison()`}
	}
	for _, q := range poison {
		if _, err := s.w.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	s.Append(ctx, text(e, "one"), text(e, "two"))
	if _, err := s.Append(ctx, text(e, "poison")); err == nil {
		t.Fatal("Append(poison) = nil error, want the database's refusal")
	}
	got, err := s.Append(ctx, text(e, "three"))
	if err != nil || got[0].Seq != 3 {
		t.Fatalf("Append after a failed commit = %v, %v; want seq 3", got, err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Errorf("Flush with no async loss = %v", err)
	}

	if _, err := s.AppendAsync(text(e, "poison")); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := s.AppendAsync(text(e, fmt.Sprint("after ", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(ctx); err == nil {
		t.Error("Flush after a lost AppendAsync = nil, want the commit error")
	}
	if err := s.Flush(ctx); err != nil {
		t.Errorf("second Flush = %v, want nil (reported once)", err)
	}
	evs, _ := s.Events(ctx, e.ID, 0, 0)
	for i, ev := range evs {
		if ev.Seq != int64(i+1) || string(ev.Payload) == `{"text":"poison"}` {
			t.Fatalf("stored stream after failures: event %d is seq %d %s", i, ev.Seq, ev.Payload)
		}
	}
	t.Logf("%d events stored, the poisoned one and those queued behind it lost", len(evs))
}
