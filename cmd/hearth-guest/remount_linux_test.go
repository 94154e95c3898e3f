package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRemountHelper runs the helper as the agent does, re-executed (here
// the test binary, whose init dispatches it), but in a private mount
// namespace made by unshare(1), with a directory standing for the
// virtio-fs tag: each request detaches what is at the mount point and
// mounts the source again; a failure is answered, not fatal; a helper
// that is gone is reported.
func TestRemountHelper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the helper mounts: needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare not on PATH: apt-get install util-linux")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{"one", "two", "share"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "one", "file"), []byte("one"), 0o644)
	os.WriteFile(filepath.Join(dir, "two", "file"), []byte("two"), 0o644)
	device, target := filepath.Join(dir, "device"), filepath.Join(dir, "share")
	if err := os.Symlink(filepath.Join(dir, "one"), device); err != nil {
		t.Fatal(err)
	}
	r, err := startRemountHelper(exec.Command(unshare, "--mount", "--propagation", "private", exe), workspaceSource{"bind", device, target})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.cmd.Process.Kill(); r.conn.Close() })
	pid := r.cmd.Process.Pid
	// What the helper's mount namespace has at the mount point.
	inside := func() string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s/file", pid, target))
		if err != nil {
			return "(none)"
		}
		return string(b)
	}
	mounts := func() int {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && f[4] == target {
				n++
			}
		}
		return n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := r.remount(ctx); err != nil {
		t.Fatalf("first remount: %v", err)
	}
	if got := inside(); got != "one" {
		t.Fatalf("after the first remount the mount point holds %q, want one", got)
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Fatalf("the mount leaked into the test's namespace: %v", ents)
	}
	// The device is replaced (a new virtiofsd): the next remount mounts
	// the new one in place of the old, not on top of it.
	os.Remove(device)
	os.Symlink(filepath.Join(dir, "two"), device)
	if err := r.remount(ctx); err != nil {
		t.Fatalf("second remount: %v", err)
	}
	if got, n := inside(), mounts(); got != "two" || n != 1 {
		t.Fatalf("after the second remount the mount point holds %q in %d mounts, want two in 1", got, n)
	}
	// No device: the old mount is gone and the error says why.
	os.Remove(device)
	err = r.remount(ctx)
	if err == nil || !strings.Contains(err.Error(), "mount bind "+device+" on "+target) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("remount without a device: %v, want the mount's error", err)
	}
	if got, n := inside(), mounts(); got != "(none)" || n != 0 {
		t.Fatalf("after a failed remount the mount point holds %q in %d mounts, want nothing", got, n)
	}
	// The helper survives a failed request.
	os.Symlink(filepath.Join(dir, "one"), device)
	if err := r.remount(ctx); err != nil || inside() != "one" {
		t.Fatalf("remount after a failure: %v, holds %q", err, inside())
	}
	// A helper that is gone is reported, now and after.
	r.cmd.Process.Signal(syscall.SIGKILL)
	if err := r.remount(ctx); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("remount with the helper killed: %v, want did not answer", err)
	}
	if err := r.remount(ctx); err == nil || !strings.Contains(err.Error(), "unusable") {
		t.Fatalf("remount after the helper died: %v, want unusable", err)
	}
}

func TestRemountHelperBadInput(t *testing.T) {
	for _, src := range []workspaceSource{
		{"nfs", "tag", "/workspace/.share"},
		{"virtiofs", "", "/workspace/.share"},
		{"bind", "/dev", "workspace/.share"},
	} {
		if _, err := startRemountHelper(exec.Command("/bin/true"), src); err == nil {
			t.Errorf("startRemountHelper(%+v) = nil error", src)
		}
	}
	if err := runRemountHelper([]string{"virtiofs", "tag"}, nil); err == nil || !strings.Contains(err.Error(), "FSTYPE SOURCE TARGET") {
		t.Errorf("runRemountHelper with two arguments: %v", err)
	}
	// Started by hand with the wrong arguments, the helper exits saying so.
	exe, _ := os.Executable()
	out, err := exec.Command(exe, remountHelperArg, "ext4", "x", "/y").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `file system type "ext4"`) {
		t.Errorf("helper with fstype ext4: %v: %s", err, out)
	}
}

// TestNoRemountHelperWithoutWorkspace: outside a VM and with no device
// directory there is nothing to remount, and no helper.
func TestNoRemountHelperWithoutWorkspace(t *testing.T) {
	hook, err := startWorkspaceRemount(false, "")
	if hook != nil || err != nil {
		t.Fatalf("startWorkspaceRemount(false, \"\") = %v, %v; want no hook", hook != nil, err)
	}
}
