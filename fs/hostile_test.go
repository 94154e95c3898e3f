package fs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// asNobody runs a command as the unprivileged user nobody (65534).
func asNobody(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd.CombinedOutput()
}

// openDir makes dir and its parents up to the test's temporary directory
// enterable by every user, so that what keeps them out is the code under
// test and not t.TempDir's 0700.
func openDir(t *testing.T, dir string) {
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

// Another local user must not read sessions' files through the host view,
// even those whose modes would let them.
func TestHostileHostViewOtherUser(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "a")
	if _, err := s.WriteFile("a", "inputs/brief.md", strings.NewReader("confidential brief"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	host := mountView(t, s, ViewOptions{Host: true})
	openDir(t, filepath.Dir(host))
	file := filepath.Join(host, "a", "inputs", "brief.md")
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm()&0o004 == 0 {
		t.Fatalf("stat %s = %v, %v: want a file whose mode lets others read it", file, fi, err)
	}
	if out, err := asNobody("cat", file); err == nil {
		t.Errorf("user nobody read %s through the host view: %q", file, out)
	}
	if out, err := asNobody("ls", host); err == nil {
		t.Errorf("user nobody listed the host view: %q", out)
	}

	// With AllowOther, modes apply as on any filesystem.
	open := mountView(t, s, ViewOptions{Host: true, AllowOther: true})
	openDir(t, filepath.Dir(open))
	if out, err := asNobody("cat", filepath.Join(open, "a", "inputs", "brief.md")); err != nil || string(out) != "confidential brief" {
		t.Errorf("with AllowOther, nobody reads %q, %v; want the brief", out, err)
	}
}
