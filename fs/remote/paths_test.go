package remote

import (
	"path"
	"strings"
	"testing"

	"hearth/fs"
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

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want viewUser
		ok   bool
	}{
		{"alpha", viewUser{session: "alpha"}, true},
		{"alpha+1+2+3", viewUser{"alpha", fs.IDShift{From: 1, To: 2, Size: 3}}, true},
		{"alpha+1+2", viewUser{}, false},
		{"alpha+1+2+x", viewUser{}, false},
		{"alpha+4294967295+0+2", viewUser{}, false},
		{"../x", viewUser{}, false},
		{"", viewUser{}, false},
		{"Alpha", viewUser{}, false},
	} {
		got, err := parseUser(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseUser(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// FuzzParseUser: an SSH user either names a valid session and a range
// that fits, and reads back the same, or is refused.
func FuzzParseUser(f *testing.F) {
	for _, s := range []string{"alpha", "alpha+0+1073741824+65536", "a++1+2", "a+-1+2+3", "a+1+2+3+4", "..", "a+99999999999+1+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		v, err := parseUser(u)
		if err != nil {
			return
		}
		if fs.ValidateID("session", v.session) != nil {
			t.Fatalf("parseUser(%q) accepted session %q", u, v.session)
		}
		if uint64(v.ids.From)+uint64(v.ids.Size) > 1<<32 || uint64(v.ids.To)+uint64(v.ids.Size) > 1<<32 {
			t.Fatalf("parseUser(%q) accepted range %+v", u, v.ids)
		}
		again, err := parseUser(v.String())
		if err != nil || again != v {
			t.Fatalf("parseUser(%q) = %+v, but its String %q reads back as %+v, %v", u, v, v.String(), again, err)
		}
	})
}
