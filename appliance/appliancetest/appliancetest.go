// Package appliancetest has what tests of the appliance and of the CLI
// share: a guest agent built for the test binary and a small image. Only
// tests import it.
package appliancetest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"hearth/image"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// Agent builds cmd/hearth-guest once per test binary, static, as machines
// run it.
func Agent(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hearth-agent-")
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "hearth-guest")
		build := exec.Command("go", "build", "-o", agentBin, "hearth/cmd/hearth-guest")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			agentErr = err
			t.Logf("go build: %s", out)
		}
	})
	if agentErr != nil {
		t.Fatalf("build hearth-guest: %v", agentErr)
	}
	return agentBin
}

// AddTinyImage saves an image named "tiny" in the image cache dir (a
// daemon's <state_dir>/images): a static busybox with its applets and the
// user agent (uid 1000). Real images take debootstrap and most of a
// minute; this takes a fraction of a second.
func AddTinyImage(t testing.TB, dir string) image.Image {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("sandbox tests need a static busybox for their image (Debian package busybox-static; scripts/test.sh installs it)")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("saving an image needs mkfs.ext4 (Debian package e2fsprogs; scripts/test.sh installs it)")
	}
	cat, err := image.BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	b, err := image.NewBuilder(dir, cat, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	parent := image.Image{Manifest: image.Manifest{Suite: "busybox",
		User: &image.User{Name: "agent", UID: 1000, Shell: "/bin/sh"}, Env: map[string]string{"LANG": "C.UTF-8"}}}
	img, err := b.Save(context.Background(), "tiny", parent, "appliancetest", func(root string) error { return busyboxRoot(bb, root) })
	if err != nil {
		t.Fatalf("save the tiny image: %v", err)
	}
	return img
}

// busyboxRoot fills root with busybox, its applets, root and agent.
func busyboxRoot(bb, root string) error {
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
