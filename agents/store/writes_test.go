package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/agents/stream"
)

// failures collects what OnWriteFailure reports.
type failures chan []string

func watch(s *Store) failures {
	f := make(failures, 100)
	s.OnWriteFailure(func(err error, executions []string) {
		if errors.Is(err, ErrWriteFailed) {
			f <- executions
		}
	})
	return f
}

// waitFor waits (bounded) for a report naming id.
func (f failures) waitFor(t *testing.T, id string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ex := <-f:
			if slices.Contains(ex, id) {
				return
			}
		case <-deadline:
			t.Fatalf("no write failure reported for %s within 5s", id)
		}
	}
}

// fillEvents appends large events until the database refuses them.
func fillEvents(t *testing.T, s *Store, e Execution) error {
	t.Helper()
	big := fmt.Sprintf(`{"text":%q}`, strings.Repeat("x", 16<<10))
	for range 4096 { // 64 MiB at most
		if _, err := s.Append(ctx, stream.Event{Execution: e.ID, Type: stream.Text, Payload: []byte(big)}); err != nil {
			return err
		}
	}
	t.Fatal("the database took 64 MiB of events: it is not full")
	return nil
}

// endAndCheck is the part shared by the injected and the real full-disk
// tests: with the database full, the execution's end is kept and read
// back at once, ledger writes are kept, and the store reports the
// failure; free is then called, and everything kept must reach the file.
func endAndCheck(t *testing.T, s *Store, path string, e Execution, free func()) {
	t.Helper()
	since, werr := s.WriteError()
	if !errors.Is(werr, ErrWriteFailed) || !strings.Contains(werr.Error(), "full") || since.IsZero() {
		t.Errorf("WriteError() = %v, %v; want ErrWriteFailed saying the disk is full", werr, since)
	}
	reason := "the store could not record the execution: " + werr.Error()
	// A large result needs new pages: this write cannot fit in free space.
	result := strings.Repeat("r", 64<<10)
	got, err := s.UpdateExecution(ctx, e.ID, func(x *Execution) error {
		x.Status, x.Error, x.Result, x.USD, x.Turns = Failed, reason, result, 1, 7
		return nil
	})
	if !errors.Is(err, ErrWriteFailed) || got.Status != Failed {
		t.Fatalf("UpdateExecution(failed) on a full store = %+v, %v; want the kept record and ErrWriteFailed", got.Status, err)
	}
	if g, err := s.GetExecution(ctx, e.ID); err != nil || g.Status != Failed || g.Error != reason {
		t.Errorf("GetExecution while the end is kept = %s %q, %v; want failed with the reason", g.Status, g.Error, err)
	}
	if l, err := s.ListExecutions(ctx, ExecutionFilter{Status: []Status{Running}}); err != nil || len(l) != 0 {
		t.Errorf("ListExecutions(running) while the end is kept = %d, %v; want none", len(l), err)
	}
	spendErr := s.Spend(ctx, e.ID, 1)
	releaseErr := s.Release(ctx, e.ID)
	t.Logf("on the full store: Spend = %v; Release = %v", spendErr, releaseErr)
	for _, err := range []error{spendErr, releaseErr} {
		if err != nil && !errors.Is(err, ErrWriteFailed) {
			t.Errorf("ledger write on a full store = %v; want it done or kept (ErrWriteFailed)", err)
		}
	}

	free()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, werr := s.WriteError()
		s.wr.mu.Lock()
		left := len(s.wr.kept) + len(s.wr.ended)
		s.wr.mu.Unlock()
		if werr == nil && left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after freeing space: WriteError %v, %d writes still kept", werr, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	g, err := s2.GetExecution(ctx, e.ID)
	if err != nil || g.Status != Failed || g.Error != reason || g.Turns != 7 || len(g.Result) != len(result) {
		t.Errorf("reopened after freeing space: %s %q turns %d, %v; want failed with the reason and 7 turns", g.Status, g.Error, g.Turns, err)
	}
	_, reserved, spent, err := s2.Balance(ctx)
	if err != nil || reserved != 0 || spent != 1 {
		t.Errorf("balance after freeing space: reserved %v, spent %v, %v; want the kept spend and release written", reserved, spent, err)
	}
}

// running makes a running execution with $5 reserved of $10.
func running(t *testing.T, s *Store) Execution {
	t.Helper()
	e := newExec(t, s)
	if err := s.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(ctx, e.ID, 5); err != nil {
		t.Fatal(err)
	}
	return setStatus(t, s, e.ID, Running)
}

// TestWriteFailureInjected caps the database's size (PRAGMA
// max_page_count, so SQLite itself answers SQLITE_FULL) while an
// execution runs.
func TestWriteFailureInjected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hearth.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := running(t, s)
	f := watch(s)
	if _, err := s.w.Exec("PRAGMA max_page_count = 1"); err != nil { // clamped to the current size
		t.Fatal(err)
	}
	err = fillEvents(t, s, e)
	t.Logf("Append on the capped store: %v", err)
	f.waitFor(t, e.ID)
	// The ledger's last page may still have room: fill it too.
	for i := 0; s.AddCredits(ctx, 0.000001, "filler") == nil; i++ {
		if i > 100000 {
			t.Fatal("the ledger never filled up")
		}
	}
	endAndCheck(t, s, path, e, func() {
		if _, err := s.w.Exec("PRAGMA max_page_count = 1073741823"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWriteFailureDiskFull puts the store on a 4 MiB tmpfs and fills the
// file system while an execution runs.
func TestWriteFailureDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("mount a 4 MiB tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	path := filepath.Join(dir, "hearth.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := running(t, s)
	f := watch(s)
	filler := filepath.Join(dir, "filler")
	fill, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := fill.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v", err)
			}
			break
		}
	}
	fill.Close()
	err = fillEvents(t, s, e)
	t.Logf("Append on the full disk: %v", err)
	f.waitFor(t, e.ID)
	endAndCheck(t, s, path, e, func() {
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
	})
}
