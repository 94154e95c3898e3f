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
	// The release is handled after close returns: wait until it was.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		open := 0
		s.mu.Lock()
		for _, v := range s.views {
			open += v.OpenFiles()
		}
		s.mu.Unlock()
		if open == 0 {
			break
		}
	}
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
