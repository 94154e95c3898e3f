package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// A checkpoint is a copy of the machine's writable disk:
// checkpoints/<name>.ext4 in its directory.

var _ vmm.Checkpointer = (*machine)(nil)

func (m *machine) checkpointPath(name string) string {
	return filepath.Join(m.dir, "checkpoints", name+".ext4")
}

// Checkpoint saves the writable disk as name: the guest flushes its
// writes, then the VM is paused while the disk is copied (sparse, or a
// reflink where the filesystem can).
func (m *machine) Checkpoint(ctx context.Context, name string) error {
	if err := vmm.CheckName("checkpoint", name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dst := m.checkpointPath(name)
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("checkpoint %s of machine %s: %w", name, m.id, vmm.ErrExists)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	// What the guest has not written to its disk yet is not in the copy.
	if st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"sync"}}, nil, nil, nil); err != nil || st.Code != 0 {
		return fmt.Errorf("checkpoint %s of machine %s: sync in the guest: %v (exit %d %s)", name, m.id, err, st.Code, st.Error)
	}
	if err := m.Pause(ctx); err != nil {
		return err
	}
	err := copyDisk(ctx, m.path("rw.ext4"), dst)
	if rerr := m.Resume(ctx); err == nil {
		err = rerr
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("checkpoint %s of machine %s: %w", name, m.id, err)
	}
	m.d.record(m.id, "checkpoint", name)
	return nil
}

// copyDisk copies a disk file through a temporary name, keeping it sparse.
func copyDisk(ctx context.Context, src, dst string) error {
	tmp := dst + ".tmp"
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, dst)
}

// Restore boots the machine again from checkpoint name's disk: every
// process in it ends, /tmp is empty, and Guest returns a new client.
func (m *machine) Restore(ctx context.Context, name string) error {
	if err := vmm.CheckName("checkpoint", name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	src := m.checkpointPath(name)
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("restore machine %s: checkpoint %s: %w", m.id, name, vmm.ErrNotFound)
	}
	disk, err := m.rootDisk()
	if err != nil {
		return fmt.Errorf("restore machine %s: %w", m.id, err)
	}
	m.restarting.Store(true)
	defer m.restarting.Store(false)
	if gc := m.gc.Load(); gc != nil {
		gc.Close()
	}
	m.kill()
	if err := copyDisk(ctx, src, m.path("rw.ext4")); err != nil {
		return fmt.Errorf("restore machine %s: %w", m.id, err)
	}
	if err := m.boot(ctx, m.accel, disk); err != nil {
		m.kill()
		m.doneOnce.Do(func() { close(m.done) })
		return fmt.Errorf("restore machine %s: boot: %w", m.id, err)
	}
	m.d.record(m.id, "restore", name)
	return nil
}

// Checkpoints lists the saved checkpoints, oldest first.
func (m *machine) Checkpoints(ctx context.Context) ([]vmm.Checkpoint, error) {
	ents, err := os.ReadDir(filepath.Join(m.dir, "checkpoints"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var cps []vmm.Checkpoint
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".ext4")
		if !ok || vmm.CheckName("checkpoint", name) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		cps = append(cps, vmm.Checkpoint{Name: name, Taken: fi.ModTime(), Size: vmm.DiskUsage(m.checkpointPath(name))})
	}
	sort.Slice(cps, func(i, j int) bool { return cps[i].Taken.Before(cps[j].Taken) })
	return cps, nil
}

// DeleteCheckpoint removes checkpoint name.
func (m *machine) DeleteCheckpoint(ctx context.Context, name string) error {
	if err := vmm.RemoveCheckpoint(m.id, name, m.checkpointPath(name)); err != nil {
		return err
	}
	m.d.record(m.id, "checkpoint-delete", name)
	return nil
}
