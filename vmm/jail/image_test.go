package jail

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

// TestRealImage runs a jail on the real base image, built by package image
// with debootstrap: the image's agent user, its Python and git.
func TestRealImage(t *testing.T) {
	d := newDriver(t)
	for _, tool := range []string{"debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("building the base image needs %s (scripts/test.sh installs it)", tool)
		}
	}
	img := buildImage(t, "base")
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "real-base", RootFS: img.Rootfs(), UID: 1000, GID: 1000, Memory: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Destroy(ctx)
	out, st := vmmtest.Sh(t, m, "id -un; python3 -c 'print(6*7)'; git --version | cut -d' ' -f1-2; touch /usr/bin/x 2>/dev/null || echo no-write")
	if st.Code != 0 || out != "agent\n42\ngit version\nno-write\n" {
		t.Errorf("in the base image: %q (exit %d)", out, st.Code)
	}
	if _, err := os.Stat(filepath.Join(img.Rootfs(), "usr/bin/x")); err == nil {
		t.Errorf("a write in the machine changed the image")
	}
}
