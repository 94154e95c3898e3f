package fs

import (
	"path"
	"strings"
	"testing"
)

// FuzzGlob: any pattern either is refused or lists only regular files of
// the session that match it component by component, never a file reached
// through a symbolic link.
func FuzzGlob(f *testing.F) {
	for _, seed := range []string{"outputs/*.md", "*/*", "outputs/[a-", "../*", "/outputs/./*", "outputs/**", "link/*", "*/*/*", "", "\\"} {
		f.Add(seed)
	}
	s := openStore(f, f.TempDir())
	f.Cleanup(func() { s.Close() })
	mustSession(f, s, "a")
	if err := s.MkdirAll("a", "outputs/sub", Owner{}); err != nil {
		f.Fatal(err)
	}
	for _, p := range []string{"outputs/r.md", "outputs/sub/deep.txt", "inputs/in.csv", ".home/secret"} {
		if _, err := s.WriteFile("a", p, strings.NewReader(p), 0, Owner{}); err != nil {
			f.Fatal(err)
		}
	}
	s.mu.Lock()
	sess := s.sessions["a"]
	s.mknod(nil, sess, rootIno, "link", 0o120777, 0, 0, 0, "outputs")
	s.mu.Unlock()
	f.Fuzz(func(t *testing.T, pattern string) {
		got, err := s.Glob("a", pattern)
		if err != nil {
			return
		}
		for _, p := range got {
			if strings.HasPrefix(p, "link/") {
				t.Errorf("Glob(%q) lists %q through a symbolic link", pattern, p)
			}
			if _, err := s.ReadFile("a", "", p, 0); err != nil {
				t.Errorf("Glob(%q) lists %q, which does not read: %v", pattern, p, err)
			}
			want := strings.Split(strings.Trim(path.Clean("/"+pattern), "/"), "/")
			parts := strings.Split(p, "/")
			if len(parts) != len(want) {
				t.Errorf("Glob(%q) lists %q: %d components, pattern %d", pattern, p, len(parts), len(want))
				continue
			}
			for i := range parts {
				if ok, _ := path.Match(want[i], parts[i]); !ok {
					t.Errorf("Glob(%q) lists %q: %q does not match %q", pattern, p, parts[i], want[i])
				}
			}
		}
	})
}
