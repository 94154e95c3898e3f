package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/appliance/api"
	"hearth/image"
)

// requireBuildTools skips unless real images can be built here.
func requireBuildTools(t *testing.T) {
	t.Helper()
	for _, cmd := range []string{"debootstrap", "mkfs.ext4", "e2fsck", "chroot", "mount"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("building the base image needs %s: scripts/test.sh installs it", cmd)
		}
	}
	if _, err := image.MirrorFor("/etc/apt", "bookworm"); err != nil {
		t.Skipf("the host's apt sources have no Debian bookworm mirror for debootstrap: %v", err)
	}
}

// TestImagesAPI builds the real base image through the API, streaming
// its progress, then boots a sandbox on it; an image in use cannot be
// removed. With HEARTH_TEST_IMAGES set (scripts/test.sh does) the daemon's
// image cache is that shared one, so base is built once for every
// package's tests, and this test removes nothing from it.
func TestImagesAPI(t *testing.T) {
	cfg := agentConfig(t)
	requireBuildTools(t)
	if shared := os.Getenv("HEARTH_TEST_IMAGES"); shared != "" {
		if err := os.MkdirAll(shared, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(shared, filepath.Join(cfg.StateDir, "images")); err != nil {
			t.Fatal(err)
		}
	}
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	list, err := c.Images(ctx)
	if err != nil || !slices.Contains(list.Recipes, "base") {
		t.Fatalf("Images = %+v, %v; want the base recipe", list, err)
	}
	var lines []string
	start := time.Now()
	img, err := c.BuildImage(ctx, "base", writerFunc(func(p []byte) (int, error) {
		lines = append(lines, fmt.Sprintf("%6.1fs %s", time.Since(start).Seconds(), strings.TrimSpace(string(p))))
		return len(p), nil
	}))
	if err != nil {
		t.Fatalf("BuildImage(base) = %v; progress:\n%s", err, strings.Join(lines, "\n"))
	}
	t.Logf("progress as it arrived:\n%s", strings.Join(lines, "\n"))
	if !img.Current || img.User != "agent" || img.Size == 0 || len(lines) < 2 || !strings.Contains(lines[0], "build started") {
		t.Errorf("built %+v with progress %q", img, lines)
	}
	man, err := c.InspectImage(ctx, "base")
	if err != nil || man.Hash != img.Hash || man.User.Uid != 1000 || !hasPackage(man.DebianPackages, "python3") {
		t.Errorf("InspectImage(base) = %+v, %v", man, err)
	}
	if list, _ := c.Images(ctx); !slices.ContainsFunc(list.Images, func(i Image) bool { return i.Name == "base" && i.Current }) {
		t.Errorf("Images after the build = %+v, want base, current", list.Images)
	}
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "real", Image: "base", Session: "real-s"}); err != nil {
		t.Fatal(err)
	}
	out, st := run(t, c, "real", "id -un; python3 -c 'print(6*7)'; echo hi > /workspace/agents/real-s/outputs/hi.txt && echo wrote")
	if st.Code != 0 || out != "agent\n42\nwrote\n" {
		t.Errorf("in a sandbox on base: %q, exit %d", out, st.Code)
	}
	wantCode(t, c.RemoveImage(ctx, "base"), "conflict", 409)
	if err := c.DestroySandbox(ctx, "real"); err != nil {
		t.Fatal(err)
	}
}

// TestRemoveImage removes an image no sandbox uses any more.
func TestRemoveImage(t *testing.T) {
	_, c := startSandboxDaemon(t, sandboxConfig(t))
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "user"}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.RemoveImage(ctx, "tiny"), "conflict", 409)
	if err := c.DestroySandbox(ctx, "user"); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveImage(ctx, "tiny"); err != nil {
		t.Fatalf("RemoveImage(tiny) = %v", err)
	}
	_, err := c.InspectImage(ctx, "tiny")
	wantCode(t, err, "not_found", 404)
	_, err = c.CreateSandbox(ctx, CreateSandboxRequest{})
	wantCode(t, err, "not_found", 404)
}

func hasPackage(ps []Package, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

func TestBuildErrorNamesStep(t *testing.T) {
	e := apiError(&image.StepError{Image: "base", Step: "debootstrap", Err: os.ErrPermission})
	if e.Code != "build_failed" || e.Step != "debootstrap" || e.Status != 500 || !strings.Contains(e.Message, "debootstrap") {
		t.Errorf("apiError(StepError) = %+v", e)
	}
}

// TestImageCLIVersions: an image's agent CLI version is its CLI
// package's version in the manifest (npm ls -g); a saved image goes by its
// parent's recipe; an image without a CLI has none.
func TestImageCLIVersions(t *testing.T) {
	s, err := newImageService(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	npm := []image.Package{{Name: "@openai/codex", Version: "0.169.0"}, {Name: "npm", Version: "10.8.2"}}
	cases := []struct {
		m    image.Manifest
		want []api.CLIVersion
	}{
		{image.Manifest{Name: "codex", CLI: "codex", Npm: npm}, []api.CLIVersion{{Name: "codex", Package: "@openai/codex", Version: "0.169.0"}}},
		{image.Manifest{Name: "mine", Parent: "codex", CLI: "codex", Npm: npm}, []api.CLIVersion{{Name: "codex", Package: "@openai/codex", Version: "0.169.0"}}},
		{image.Manifest{Name: "codex", CLI: "codex"}, []api.CLIVersion{{Name: "codex", Package: "@openai/codex", Version: "unknown"}}},
		{image.Manifest{Name: "base", Npm: npm}, []api.CLIVersion{}},
	}
	for _, tc := range cases {
		if got := s.clis(tc.m); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("clis(%s) = %+v, want %+v", tc.m.Name, got, tc.want)
		}
	}
}
