package remote

import (
	"path"
	"strings"
	"testing"
)

func TestRel(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/", "."}, {"", "."}, {".", "."}, {"/a/b", "a/b"}, {"a/../b", "b"},
		{"../../etc", "etc"}, {"/a/../../..", "."}, {"//a//b/", "a/b"},
	} {
		if got, err := rel(tc.in); err != nil || got != tc.want {
			t.Errorf("rel(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := rel("a\x00b"); err == nil {
		t.Errorf("rel with a NUL byte succeeded")
	}
}

// FuzzRel: whatever a node sends, the path handed to os.Root is relative,
// clean and never climbs.
func FuzzRel(f *testing.F) {
	for _, s := range []string{"/", "../..", "a/../../b", "/./x/../../y", "a\x00", "..", "//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := rel(p)
		if err != nil {
			if !strings.Contains(p, "\x00") {
				t.Fatalf("rel(%q) = %v", p, err)
			}
			return
		}
		if path.IsAbs(got) || got != path.Clean(got) || got == ".." || strings.HasPrefix(got, "../") {
			t.Fatalf("rel(%q) = %q: escapes or unclean", p, got)
		}
	})
}
