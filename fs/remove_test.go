package fs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRemoveAllAndChmod: RemoveAll takes a tree away and a symbolic link
// itself, never what it points at; Chmod sets a file's or directory's
// bits, and neither follows a link on the way.
func TestRemoveAllAndChmod(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "a")
	for _, p := range []string{"tree/x", "tree/sub/y", "keep/z"} {
		if err := s.MkdirAll("a", filepath.Dir(p), Owner{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WriteFile("a", p, strings.NewReader(p), 0, Owner{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Chmod("a", "tree/sub/y", 0o444); err != nil {
		t.Fatal(err)
	}
	if err := s.Chmod("a", "tree/sub", 0o555); err != nil {
		t.Fatal(err)
	}
	// A link, as an agent would make, to a directory it wants removed.
	host := mountView(t, s, ViewOptions{Host: true})
	if err := os.Symlink("../keep", filepath.Join(host, "a", "tree", "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"tree/link/z", "tree/link"} {
		if err := s.Chmod("a", p, 0o777); p == "tree/link/z" && !errors.Is(err, ErrSymlinkInPath) || p == "tree/link" && err == nil {
			t.Errorf("Chmod(%s) = %v, want refused", p, err)
		}
	}
	if err := s.RemoveAll("a", "tree/link/z"); !errors.Is(err, ErrSymlinkInPath) {
		t.Errorf("RemoveAll through a link = %v, want ErrSymlinkInPath", err)
	}
	for _, c := range []struct {
		p    string
		mode os.FileMode
	}{{"tree/sub/y", 0o444}, {"tree/sub", 0o555 | os.ModeDir}} {
		if fi, err := os.Stat(filepath.Join(host, "a", c.p)); err != nil || fi.Mode() != c.mode {
			t.Errorf("%s: %v, %v; want %v", c.p, fi.Mode(), err, c.mode)
		}
	}
	if err := s.RemoveAll("a", "tree"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"tree/x", "tree/sub/y"} {
		if _, err := s.ReadFile("a", "", p, 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s after RemoveAll: %v", p, err)
		}
	}
	if err := s.MkdirAll("a", "tree", Owner{}); err != nil {
		t.Errorf("making tree again after RemoveAll: %v", err)
	}
	if data, err := s.ReadFile("a", "", "keep/z", 0); err != nil || string(data) != "keep/z" {
		t.Errorf("the link's target after RemoveAll = %q, %v; want it kept", data, err)
	}
	if err := s.RemoveAll("a", "tree/none"); err != nil {
		t.Errorf("RemoveAll of a missing path = %v", err)
	}
	if err := s.RemoveAll("nobody", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveAll in a missing session = %v", err)
	}
}
