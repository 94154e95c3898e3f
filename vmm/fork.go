package vmm

import (
	"context"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Forker is a machine whose writable layer can be copied as it is now,
// for new machines of the same driver to start from (Spec.Layer). Only
// files are carried over: the new machines start their own processes.
type Forker interface {
	// CaptureLayer copies the writable layer to dst, which must not
	// exist, pausing the machine only while it copies (a paused machine
	// stays paused). It reports whether the copy shares the layer's
	// extents (reflinks) instead of duplicating its bytes. On error dst
	// is removed.
	CaptureLayer(ctx context.Context, dst string) (reflinked bool, err error)
}

// CanReflink reports whether files in dir can be cloned with FICLONE
// (btrfs, xfs), so that copies there share extents.
func CanReflink(dir string) bool {
	a, err := os.CreateTemp(dir, ".reflink-probe-")
	if err != nil {
		return false
	}
	defer os.Remove(a.Name())
	defer a.Close()
	if _, err := a.WriteString("x"); err != nil {
		return false
	}
	b, err := os.CreateTemp(filepath.Dir(a.Name()), ".reflink-probe-")
	if err != nil {
		return false
	}
	defer os.Remove(b.Name())
	defer b.Close()
	return unix.IoctlFileClone(int(b.Fd()), int(a.Fd())) == nil
}
