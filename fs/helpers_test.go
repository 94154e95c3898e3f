package fs

import (
	"os"
	"path/filepath"
	"testing"
)

// requireFUSE skips tests that mount when this process cannot.
func requireFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting the workspace needs root (FUSE DirectMount); run the tests as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("mounting the workspace needs /dev/fuse, which is missing")
	}
}

func openStore(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("Open(%q) = %v", dir, err)
	}
	return s
}

func testStore(t testing.TB) *Store {
	t.Helper()
	s := openStore(t, filepath.Join(t.TempDir(), "state"))
	t.Cleanup(func() { s.Close() })
	return s
}

func mountView(t testing.TB, s *Store, opts ViewOptions) string {
	t.Helper()
	requireFUSE(t)
	dir := filepath.Join(t.TempDir(), "mnt")
	v, err := s.Mount(dir, opts)
	if err != nil {
		t.Fatalf("Mount(%s, %+v) = %v", dir, opts, err)
	}
	t.Cleanup(func() {
		if err := v.Unmount(); err != nil {
			t.Errorf("Unmount: %v", err)
		}
	})
	return dir
}

func mustSession(t testing.TB, s *Store, id string) {
	t.Helper()
	if err := s.CreateSession(id, Owner{}); err != nil {
		t.Fatalf("CreateSession(%q) = %v", id, err)
	}
}
