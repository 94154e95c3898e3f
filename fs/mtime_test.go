package fs

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTimesSetBeforeReleaseStay: times set on a file while a writer
// still has it open (or before the kernel's release of a closed one
// reaches the daemon: close(2) does not wait for it) stay once it is
// released, as they do on a native filesystem: cp -p, tar and archive
// restores write, close, then set the times. The release took the
// mtime from the file's blob, moving it back to the write's time
// (TestWorkspaceArchiveRoundTrip in CI).
func TestTimesSetBeforeReleaseStay(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "times")
	p := filepath.Join(mountView(t, s, ViewOptions{Host: true}), "times", "outputs", "f")
	other := filepath.Join(mountView(t, s, ViewOptions{Host: true}), "times", "outputs", "f")
	when := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("data"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, when, when); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, s) // the release is handled after close returns
	// The writer's view, and another that asks the store afresh.
	for _, path := range []string{p, other} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(when) {
			t.Errorf("mtime of %s after the release = %v, want %v as set", path, fi.ModTime(), when)
		}
	}
	// A write after the times were set moves the mtime again.
	before := time.Now().Add(-time.Second)
	if err := os.WriteFile(p, []byte("later"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || fi.ModTime().Before(before) {
		t.Errorf("mtime after a later write = %v, %v; want about now", fi.ModTime(), err)
	}
}

// TestUnwrittenFilesKeepTheirTimes: a file's mtime is its own, never
// the time its blob was made. Blobs are made ahead of need (or emptied
// from deleted files for reuse), copies of a shared blob are made when
// a writer opens it, and the mtime a writer's release takes from its
// blob was that blob's: touch made a file dated when its pooled blob
// was, hours before when recycled (make and find -newer read it), and
// opening a file a snapshot shares for writing, without a write, moved
// its mtime to the copy's.
func TestUnwrittenFilesKeepTheirTimes(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "times")
	dir := filepath.Join(mountView(t, s, ViewOptions{Host: true}), "times", "outputs")
	old := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	if err := os.WriteFile(filepath.Join(dir, "shared"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(dir, "shared"), old, old); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, s)
	mustSnapshot(t, s, "times", "snap")
	// The pool's blobs, made when the store opened, and the one a
	// deleted file leaves, are older than everything below.
	if err := os.WriteFile(filepath.Join(dir, "gone"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "gone")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past a second: file times here are ns, a blob's too

	open := func(name string, flag int) func() error {
		return func() error {
			f, err := os.OpenFile(filepath.Join(dir, name), flag, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
	}
	cases := []struct {
		name string
		do   func() error
		want func(before time.Time) (time.Time, bool) // the mtime wanted, and whether it is "at least before"
	}{
		{"created, nothing written", open("touched", os.O_WRONLY|os.O_CREATE),
			func(before time.Time) (time.Time, bool) { return before, true }},
		{"shared, opened for writing, nothing written", open("shared", os.O_WRONLY),
			func(time.Time) (time.Time, bool) { return old, false }},
		{"truncated to empty by open", open("shared", os.O_WRONLY|os.O_TRUNC),
			func(before time.Time) (time.Time, bool) { return before, true }},
	}
	for _, tc := range cases {
		// The kernel dates files by its clock tick, up to 4 ms behind.
		before := time.Now().Add(-10 * time.Millisecond)
		if err := tc.do(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		waitReleased(t, s)
		got, err := os.Stat(filepath.Join(dir, map[bool]string{true: "touched", false: "shared"}[tc.name == cases[0].name]))
		if err != nil {
			t.Fatal(err)
		}
		want, atLeast := tc.want(before)
		if atLeast && got.ModTime().Before(want) || !atLeast && !got.ModTime().Equal(want) {
			t.Errorf("%s: mtime %v, want %v%s", tc.name, got.ModTime(), want, map[bool]string{true: " or later"}[atLeast])
		}
	}
	wantFile(t, s, "times", "snap", "outputs/shared", "data")
}

// waitReleased waits (10 s at most) until no file is open through any
// view: a release is handled after close(2) returns.
func waitReleased(t *testing.T, s *Store) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		open := 0
		s.mu.Lock()
		for _, v := range s.views {
			open += v.OpenFiles()
		}
		s.mu.Unlock()
		if open == 0 {
			return
		}
	}
	t.Fatal("files still open through a view after 10s")
}
