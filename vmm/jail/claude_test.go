package jail

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dustin/go-humanize"

	"hearth/image"
	"hearth/vmm"
	"hearth/vmm/guest"
)

// TestClaudeCodeImage builds the claude-code image for real (debootstrap,
// apt, npm) and checks that the real claude binary starts as the image's
// unprivileged user agent and prints its version.
func TestClaudeCodeImage(t *testing.T) {
	d := newDriver(t)
	for _, tool := range []string{"debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("building the claude-code image needs %s (scripts/test.sh installs it)", tool)
		}
	}
	img := buildImage(t, "claude-code")
	ctx := context.Background()
	// claude --version alone keeps about 200 MiB resident.
	m, err := d.Create(ctx, vmm.Spec{ID: "real-claude", RootFS: img.Rootfs(), UID: 1000, GID: 1000, Memory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Destroy(ctx)
	if out := execOut(t, m, "id", "-un"); out != "agent" {
		t.Errorf("id -un = %q, want agent", out)
	}
	version := regexp.MustCompile(`^(\d+\.\d+\.\d+) \(Claude Code\)$`)
	out := execOut(t, m, "claude", "--version")
	t.Logf("claude --version: %s", out)
	got := version.FindStringSubmatch(out)
	if got == nil {
		t.Fatalf("claude --version = %q, want it to match %s", out, version)
	}
	if want := npmVersion(img, "@anthropic-ai/claude-code"); got[1] != want {
		t.Errorf("claude --version = %s, want %s as the image manifest records", got[1], want)
	}
}

func npmVersion(img image.Image, name string) string {
	for _, p := range img.Npm {
		if p.Name == name {
			return p.Version
		}
	}
	return ""
}

// buildImage builds a built-in image, with the builder's progress in the
// test log, in the cache HEARTH_TEST_IMAGES names (scripts/test.sh sets
// it, so the packages that need real images build each one once; the
// builder's lock makes that safe across test processes), or else in one
// of the test's own.
func buildImage(t *testing.T, name string) image.Image {
	t.Helper()
	cat, err := image.BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	return buildFrom(t, cat, name)
}

// buildFrom is buildImage with a catalog of the test's own.
func buildFrom(t *testing.T, cat *image.Catalog, name string) image.Image {
	t.Helper()
	dir := os.Getenv("HEARTH_TEST_IMAGES")
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "images")
	}
	b, err := image.NewBuilder(dir, cat, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	img, err := b.Build(ctx, name)
	if err != nil {
		t.Fatalf("build %s image: %v", name, err)
	}
	t.Logf("image %s: rootfs %s, ext4 %s", name, humanize.IBytes(uint64(img.Size)), humanize.IBytes(uint64(img.Ext4Size)))
	return img
}

// execOut execs argv in m as the machine's default user and returns its
// trimmed stdout, failing the test unless it exits 0.
func execOut(t *testing.T, m vmm.Machine, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: argv}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", argv, m.ID(), err)
	}
	if st.Error != "" || st.Code != 0 {
		t.Fatalf("exec %q in %s = %+v, want exit 0: %s%s", argv, m.ID(), st, &out, &errb)
	}
	return strings.TrimSpace(out.String())
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
