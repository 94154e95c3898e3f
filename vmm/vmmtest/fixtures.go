package vmmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// GuestAgent builds cmd/hearth-guest once per test binary, static and
// without symbol tables, as machines run it, and returns its path.
func GuestAgent(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hearth-agent-")
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "hearth-guest")
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", agentBin, "hearth/cmd/hearth-guest")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("%w: %s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatalf("build hearth-guest: %v", agentErr)
	}
	return agentBin
}

// Busybox returns the host's static busybox, skipping the test if there
// is none.
func Busybox(t testing.TB) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("machine tests need a static busybox for their image root (Debian package busybox-static; scripts/test.sh installs it)")
	}
	return bb
}

// BusyboxRoot fills root, a small image root, with the static busybox bb
// and its applets, and the users root and agent (uid 1000, home
// /home/agent).
func BusyboxRoot(bb, root string) error {
	for _, d := range []string{"bin", "usr/bin", "etc", "tmp", "proc", "sys", "dev", "root", "home/agent", "workspace/agents"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chown(filepath.Join(root, "home/agent"), 1000, 1000)
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" {
			os.Symlink("busybox", filepath.Join(root, "bin", applet))
		}
	}
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{"bin/busybox", data, 0o755},
		{"etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\n"), 0o644},
		{"etc/group", []byte("root:x:0:\nagent:x:1000:\n"), 0o644},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(root, f.path), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}
