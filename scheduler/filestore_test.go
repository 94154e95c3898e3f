package scheduler_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"hearth/scheduler"
	"hearth/scheduler/storetest"
)

func TestFileStore(t *testing.T) {
	dirs := map[string]string{}
	storetest.Run(t, func(t *testing.T, key string) scheduler.Store {
		if dirs[key] == "" {
			dirs[key] = t.TempDir()
		}
		st, err := scheduler.OpenFileStore(dirs[key])
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}

func TestFileStoreTornLine(t *testing.T) {
	dir := t.TempDir()
	st, err := scheduler.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.AppendRun(ctx, scheduler.Run{ID: "1", Schedule: "s", Scheduled: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// A crash mid-append leaves half a line.
	f, err := os.OpenFile(filepath.Join(dir, "runs", "s.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"id":"2","sched`)
	f.Close()
	if err := st.AppendRun(ctx, scheduler.Run{ID: "3", Schedule: "s", Scheduled: time.Now()}); err != nil {
		t.Fatal(err)
	}
	got, err := st.ListRuns(ctx, "s", 0)
	if err != nil || len(got) != 2 || got[0].ID != "3" || got[1].ID != "1" {
		t.Errorf("ListRuns after torn line = %+v, %v, want runs 3, 1", got, err)
	}
	if err := st.AppendRun(ctx, scheduler.Run{ID: "x", Schedule: "../evil"}); err == nil {
		t.Errorf("AppendRun(schedule ../evil) = nil, want an error")
	}
}
