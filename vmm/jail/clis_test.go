package jail

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"hearth/image"
	"hearth/vmm"
)

// TestAgentCLIImages builds the image of each agent CLI other than Claude
// Code for real (debootstrap, apt, npm, and the recipe's own --version
// check) and checks that its real CLI starts in a jail as the image's
// unprivileged user agent and prints the version the recipe pins, as the
// image manifest records it.
func TestAgentCLIImages(t *testing.T) {
	for _, tool := range []string{"debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("building the agent CLI images needs %s (scripts/test.sh installs it)", tool)
		}
	}
	d := newDriver(t)
	for _, tc := range []struct {
		image, pkg, pin string
		argv            []string
		// version matches the output; its first group is the version.
		version *regexp.Regexp
	}{
		{"codex", "@openai/codex", "0.169.0", []string{"codex", "--version"}, regexp.MustCompile(`^codex-cli (\d+\.\d+\.\d+)$`)},
		{"opencode", "opencode-ai", "1.18.33", []string{"opencode", "--version"}, regexp.MustCompile(`^(\d+\.\d+\.\d+)$`)},
		{"gemini", "@google/gemini-cli", "0.61.0", []string{"gemini", "--version"}, regexp.MustCompile(`^(\d+\.\d+\.\d+)$`)},
	} {
		t.Run(tc.image, func(t *testing.T) {
			img := buildImage(t, tc.image)
			t.Logf("image %s: built in %.0f s", tc.image, img.BuildSeconds)
			if want := tc.pkg + "@" + tc.pin; !recipePins(t, tc.image, want) {
				t.Fatalf("recipe %s does not pin %s: update this test with the recipe", tc.image, want)
			}
			if got := npmVersion(img, tc.pkg); got != tc.pin {
				t.Errorf("manifest of %s records %s %q, want %s", tc.image, tc.pkg, got, tc.pin)
			}
			ctx := context.Background()
			m, err := d.Create(ctx, vmm.Spec{ID: "real-" + tc.image, RootFS: img.Rootfs(), UID: 1000, GID: 1000, Memory: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Destroy(ctx)
			if out := execOut(t, m, "id", "-un"); out != "agent" {
				t.Errorf("id -un = %q, want agent", out)
			}
			out := execOut(t, m, tc.argv...)
			t.Logf("%s: %s", strings.Join(tc.argv, " "), out)
			got := tc.version.FindStringSubmatch(out)
			if got == nil {
				t.Fatalf("%s = %q, want it to match %s", strings.Join(tc.argv, " "), out, tc.version)
			}
			if got[1] != tc.pin {
				t.Errorf("%s = %s, want the pinned %s", strings.Join(tc.argv, " "), got[1], tc.pin)
			}
		})
	}
}

// recipePins reports whether the built-in recipe name installs pkg, an
// npm name with its version.
func recipePins(t *testing.T, name, pkg string) bool {
	t.Helper()
	cat, err := image.BuiltinCatalog()
	if err != nil {
		t.Fatal(err)
	}
	r, err := cat.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Npm {
		if p == pkg {
			return true
		}
	}
	return false
}
