package share

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// view mounts a small tmpfs holding one file, standing in for a
// workspace view (a FUSE mount) as far as mounts go.
func view(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644)
	return dir
}

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
}

// TestReplaceReachesSlaves: a process in a mount namespace made a slave
// of the host's after Setup (as virtiofsd's is) reads the view Replace
// put in place, not the one it started with.
func TestReplaceReachesSlaves(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not on PATH: apt-get install util-linux")
	}
	dir := filepath.Join(t.TempDir(), "share")
	if err := Setup(dir, view(t, "one")); err != nil {
		t.Fatalf("Setup = %v", err)
	}
	defer Teardown(dir)
	// The slave reads agents/f, waits to be told, and reads it again.
	cmd := exec.Command("unshare", "-m", "--propagation", "slave", "sh", "-c", `cat "$1/agents/f"; echo; read x; cat "$1/agents/f"`, "sh", dir)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	first, _ := r.ReadString('\n')
	if err := Replace(dir, view(t, "two")); err != nil {
		t.Fatalf("Replace = %v", err)
	}
	stdin.Write([]byte("go\n"))
	second, _ := io.ReadAll(r)
	cmd.Wait()
	if got := first + string(second); got != "one\ntwo" {
		t.Errorf("the slave namespace read %q, want one, then two", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, Sub, "f")); string(b) != "two" {
		t.Errorf("the host reads %q at agents/f, want two", b)
	}
}

// TestTeardown removes the share, with whatever is mounted under it, and
// leaves the view's files alone.
func TestTeardown(t *testing.T) {
	requireRoot(t)
	v := view(t, "kept")
	dir := filepath.Join(t.TempDir(), "share")
	if err := Setup(dir, v); err != nil {
		t.Fatalf("Setup = %v", err)
	}
	other := filepath.Join(dir, "other")
	os.Mkdir(other, 0o755)
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "written-by-the-guest"), nil, 0o644)
	if got := mountsUnder(dir); len(got) != 3 {
		t.Errorf("mountsUnder(share) = %q, want the share, its view and the other mount", got)
	}
	if err := Teardown(dir); err != nil {
		t.Fatalf("Teardown = %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("share after Teardown: %v, want it gone", err)
	}
	if got := mountsUnder(dir); len(got) != 0 {
		t.Errorf("mounts left under the share: %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(v, "f")); err != nil || string(b) != "kept" {
		t.Errorf("the view after Teardown has %q, %v; want its file kept", b, err)
	}
	if err := Teardown(dir); err != nil {
		t.Errorf("second Teardown = %v, want nil", err)
	}
}

func TestBadView(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "share")
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	for _, v := range []string{filepath.Join(t.TempDir(), "none"), file} {
		if err := Setup(dir, v); err == nil || !strings.Contains(err.Error(), "workspace view") {
			t.Errorf("Setup(%s) = %v, want an error naming the workspace view", v, err)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a failed Setup left %s: %v", dir, err)
	}
	// A machine with no share (made by an older Hearth) is told so.
	os.Mkdir(dir, 0o755)
	if err := Replace(dir, t.TempDir()); err == nil || !strings.Contains(err.Error(), "not set up") {
		t.Errorf("Replace on a plain directory = %v, want an error saying the share is not set up", err)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/end\04`: `/end\04`} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
