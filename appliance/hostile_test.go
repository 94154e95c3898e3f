package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/fs"
)

// An agent replaces its outputs directory with a symbolic link to another
// session's private .home: the execution record must not list that
// session's files as its outputs.
func TestHostileOutputsSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting the host view needs root (FUSE)")
	}
	dir := t.TempDir()
	store, err := fs.Open(fs.Options{Dir: filepath.Join(dir, "ws")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	host := filepath.Join(dir, "agents")
	v, err := store.Mount(host, fs.ViewOptions{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Unmount() })
	for _, s := range []string{"victim", "attacker"} {
		if err := store.CreateSession(s, fs.Owner{UID: 1000, GID: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.WriteFile("victim", ".home/private-notes.txt", strings.NewReader("secret"), 0, fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.WriteFile("attacker", "inputs/brief.md", strings.NewReader("x"), 0, fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	// The attack, as the agent would do it through its own view: the
	// target is the path the host view shows the victim's home at.
	if err := os.Remove(filepath.Join(host, "attacker", "outputs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(host, "victim", ".home"), filepath.Join(host, "attacker", "outputs")); err != nil {
		t.Fatal(err)
	}
	ws := agentWorkspace{store: store, host: host}
	for _, pattern := range []string{"outputs/*", "outputs/*.txt", "*/*"} {
		got, err := ws.Glob("attacker", pattern)
		if err != nil {
			t.Fatalf("Glob(%q): %v", pattern, err)
		}
		for _, p := range got {
			if strings.Contains(p, "private-notes") {
				t.Errorf("Glob(%q) = %q: lists the victim's private file through the attacker's symlink", pattern, got)
			}
		}
		if pattern == "*/*" && (len(got) != 1 || got[0] != "inputs/brief.md") {
			t.Errorf("Glob(%q) = %q, want [inputs/brief.md]", pattern, got)
		}
	}
}
