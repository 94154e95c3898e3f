// Package appliancetest has what tests of the appliance and of the CLI
// share: a guest agent built for the test binary, a small image, and the
// claude-code image agents run in. Only tests import it.
package appliancetest

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/image"
	"hearth/vmm/vmmtest"
)

// Agent builds cmd/hearth-guest once per test binary, static, as machines
// run it.
func Agent(t testing.TB) string { return vmmtest.GuestAgent(t) }

// AddTinyImage saves an image named "tiny" in the image cache dir (a
// daemon's <state_dir>/images): a static busybox with its applets and the
// user agent (uid 1000). Real images take debootstrap and most of a
// minute; this takes a fraction of a second.
func AddTinyImage(t testing.TB, dir string) image.Image {
	t.Helper()
	bb := vmmtest.Busybox(t)
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
	img, err := b.Save(context.Background(), "tiny", parent, "appliancetest", func(root string) error { return vmmtest.BusyboxRoot(bb, root) })
	if err != nil {
		t.Fatalf("save the tiny image: %v", err)
	}
	return img
}

var (
	imagesMu    sync.Mutex
	imagesBuilt = map[string]*built{}
)

type built struct {
	once sync.Once
	err  error
}

// ClaudeCodeImages returns an image cache holding the claude-code image
// (Images).
func ClaudeCodeImages(t testing.TB) string { return Images(t, "claude-code") }

// Images returns an image cache holding each named built-in image, each
// built once per test binary (minutes the first time on a machine,
// nothing after): the shared cache HEARTH_TEST_IMAGES names
// (scripts/test.sh sets it), else one under the system's temp directory.
// Make it a daemon's image cache with LinkImages.
func Images(t testing.TB, names ...string) string {
	t.Helper()
	for _, tool := range []string{"debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the %s image needs %s to build (scripts/test.sh installs it)", strings.Join(names, ", "), tool)
		}
	}
	cache := os.Getenv("HEARTH_TEST_IMAGES")
	if cache == "" {
		cache = filepath.Join(os.TempDir(), "hearth-agents-test-images")
	}
	for _, name := range names {
		imagesMu.Lock()
		b := imagesBuilt[name]
		if b == nil {
			b = &built{}
			imagesBuilt[name] = b
		}
		imagesMu.Unlock()
		b.once.Do(func() {
			cat, err := image.BuiltinCatalog()
			if err != nil {
				b.err = err
				return
			}
			bd, err := image.NewBuilder(cache, cat, io.Discard)
			if err != nil {
				b.err = err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			_, b.err = bd.Build(ctx, name)
		})
		if b.err != nil {
			t.Fatalf("build the %s image: %v", name, b.err)
		}
	}
	return cache
}

// LinkImages makes cache the image cache of the daemon whose state
// directory is stateDir, replacing the one it has: images are big, and
// a cache is safe to share (builders take turns).
func LinkImages(t testing.TB, stateDir, cache string) {
	t.Helper()
	dir := filepath.Join(stateDir, "images")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(cache, dir); err != nil {
		t.Fatal(err)
	}
}
