package qemu

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// Forking a VM: its writable disk is copied (a reflink where the
// filesystem has them, else sparse) while the VM is paused, after the
// guest has flushed its writes; new machines boot with a copy of that
// disk. Processes and memory are not carried over: each fork boots.

var _ vmm.Forker = (*machine)(nil)

// CaptureLayer copies the writable disk to dst. A running VM is paused
// only while it copies. A paused one runs for the moment its guest
// flushes its writes (which its page cache may still hold), then stays
// paused.
func (m *machine) CaptureLayer(ctx context.Context, dst string) (reflinked bool, err error) {
	if _, err := os.Lstat(dst); err == nil {
		return false, fmt.Errorf("capture layer of machine %s to %s: %w", m.id, dst, fs.ErrExist)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	start := time.Now()
	paused, err := m.isPaused(ctx)
	if err != nil {
		return false, fmt.Errorf("capture layer of machine %s: %w", m.id, err)
	}
	if paused {
		if err := m.Resume(ctx); err != nil {
			return false, err
		}
	}
	err = m.guestSync(ctx)
	if perr := m.Pause(ctx); err == nil {
		err = perr
	}
	if err == nil {
		err = copyDisk(ctx, m.path("rw.ext4"), dst)
	}
	if !paused {
		if rerr := m.Resume(ctx); err == nil {
			err = rerr
		}
	}
	if err != nil {
		os.Remove(dst)
		return false, fmt.Errorf("capture layer of machine %s: %w", m.id, err)
	}
	reflinked = vmm.CanReflink(filepath.Dir(dst)) && sameDevice(m.dir, filepath.Dir(dst))
	m.d.record(m.id, "capture", fmt.Sprintf("%s in %v (reflinked %t)", dst, time.Since(start).Round(time.Millisecond), reflinked))
	return reflinked, nil
}

func (m *machine) isPaused(ctx context.Context) (bool, error) {
	var st string
	err := m.qmpDo(ctx, func(q *qmp) (err error) {
		st, err = q.status(ctx)
		return err
	})
	return st == "paused", err
}

// guestSync makes the guest write what it holds of its disk.
func (m *machine) guestSync(ctx context.Context) error {
	gc := m.Guest()
	if gc == nil {
		return fmt.Errorf("sync in the guest: agent not connected")
	}
	st, err := gc.Exec(ctx, guest.ExecRequest{Argv: []string{"sync"}}, nil, nil, nil)
	if err != nil || st.Code != 0 {
		return fmt.Errorf("sync in the guest: %v (exit %d %s)", err, st.Code, st.Error)
	}
	return nil
}

// writableDisk makes a machine's writable disk: a fresh ext4 of size
// bytes, or a copy of the captured disk spec.Layer, which must be that
// size.
func writableDisk(ctx context.Context, spec vmm.Spec, path string, size int64) error {
	if spec.Layer == "" {
		return makeDisk(ctx, path, size)
	}
	st, err := os.Stat(spec.Layer)
	if err != nil {
		return fmt.Errorf("captured layer: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() != size {
		return fmt.Errorf("captured layer %s is not a %d-byte disk: a fork must have its source's disk limit", spec.Layer, size)
	}
	os.Remove(path)
	if spec.TakeLayer && os.Rename(spec.Layer, path) == nil {
		return nil
	}
	return copyDisk(ctx, spec.Layer, path)
}

func sameDevice(a, b string) bool {
	var sa, sb syscall.Stat_t
	return syscall.Stat(a, &sa) == nil && syscall.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}
