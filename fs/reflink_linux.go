package fs

import (
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// probeReflink reports whether files in dir can be cloned with FICLONE.
func probeReflink(dir string) bool {
	a, err := os.CreateTemp(dir, ".probe-")
	if err != nil {
		return false
	}
	defer os.Remove(a.Name())
	defer a.Close()
	a.WriteString("x")
	b, err := os.Create(filepath.Join(dir, ".probe-clone"))
	if err != nil {
		return false
	}
	defer os.Remove(b.Name())
	defer b.Close()
	return unix.IoctlFileClone(int(b.Fd()), int(a.Fd())) == nil
}

// copyBlob makes dst a copy of src: a clone sharing extents where the
// filesystem supports it, else a full copy (copy_file_range under io.Copy).
func copyBlob(dst, src *os.File, reflink bool) error {
	if reflink && unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil {
		return nil
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err := io.Copy(dst, src)
	return err
}
