package fs

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestViewOpenFiles: a file or directory open through a view counts
// until it is closed (a daemon about to stop waits for none open).
func TestViewOpenFiles(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "a")
	v, err := s.Mount(filepath.Join(t.TempDir(), "mnt"), ViewOptions{Session: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Unmount()
	if n := v.OpenFiles(); n != 0 {
		t.Fatalf("OpenFiles of a fresh view = %d, want 0", n)
	}
	f, err := os.Create(filepath.Join(v.Dir(), "a/outputs/x"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(filepath.Join(v.Dir(), "a/outputs"))
	if err != nil {
		t.Fatal(err)
	}
	if n := v.OpenFiles(); n != 2 {
		t.Errorf("OpenFiles with a file and a directory open = %d, want 2", n)
	}
	f.Close()
	d.Close()
	// The kernel sends the releases after the closes return.
	for deadline := time.Now().Add(5 * time.Second); v.OpenFiles() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("OpenFiles after the closes = %d, want 0", v.OpenFiles())
		}
	}
}

// TestViewLastLookup: resolving a name through a view, even one that
// does not exist, moves LastLookup (a daemon about to stop waits for a
// moment with no path being resolved); reading an open file does not.
func TestViewLastLookup(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "a")
	v, err := s.Mount(filepath.Join(t.TempDir(), "mnt"), ViewOptions{Session: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Unmount()
	if !v.LastLookup().IsZero() {
		t.Fatalf("LastLookup of a fresh view = %v, want zero", v.LastLookup())
	}
	before := time.Now()
	f, err := os.Create(filepath.Join(v.Dir(), "a/outputs/x"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	after := v.LastLookup()
	if after.Before(before) {
		t.Fatalf("LastLookup after a create = %v, before it %v", after, before)
	}
	os.Stat(filepath.Join(v.Dir(), "a/outputs/nothing"))
	if !v.LastLookup().After(after) {
		t.Fatalf("LastLookup after a failed stat = %v, not after %v", v.LastLookup(), after)
	}
	seen := v.LastLookup()
	f.Write([]byte("x"))
	f.ReadAt(make([]byte, 1), 0)
	if v.LastLookup() != seen {
		t.Fatalf("LastLookup moved on a write to an open file: %v, was %v", v.LastLookup(), seen)
	}
}
