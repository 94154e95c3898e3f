// Package atomicfile writes files so that a crash, a full disk or a
// power cut leaves either the old content at the path or the new one,
// never a mix and never an empty file: the content goes to a temporary
// file in the same directory, is synced, renamed over the path, and the
// directory is synced so the rename itself survives.
//
// The daemon's state writers use it: the workspace store's checkpoint
// (fs), sandbox records (appliance), the schedule store (scheduler), the
// chv tier's machine state (vmm/chv), the VM initramfs (image), and
// uploads into a machine (vmm/guest).
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tempPrefix names the temporary files of path's directory: hidden, and
// named after path so that leftovers of a crash say whose they were.
func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// WriteFile writes data to path atomically, with mode perm (not
// subject to the umask).
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return Write(path, perm, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// Write writes path atomically with what fill writes to the temporary
// file it is given, and mode perm (not subject to the umask). fill may
// also change the file's owner. Nothing replaces path unless fill and
// every step after it succeed.
func Write(path string, perm os.FileMode, fill func(*os.File) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	err = fill(tmp)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = SyncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// SyncDir makes the entries of dir (a file created or renamed in it)
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// RemoveTemps removes the temporary files a crash left beside path. Call
// it only where no other write of path can be under way.
func RemoveTemps(path string) error {
	ents, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tempPrefix(path)) {
			if err := os.Remove(filepath.Join(filepath.Dir(path), e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove leftovers of %s: %w", path, errs[0])
	}
	return nil
}
