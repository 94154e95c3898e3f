package chv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// SnapshotMode says what a checkpoint holds.
type SnapshotMode string

const (
	// SnapshotMemory: the VM's memory and device state (vm.snapshot)
	// and its writable disk. A restore goes on where the VM was.
	SnapshotMemory SnapshotMode = "memory"
	// SnapshotDisk: only the writable disk, taken after the guest
	// flushed it (if it was running; a paused guest's disk is saved as
	// it stands). A restore boots the VM again from it, as after a
	// clean stop.
	SnapshotDisk SnapshotMode = "disk"
)

// Snapshot is one checkpoint of a machine and how it was taken.
type Snapshot struct {
	Name  string       `json:"name"`
	Taken time.Time    `json:"taken"`
	Mode  SnapshotMode `json:"mode"`
	// Reason says why a disk checkpoint is not a memory one.
	Reason string `json:"reason,omitempty"`
	// WorkspaceDetached: the virtio-fs workspace was unplugged for the
	// memory snapshot (Cloud Hypervisor cannot snapshot virtio-fs:
	// upstream issues #4994, #6931) and plugged in again after.
	WorkspaceDetached bool `json:"workspace_detached,omitempty"`
	// WorkspaceRemounted: the guest mounted the workspace plugged in
	// again, so the machine's /workspace works as before. When the
	// workspace was detached and this is false, WorkspaceError says why:
	// the checkpoint is saved, but the machine runs on without its
	// workspace until it is restored or remounted.
	WorkspaceRemounted bool   `json:"workspace_remounted,omitempty"`
	WorkspaceError     string `json:"workspace_error,omitempty"`
}

// Snapshotter is a machine of this tier: a checkpoint that says what it
// holds.
type Snapshotter interface {
	// TakeSnapshot is Checkpoint, and reports how it was taken.
	TakeSnapshot(ctx context.Context, name string) (Snapshot, error)
	// Snapshots lists the checkpoints with how each was taken, oldest
	// first.
	Snapshots(ctx context.Context) ([]Snapshot, error)
}

var _ Snapshotter = (*machine)(nil)

const metaFile = "snapshot.json"

func (m *machine) checkpointDir(name string) string {
	return filepath.Join(m.dir, "checkpoints", name)
}

// Checkpoint saves the machine: memory and disk when it can, else the
// disk only (see TakeSnapshot).
func (m *machine) Checkpoint(ctx context.Context, name string) error {
	_, err := m.TakeSnapshot(ctx, name)
	return err
}

