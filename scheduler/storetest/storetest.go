// Package storetest is the conformance suite every scheduler.Store must
// pass; run it from the implementation's tests.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"hearth/scheduler"
)

// Run checks a Store. open returns the store kept under key: called twice
// with the same key it must return stores sharing their data (a restart).
func Run(t *testing.T, open func(t *testing.T, key string) scheduler.Store) {
	ctx := context.Background()
	t0 := time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)

	t.Run("empty", func(t *testing.T) {
		st := open(t, "empty")
		if got, err := st.LoadSchedules(ctx); err != nil || len(got) != 0 {
			t.Errorf("LoadSchedules() = %v, %v, want none, nil", got, err)
		}
		if got, err := st.ListRuns(ctx, "nope", 10); err != nil || len(got) != 0 {
			t.Errorf("ListRuns(nope) = %v, %v, want none, nil", got, err)
		}
	})

	t.Run("schedules", func(t *testing.T) {
		st := open(t, "schedules")
		want := []scheduler.Schedule{
			{ID: "a", Spec: "@daily", Overlap: scheduler.OverlapQueue, CatchUp: scheduler.CatchUpOnce,
				Payload: json.RawMessage(`{"agent":"x"}`), Created: t0},
			{ID: "b", Spec: "CRON_TZ=Europe/Paris 0 9 * * *", Paused: true, Created: t0},
		}
		if err := st.SaveSchedules(ctx, want); err != nil {
			t.Fatalf("SaveSchedules: %v", err)
		}
		if err := st.SaveSchedules(ctx, want[1:]); err != nil {
			t.Fatalf("SaveSchedules: %v", err)
		}
		got, err := open(t, "schedules").LoadSchedules(ctx)
		if err != nil || len(got) != 1 || got[0].ID != "b" || !got[0].Paused || got[0].Spec != want[1].Spec || !got[0].Created.Equal(t0) {
			t.Errorf("LoadSchedules() after reopen = %+v, %v, want %+v", got, err, want[1:])
		}
		if err := st.SaveSchedules(ctx, want[:1]); err != nil {
			t.Fatalf("SaveSchedules: %v", err)
		}
		got, err = st.LoadSchedules(ctx)
		if err != nil || len(got) != 1 || compact(got[0].Payload) != `{"agent":"x"}` || got[0].Overlap != scheduler.OverlapQueue {
			t.Errorf("LoadSchedules() = %+v, %v, want %+v", got, err, want[:1])
		}
	})

	t.Run("runs", func(t *testing.T) {
		st := open(t, "runs")
		for i := range 5 {
			r := scheduler.Run{ID: string(rune('a' + i)), Schedule: "s", Scheduled: t0.Add(time.Duration(i) * time.Hour),
				Started: t0.Add(time.Duration(i) * time.Hour), Ended: t0.Add(time.Duration(i)*time.Hour + time.Minute), Result: "exec-1"}
			if i == 3 {
				r = scheduler.Run{ID: "d", Schedule: "s", Scheduled: t0.Add(3 * time.Hour), Skipped: "busy", CatchUp: true}
			}
			if err := st.AppendRun(ctx, r); err != nil {
				t.Fatalf("AppendRun: %v", err)
			}
		}
		if err := st.AppendRun(ctx, scheduler.Run{ID: "z", Schedule: "other", Scheduled: t0}); err != nil {
			t.Fatalf("AppendRun: %v", err)
		}
		got, err := open(t, "runs").ListRuns(ctx, "s", 2)
		if err != nil || len(got) != 2 || got[0].ID != "e" || got[1].ID != "d" {
			t.Fatalf("ListRuns(s, 2) = %+v, %v, want runs e, d", got, err)
		}
		if d := got[1]; d.Skipped != "busy" || !d.CatchUp || !d.Started.IsZero() || !d.Scheduled.Equal(t0.Add(3*time.Hour)) {
			t.Errorf("skipped run read back as %+v", d)
		}
		if e := got[0]; e.Result != "exec-1" || !e.Ended.Equal(t0.Add(4*time.Hour+time.Minute)) {
			t.Errorf("run read back as %+v", e)
		}
		if all, err := st.ListRuns(ctx, "s", 0); err != nil || len(all) != 5 || all[4].ID != "a" {
			t.Errorf("ListRuns(s, 0) = %d runs, %v, want 5 ending with a", len(all), err)
		}
	})

	t.Run("run recorded at start then at end", func(t *testing.T) {
		st := open(t, "restarted")
		started := scheduler.Run{ID: "a", Schedule: "s", Scheduled: t0, Started: t0}
		if err := st.AppendRun(ctx, started); err != nil {
			t.Fatalf("AppendRun: %v", err)
		}
		if err := st.AppendRun(ctx, scheduler.Run{ID: "b", Schedule: "s", Scheduled: t0, Skipped: "busy"}); err != nil {
			t.Fatalf("AppendRun: %v", err)
		}
		got, err := open(t, "restarted").ListRuns(ctx, "s", 0)
		if err != nil || len(got) != 2 || got[1].ID != "a" || !got[1].Ended.IsZero() {
			t.Fatalf("ListRuns after a run started = %+v, %v, want b, then a not ended", got, err)
		}
		ended := started
		ended.Ended, ended.Result = t0.Add(time.Minute), "exec-1"
		if err := st.AppendRun(ctx, ended); err != nil {
			t.Fatalf("AppendRun: %v", err)
		}
		got, err = open(t, "restarted").ListRuns(ctx, "s", 0)
		if err != nil || len(got) != 2 || got[0].ID != "b" || got[1].ID != "a" || got[1].Result != "exec-1" || !got[1].Ended.Equal(ended.Ended) {
			t.Errorf("ListRuns after the run ended = %+v, %v, want b, then a ended with exec-1 in its first place", got, err)
		}
		if got, err := st.ListRuns(ctx, "s", 1); err != nil || len(got) != 1 || got[0].ID != "b" {
			t.Errorf("ListRuns(s, 1) = %+v, %v, want b", got, err)
		}
	})
}

// compact lets a store reformat a payload, as JSON columns and encoders do.
func compact(b []byte) string {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return string(b)
	}
	return out.String()
}
