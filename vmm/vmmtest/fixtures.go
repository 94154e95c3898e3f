package vmmtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
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
// without symbol tables, as machines run it, and returns its path: one
// file per checkout under the temporary directory, replaced whole by each
// build (test binaries of one checkout build the same bytes), so runs
// leave one binary behind, not one each.
func GuestAgent(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			agentErr = fmt.Errorf("go list -m: %w", err)
			return
		}
		sum := sha256.Sum256(bytes.TrimSpace(root))
		dir := filepath.Join(os.TempDir(), "hearth-test-agent")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "hearth-guest-"+hex.EncodeToString(sum[:6]))
		tmp := fmt.Sprintf("%s.%d", agentBin, os.Getpid())
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "hearth/cmd/hearth-guest")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			os.Remove(tmp)
			agentErr = fmt.Errorf("%w: %s", err, out)
			return
		}
		agentErr = os.Rename(tmp, agentBin)
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