// TakeSnapshot pauses the VM and saves its memory (vm.snapshot) and its
// writable disk. A VM with the workspace attached has it unplugged first
// and plugged in again after, since Cloud Hypervisor cannot snapshot
// virtio-fs; where that cannot be done (a paused guest cannot eject a
// device), or the snapshot fails, the checkpoint is the disk alone, and
// the result says so and why. The machine ends as it was, running or
// paused.
func (m *machine) TakeSnapshot(ctx context.Context, name string) (Snapshot, error) {
	if err := vmm.CheckName("checkpoint", name); err != nil {
		return Snapshot{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dst := m.checkpointDir(name)
	if _, err := os.Lstat(dst); err == nil {
		return Snapshot{}, fmt.Errorf("checkpoint %s of machine %s: %w", name, m.id, vmm.ErrExists)
	}
	start := time.Now()
	snap, err := m.snapshot(ctx, name, dst)
	if err != nil {
		return Snapshot{}, fmt.Errorf("checkpoint machine %s: %w", m.id, err)
	}
	detail := fmt.Sprintf("%s: memory snapshot in %v", name, time.Since(start).Round(time.Millisecond))
	if snap.WorkspaceDetached {
		detail += " (workspace detached and attached again" + remountDetail(snap.WorkspaceError) + ")"
	}
	if snap.Mode == SnapshotDisk {
		detail = fmt.Sprintf("%s: disk only in %v, %s", name, time.Since(start).Round(time.Millisecond), snap.Reason)
	}
	m.d.record(m.id, "checkpoint", detail)
	return snap, nil
}

func (m *machine) snapshot(ctx context.Context, name, dst string) (Snapshot, error) {
	state, err := m.vmState(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	wasPaused := state == "Paused"
	tmp := dst + ".partial"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(filepath.Join(tmp, "vm"), 0o700); err != nil {
		return Snapshot{}, err
	}
	defer os.RemoveAll(tmp)
	snap := Snapshot{Name: name, Mode: SnapshotMemory}
	var reason string
	if m.spec.Workspace != "" {
		if wasPaused {
			reason = "the machine is paused, and a paused guest cannot eject its workspace (virtio-fs cannot be snapshotted)"
		} else if err := m.detachFs(ctx); err != nil {
			reason = "the workspace could not be detached for a memory snapshot: " + err.Error()
		} else {
			snap.WorkspaceDetached = true
		}
	}
	if reason != "" && !wasPaused {
		m.syncGuest(ctx)
	}
	if !wasPaused {
		if err := m.api.put(ctx, "vm.pause"); err != nil {
			return Snapshot{}, m.undo(ctx, snap, false, err)
		}
	}
	if reason == "" {
		if err := m.api.snapshot(ctx, filepath.Join(tmp, "vm")); err != nil {
			reason = err.Error()
			if !wasPaused {
				// The disk is to be kept as after a clean stop: let
				// the guest flush it first.
				m.api.put(ctx, "vm.resume")
				m.syncGuest(ctx)
				m.api.put(ctx, "vm.pause")
			}
		}
	}
	if reason != "" {
		snap.Mode, snap.Reason = SnapshotDisk, reason
		os.RemoveAll(filepath.Join(tmp, "vm"))
	}
	err = copySparse(ctx, m.path(rwDisk), filepath.Join(tmp, rwDisk))
	if err != nil {
		return Snapshot{}, m.undo(ctx, snap, !wasPaused, err)
	}
	if err := m.undo(ctx, snap, !wasPaused, nil); err != nil {
		return Snapshot{}, err
	}
	if snap.WorkspaceDetached {
		if err := m.remountWorkspace(ctx); err != nil {
			snap.WorkspaceError = err.Error()
		} else {
			snap.WorkspaceRemounted = true
		}
	}
	snap.Taken = time.Now().UTC()
	b, _ := json.Marshal(snap)
	if err := os.WriteFile(filepath.Join(tmp, metaFile), b, 0o600); err != nil {
		return Snapshot{}, err
	}
	os.MkdirAll(filepath.Dir(dst), 0o700)
	return snap, os.Rename(tmp, dst)
}

// undo puts the machine back as it was before a snapshot: running again
// if resume, with its workspace plugged in again if it was unplugged. It
// returns err joined with what failed.
func (m *machine) undo(ctx context.Context, snap Snapshot, resume bool, err error) error {
	if resume {
		if rerr := m.api.put(ctx, "vm.resume"); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	if snap.WorkspaceDetached {
		rerr := m.reattachFs(ctx)
		if rerr == nil && err != nil {
			// The checkpoint failed; the machine should still get
			// its workspace back (on success, the caller remounts
			// and records how it went).
			rerr = m.remountWorkspace(ctx)
		}
		err = errors.Join(err, rerr)
	}
	return err
}

// syncGuest asks the guest to write its dirty pages to its disks.
func (m *machine) syncGuest(ctx context.Context) {
	gc := m.Guest()
	if gc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	gc.Exec(ctx, guest.ExecRequest{Argv: []string{"sync"}}, nil, nil, nil)
}

// ejectTimeout bounds how long the guest may take to give up a device.
const ejectTimeout = 10 * time.Second

// detachFs unplugs the workspace and waits until the guest has ejected
// it: vm.remove-device takes it out of the config at once, but the
// device leaves the VM (its device tree) only when the guest says so.
func (m *machine) detachFs(ctx context.Context) error {
	if err := m.api.removeDevice(ctx, workspaceID); err != nil {
		return err
	}
	if err := m.waitEjected(ctx); err != nil {
		return err
	}
	m.stopVirtiofsd() // it ends with its connection; make sure
	return nil
}

func (m *machine) waitEjected(ctx context.Context) error {
	deadline := time.Now().Add(ejectTimeout)
	for {
		info, err := m.api.info(ctx)
		if err != nil {
			return err
		}
		if info.DeviceTree == nil {
			return nil
		}
		if _, ok := (*info.DeviceTree)[workspaceID]; !ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the guest did not eject device %s within %v", workspaceID, ejectTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reattachFs plugs the workspace in again once the old device is gone.
func (m *machine) reattachFs(ctx context.Context) error {
	if err := m.waitEjected(ctx); err != nil {
		return fmt.Errorf("attach the workspace again: %w", err)
	}
	if err := m.attachFs(ctx); err != nil {
		return fmt.Errorf("attach the workspace again: %w", err)
	}
	return nil
}

// remountTimeout bounds how long the guest may take to mount a workspace
// plugged in again: its kernel probes the new device on its own time.
const remountTimeout = 15 * time.Second

// remountWorkspace has the guest mount the workspace again once the
// device plugged in again is there: the guest's mount of the old device
// died with it, and the guest's agent cannot tell when the new one has
// come (package vmm/guest, Client.RemountWorkspace). A guest that has not
// probed the new device yet fails; that is tried again for a while.
func (m *machine) remountWorkspace(ctx context.Context) error {
	if err := m.waitPlugged(ctx); err != nil {
		return err
	}
	gc := m.Guest()
	if gc == nil {
		return errors.New("mount the workspace again in the guest: no connection to its agent")
	}
	remount := m.remount
	if remount == nil {
		remount = (*guest.Client).RemountWorkspace
	}
	deadline := time.Now().Add(remountTimeout)
	for {
		err := remount(gc, ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, guest.ErrNotSupported) || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("mount the workspace again in the guest: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitPlugged waits until the workspace's device is in the VM.
func (m *machine) waitPlugged(ctx context.Context) error {
	deadline := time.Now().Add(ejectTimeout)
	for {
		info, err := m.api.info(ctx)
		if err != nil {
			return err
		}
		if info.DeviceTree != nil {
			if _, ok := (*info.DeviceTree)[workspaceID]; ok {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("device %s did not appear in the VM within %v of being plugged in", workspaceID, ejectTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// remountDetail says, for an audit event, whether the workspace came back.
func remountDetail(err string) string {
	if err != "" {
		return "; NOT mounted again in the guest, which runs on without it: " + err
	}
	return "; mounted again in the guest"
}

// copySparse copies a disk image, keeping its holes (or sharing its
// blocks where the filesystem can).
func copySparse(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %v: %s", src, err, bytes.TrimSpace(out))
	}
	return nil
}

// Restore puts checkpoint name back: the VMM and the agent start again,
// from the memory snapshot (the workspace is plugged in again after) or,
// for a disk checkpoint, by booting from the saved disk.
func (m *machine) Restore(ctx context.Context, name string) error {
	if err := vmm.CheckName("checkpoint", name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	src := m.checkpointDir(name)
	snap, err := readSnapshot(src)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("restore machine %s: checkpoint %s: %w", m.id, name, vmm.ErrNotFound)
		}
		return fmt.Errorf("restore machine %s: %w", m.id, err)
	}
	m.restarting.Store(true)
	defer m.restarting.Store(false)
	err = m.stopVMM(ctx)
	m.stopVirtiofsd()
	if err == nil {
		os.Remove(m.path(rwDisk))
		err = copySparse(ctx, filepath.Join(src, rwDisk), m.path(rwDisk))
	}
	if err == nil {
		from := ""
		if snap.Mode == SnapshotMemory {
			from = filepath.Join(src, "vm")
		}
		err = m.boot(ctx, from)
	}
	if err != nil {
		// The machine cannot run as it was: it has stopped.
		m.d.record(m.id, "exit", "restore failed: "+err.Error())
		m.doneOnce.Do(func() { close(m.done) })
		return fmt.Errorf("restore machine %s to %s: %w", m.id, name, err)
	}
	detail := fmt.Sprintf("%s (%s); cloud-hypervisor pid %d", name, snap.Mode, m.proc().pid)
	if snap.Mode == SnapshotMemory && m.spec.Workspace != "" {
		// The guest's mount of the workspace died when it was unplugged
		// for the snapshot; boot plugged a new one in.
		werr := ""
		if err := m.remountWorkspace(ctx); err != nil {
			werr = err.Error()
		}
		detail += "; workspace attached again" + remountDetail(werr)
	}
	m.d.record(m.id, "restore", detail)
	return nil
}

func readSnapshot(dir string) (Snapshot, error) {
	var s Snapshot
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", filepath.Join(dir, metaFile), err)
	}
	return s, nil
}

// Snapshots lists the machine's checkpoints, oldest first.
func (m *machine) Snapshots(ctx context.Context) ([]Snapshot, error) {
	ents, err := os.ReadDir(filepath.Join(m.dir, "checkpoints"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []Snapshot
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".partial") {
			continue
		}
		if s, err := readSnapshot(m.checkpointDir(e.Name())); err == nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Taken.Before(out[j].Taken) })
	return out, nil
}

// Checkpoints lists the machine's checkpoints, oldest first.
func (m *machine) Checkpoints(ctx context.Context) ([]vmm.Checkpoint, error) {
	snaps, err := m.Snapshots(ctx)
	var out []vmm.Checkpoint
	for _, s := range snaps {
		out = append(out, vmm.Checkpoint{Name: s.Name, Taken: s.Taken, Size: vmm.DiskUsage(m.checkpointDir(s.Name))})
	}
	return out, err
}

// DeleteCheckpoint removes a checkpoint.
func (m *machine) DeleteCheckpoint(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return vmm.RemoveCheckpoint(m.id, name, m.checkpointDir(name))
}
