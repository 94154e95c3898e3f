package qemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// packedRoot is the ext4 file a machine made from a bare root directory
// boots from, in its directory.
const packedRoot = "root.ext4"

var _ vmm.Exporter = (*machine)(nil)

// rootDisk is the ext4 file the machine boots from.
func (m *machine) rootDisk() (string, error) {
	if _, err := os.Stat(m.path(packedRoot)); err == nil {
		return m.path(packedRoot), nil
	}
	disk, err := rootDisk(m.spec.RootFS)
	if err == nil && disk == "" {
		err = fmt.Errorf("root filesystem %s: no ext4 file beside it and none packed", m.spec.RootFS)
	}
	return disk, err
}

// packRoot makes an ext4 file of the directory root, with room to spare.
func packRoot(ctx context.Context, root, disk string) error {
	var size, files int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		files++
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				size += st.Blocks * 512
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pack root filesystem %s: %w", root, err)
	}
	mib := size*5/4>>20 + 64
	inodes := max(files*2, 16384)
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-N", fmt.Sprint(inodes), "-d", root, disk, fmt.Sprintf("%dM", mib)).CombinedOutput()
	if err != nil {
		os.Remove(disk)
		return fmt.Errorf("pack root filesystem %s: mkfs.ext4: %w: %s", root, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// exportScript mounts the root disk and a copy of the writable disk in
// the private mount namespace it runs in (so nothing is left mounted if
// it dies), lays the writable layer over the root read-only, and copies
// the result to dst.
const exportScript = `set -e
root=$1 rw=$2 dst=$3 work=$4
mkdir -p "$work/root" "$work/rw" "$work/merged"
mount -o loop,ro "$root" "$work/root"
mount -o loop,ro "$rw" "$work/rw"
mount -t overlay overlay -o "ro,lowerdir=$work/rw/upper:$work/root" "$work/merged"
mkdir "$dst"
cp -a "$work/merged/." "$dst/"
rmdir "$dst/lost+found" 2>/dev/null || true
`

// Export writes the machine's root as it is now (the image with the
// writable layer over it) to dst, a new directory: the guest flushes its
// writes, the VM is paused while its writable disk is copied, then the
// copy's journal is replayed and both disks are mounted read-only on the
// host, overlaid and copied.
func (m *machine) Export(ctx context.Context, dst string) error {
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("export machine %s: %s: %w", m.id, dst, vmm.ErrExists)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	root, err := m.rootDisk()
	if err != nil {
		return fmt.Errorf("export machine %s: %w", m.id, err)
	}
	work, err := os.MkdirTemp(m.dir, "export-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	rw := filepath.Join(work, "rw.ext4")
	if st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"sync"}}, nil, nil, nil); err != nil || st.Code != 0 {
		return fmt.Errorf("export machine %s: sync in the guest: %v (exit %d %s)", m.id, err, st.Code, st.Error)
	}
	if err := m.Pause(ctx); err != nil {
		return err
	}
	err = copyDisk(ctx, m.path("rw.ext4"), rw)
	if rerr := m.Resume(ctx); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("export machine %s: %w", m.id, err)
	}
	// The copy was taken from a mounted filesystem: what is only in its
	// journal is put in place before a read-only mount can see it.
	if out, err := exec.CommandContext(ctx, "e2fsck", "-y", "-E", "journal_only", rw).CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			return fmt.Errorf("export machine %s: e2fsck: %w: %s", m.id, err, strings.TrimSpace(string(out)))
		}
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", exportScript, "sh", root, rw, dst, work)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("export machine %s: %w: %s", m.id, err, strings.TrimSpace(string(out)))
	}
	m.d.record(m.id, "export", dst)
	return nil
}
