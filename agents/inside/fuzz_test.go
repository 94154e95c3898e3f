package inside

import (
	"path"
	"strings"
	"testing"
)

// FuzzParseInput: whatever path an agent gives, an accepted input names
// a file (not a directory it could be cut short to) in a session, never
// under .home, never with .., and under outputs/ unless in the caller's
// own session; its name is the path's last component.
func FuzzParseInput(f *testing.F) {
	for _, s := range []string{"session-a/notes.md", "session-b/outputs/r.md", "session-b/outputs/../../etc/passwd", "/workspace/agents/session-a/x",
		"session-a/.home/.claude.json", "session-b/inputs/x", "..", "session-a/", "session-a//x", "./session-a/x", "session-a/a\x00b",
		"session-b/outputs", "session-b/outputs/.home", "session-a\\..\\x", ".home/x"} {
		f.Add("session-a", s)
	}
	f.Fuzz(func(t *testing.T, own, p string) {
		in, err := ParseInput(own, p)
		if err != nil {
			return
		}
		parts := strings.Split(in.Path, "/")
		switch {
		case in.Session+"/"+in.Path != p:
			t.Fatalf("%q parsed as %+v", p, in)
		case CheckSession(in.Session) != nil:
			t.Fatalf("%q: session %q accepted", p, in.Session)
		case path.Clean(p) != p || strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0):
			t.Fatalf("%q accepted, not a plain relative path", p)
		case parts[0] == ".home":
			t.Fatalf("%q: a .home file accepted", p)
		case in.Session != own && (parts[0] != "outputs" || len(parts) < 2):
			t.Fatalf("%q accepted from session %q: not another session's outputs", p, own)
		case in.Name != parts[len(parts)-1] || in.Name == ".." || in.Name == "." || in.Name == "":
			t.Fatalf("%q: name %q", p, in.Name)
		}
		for _, c := range parts {
			if c == ".." || c == "" {
				t.Fatalf("%q: component %q accepted", p, c)
			}
		}
	})
}

// FuzzCheckPattern: an accepted glob is relative, has no .. component,
// is not under .home, and every component is a valid pattern.
func FuzzCheckPattern(f *testing.F) {
	for _, s := range []string{"outputs/*.md", "../x", "outputs/[", ".home/*", "/etc/*", "a//b", "outputs/**/x", "x/./y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, g string) {
		if CheckPattern(g) != nil {
			return
		}
		if strings.HasPrefix(g, "/") || path.Clean(g) != g {
			t.Fatalf("%q accepted", g)
		}
		for i, c := range strings.Split(g, "/") {
			if _, err := path.Match(c, ""); err != nil || c == ".." || (i == 0 && c == ".home") {
				t.Fatalf("%q: component %q accepted", g, c)
			}
		}
	})
}

// FuzzCheckSkill: a skill CheckSkill accepts names a session and a plain
// path in it, never .home, never the agents directory, and of another
// session only under its outputs/.
func FuzzCheckSkill(f *testing.F) {
	for _, s := range []string{"session:session-a/skills/review", "session:session-b/outputs/skills/x", "session:session-b/skills/x",
		"skills/review", "session:session-b/outputs/../inputs", "session:session-a/.home/skills", "session:../x", "session:session-a/",
		"session:session-a", "session:session-b/outputs", "session:session-a//x", "session:session-a/a\x00b", "session:/etc"} {
		f.Add("session-a", s)
	}
	f.Fuzz(func(t *testing.T, own, s string) {
		if CheckSkill(own, s) != nil {
			return
		}
		rest, ok := strings.CutPrefix(s, "session:")
		sess, dir, _ := strings.Cut(rest, "/")
		first, _, _ := strings.Cut(dir, "/")
		switch {
		case !ok || CheckSession(sess) != nil:
			t.Fatalf("%q accepted: not in a session", s)
		case dir == "" || path.Clean(dir) != dir || path.IsAbs(dir) || dir == ".." || strings.HasPrefix(dir, "../") || strings.ContainsRune(dir, 0):
			t.Fatalf("%q accepted: not a plain path", s)
		case first == ".home":
			t.Fatalf("%q accepted: in .home", s)
		case sess != own && (first != "outputs" || dir == "outputs"):
			t.Fatalf("%q accepted for %q: another session's non-outputs", s, own)
		}
	})
}
