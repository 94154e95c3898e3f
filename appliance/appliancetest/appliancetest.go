// Package appliancetest has what tests of the appliance and of the CLI
// share: a guest agent built for the test binary and a small image. Only
// tests import it.
package appliancetest

import (
	"context"
	"io"
	"os/exec"
	"testing"

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
