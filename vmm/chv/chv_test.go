package chv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/vmm"
	"hearth/vmm/chv/api"
	"hearth/vmm/guest"
	"hearth/vmm/vmmtest"
)

// TestAPIErrorNamesTheCall: an error answer becomes an *APIError that
// says which call failed, its status and upstream's reasons.
func TestAPIErrorNamesTheCall(t *testing.T) {
	d, spec := doubleDriver(t)
	m := create(t, d, spec("api-errors"))
	ctx := context.Background()
	for _, tc := range []struct {
		call   string
		status int
		want   string
	}{
		{"vm.boot", 500, "already running"},
		{"vm.resume", 500, "not paused"},
	} {
		err := m.api.put(ctx, tc.call)
		var ae *APIError
		if !errors.As(err, &ae) || ae.Call != tc.call || ae.Status != tc.status {
			t.Errorf("%s = %v, want an APIError for %s with status %d", tc.call, err, tc.call, tc.status)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.call) || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: error %q, want it to name the call and say %q", tc.call, msg, tc.want)
		}
	}
	err := m.api.snapshot(ctx, "/nonexistent-dir")
	if !isStatus(err, 500) || !strings.Contains(err.Error(), "vm.snapshot") {
		t.Errorf("vm.snapshot of a running VM = %v, want a 500 naming vm.snapshot", err)
	}
}

// TestCreateFailsAtBoot: a config the VMM refuses at vm.boot (here, a
// kernel gone since the driver started) fails Create with the call and
// the reason, and leaves nothing behind.
func TestCreateFailsAtBoot(t *testing.T) {
	d, spec := doubleDriver(t)
	os.Remove(d.cfg.Kernel)
	_, err := d.Create(context.Background(), spec("no-kernel"))
	if err == nil || !strings.Contains(err.Error(), "vm.boot") || !strings.Contains(err.Error(), "payload") {
		t.Fatalf("Create with the kernel gone = %v, want a vm.boot error about the payload", err)
	}
	if ids, _ := d.List(context.Background()); len(ids) != 0 {
		t.Errorf("List after a failed Create = %v, want none", ids)
	}
	if _, err := os.Stat(d.machineDir("no-kernel")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("machine directory left after a failed Create: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	d, spec := doubleDriver(t)
	ctx := context.Background()
	dirRoot := t.TempDir()
	for _, tc := range []struct {
		name string
		spec vmm.Spec
		want string
	}{
		{"bad id", func() vmm.Spec { s := spec("x"); s.ID = "Bad/ID"; return s }(), "machine id"},
		{"no root", func() vmm.Spec { s := spec("x"); s.RootFS = ""; return s }(), "no root filesystem"},
		{"missing root", func() vmm.Spec { s := spec("x"); s.RootFS = "/nonexistent/rootfs.ext4"; return s }(), "root filesystem"},
		{"root dir without ext4", func() vmm.Spec { s := spec("x"); s.RootFS = dirRoot; return s }(), "rootfs.ext4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := d.Create(ctx, tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create(%+v) = %v, want an error saying %q", tc.spec, err, tc.want)
			}
		})
	}
	good := d.cfg
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no dir", func(c *Config) { c.Dir = "" }, "Dir"},
		{"no binary", func(c *Config) { c.CloudHypervisor = "/nonexistent/cloud-hypervisor" }, "cloud-hypervisor-static"},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "Kernel"},
		{"missing initramfs", func(c *Config) { c.Initramfs = "/nonexistent/initramfs" }, "Initramfs"},
		{"tiny memory", func(c *Config) { c.Memory = 1 << 20 }, "Memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			if _, err := New(c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(%s) = %v, want an error naming %q", tc.name, err, tc.want)
			}
		})
	}
	t.Run("long state path", func(t *testing.T) {
		c := good
		c.Dir = filepath.Join(shortTemp(t), strings.Repeat("d", 80))
		d2, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		defer d2.Close()
		if _, err := d2.Create(ctx, spec("long-path")); err == nil || !strings.Contains(err.Error(), "shorter state directory") {
			t.Errorf("Create under a long path = %v, want an error asking for a shorter state directory", err)
		}
	})
}

// TestVMConfig checks what the driver asks of the VMM: the disks, the
// kernel command line of the guest contract, shared memory, vsock,
// serial to a file and no console.
func TestVMConfig(t *testing.T) {
	needVirtiofsd(t)
	d, spec := doubleDriver(t)
	s := spec("vm-config")
	s.Workspace = t.TempDir()
	s.UID, s.GID, s.CPUs, s.Hostname = 0, 0, 1.5, "box"
	m := create(t, d, s)
	info, err := m.api.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	cmdline := *c.Payload.Cmdline
	for _, want := range []string{"console=ttyS0", "hearth.root=/dev/vda", "hearth.rw=/dev/vdb", "hearth.fs=workspace", "hearth.replug", "hearth.channel=vsock-listen:1024", "hearth.hostname=box", "hearth.uid=0"} {
		if !strings.Contains(cmdline, want) {
			t.Errorf("cmdline %q lacks %s", cmdline, want)
		}
	}
	if c.Cpus.BootVcpus != 2 || c.Memory.Size != 256<<20 || !*c.Memory.Shared {
		t.Errorf("cpus %+v memory %+v, want 2 vCPUs (1.5 rounded up) and 256 MiB shared", *c.Cpus, *c.Memory)
	}
	disks := *c.Disks
	if len(disks) != 2 || !*disks[0].Readonly || *disks[0].Path != m.st.Root || *disks[1].Path != m.path(rwDisk) {
		t.Errorf("disks = %+v, want the image read-only and the writable disk", disks)
	}
	if c.Console.Mode != "Off" || c.Serial.Mode != "File" || c.Vsock.Socket != m.path(vsockSock) {
		t.Errorf("console %+v serial %+v vsock %+v", c.Console, c.Serial, c.Vsock)
	}
	if c.Fs == nil || len(*c.Fs) != 1 || (*c.Fs)[0].Tag != "workspace" || (*c.Fs)[0].NumQueues != 1 || (*c.Fs)[0].QueueSize != 1024 {
		t.Errorf("fs = %+v, want the workspace", c.Fs)
	}
	if p := m.virtiofsd.Load(); p == nil || !p.alive() {
		t.Errorf("virtiofsd is not running")
	}
	// The writable disk is a real ext4 filesystem.
	b := make([]byte, 2)
	f, _ := os.Open(m.path(rwDisk))
	f.ReadAt(b, 1024+0x38)
	f.Close()
	if !bytes.Equal(b, []byte{0x53, 0xef}) {
		t.Errorf("writable disk has no ext4 superblock magic (%x)", b)
	}
}

func readMeta(t *testing.T, m *machine, name string) api.VmConfig {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.checkpointDir(name), "vm", "config.json"))
	if err != nil {
		t.Fatalf("checkpoint %s: %v", name, err)
	}
	var c api.VmConfig
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func hasWorkspace(t *testing.T, m *machine) bool {
	t.Helper()
	info, err := m.api.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, ok := (*info.DeviceTree)[workspaceID]
	return ok && info.Config.Fs != nil && len(*info.Config.Fs) == 1
}

// TestCheckpointDetachesWorkspace: a memory snapshot of a machine with
// its workspace unplugs it first (the double, like upstream's restore,
// cannot cope with virtio-fs) and plugs a new virtiofsd in after; the
// machine runs on, and a restore brings the VM back from the snapshot.
func TestCheckpointDetachesWorkspace(t *testing.T) {
	needVirtiofsd(t)
	d, spec := doubleDriver(t)
	var events []vmm.Event
	d.OnEvent(func(e vmm.Event) { events = append(events, e) })
	s := spec("ckpt-ws")
	s.Workspace = t.TempDir()
	m := create(t, d, s)
	ctx := context.Background()
	oldFs := m.virtiofsd.Load().pid
	snap, err := m.TakeSnapshot(ctx, "one")
	if err != nil {
		t.Fatalf("TakeSnapshot = %v", err)
	}
	if snap.Mode != SnapshotMemory || !snap.WorkspaceDetached || snap.Reason != "" {
		t.Errorf("TakeSnapshot = %+v, want a memory snapshot with the workspace detached", snap)
	}
	if c := readMeta(t, m, "one"); c.Fs != nil && len(*c.Fs) > 0 {
		t.Errorf("snapshot config has virtio-fs %+v, want none", *c.Fs)
	}
	if !hasWorkspace(t, m) {
		t.Error("workspace not attached again after the snapshot")
	}
	if p := m.virtiofsd.Load(); p == nil || p.pid == oldFs || !p.alive() {
		t.Errorf("virtiofsd after the snapshot: %+v, want a new one running (the old %d ends with its connection)", p, oldFs)
	}
	if st, _ := m.vmState(ctx); st != api.Running {
		t.Errorf("VM is %s after the snapshot, want Running as before", st)
	}
	if out, _ := vmmtest.Sh(t, m, "echo alive"); out != "alive\n" {
		t.Errorf("after the snapshot: %q", out)
	}
	last := events[len(events)-1]
	if last.Kind != "checkpoint" || !strings.Contains(last.Detail, "memory snapshot") || !strings.Contains(last.Detail, "workspace detached") {
		t.Errorf("event %+v, want a checkpoint saying memory snapshot, workspace detached", last)
	}
	if _, err := m.TakeSnapshot(ctx, "one"); !errors.Is(err, vmm.ErrExists) {
		t.Errorf("second TakeSnapshot(one) = %v, want ErrExists", err)
	}
	oldVMM := m.proc().pid
	if err := m.Restore(ctx, "one"); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	if m.proc().pid == oldVMM {
		t.Error("Restore kept the old VMM; upstream restores only into a fresh one")
	}
	if !hasWorkspace(t, m) {
		t.Error("workspace not attached after the restore")
	}
	if out, _ := vmmtest.Sh(t, m, "echo restored"); out != "restored\n" {
		t.Errorf("after Restore: %q", out)
	}
	select {
	case <-m.Done():
		t.Error("Done closed by a Restore")
	default:
	}
	if snaps, err := m.Snapshots(ctx); err != nil || len(snaps) != 1 || snaps[0].Mode != SnapshotMemory {
		t.Errorf("Snapshots = %+v, %v", snaps, err)
	}
}

// TestCheckpointPausedFallsBackToDisk: a paused guest cannot eject its
// workspace, so the checkpoint is the disk alone, and says why; a restore
// boots from the saved disk.
func TestCheckpointPausedFallsBackToDisk(t *testing.T) {
	needVirtiofsd(t)
	d, spec := doubleDriver(t)
	s := spec("ckpt-paused")
	s.Workspace = t.TempDir()
	m := create(t, d, s)
	ctx := context.Background()
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap, err := m.TakeSnapshot(ctx, "cold")
	if err != nil {
		t.Fatalf("TakeSnapshot = %v", err)
	}
	if snap.Mode != SnapshotDisk || !strings.Contains(snap.Reason, "paused") || snap.WorkspaceDetached {
		t.Errorf("TakeSnapshot of a paused machine = %+v, want disk only, saying it is paused", snap)
	}
	if _, err := os.Stat(filepath.Join(m.checkpointDir("cold"), "vm")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a disk checkpoint holds a memory snapshot: %v", err)
	}
	if st, _ := m.vmState(ctx); st != api.Paused || !hasWorkspace(t, m) {
		t.Errorf("after the checkpoint the VM is %s (workspace: %v), want Paused with its workspace as before", st, hasWorkspace(t, m))
	}
	// The saved disk is what comes back.
	saved, _ := os.ReadFile(filepath.Join(m.checkpointDir("cold"), rwDisk))
	f, err := os.OpenFile(m.path(rwDisk), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("scribbled after the checkpoint"), 0)
	f.Close()
	if err := m.Restore(ctx, "cold"); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	now, _ := os.ReadFile(m.path(rwDisk))
	if !bytes.Equal(now, saved) {
		t.Error("after Restore the writable disk is not the checkpoint's")
	}
	if st, _ := m.vmState(ctx); st != api.Running || !hasWorkspace(t, m) {
		t.Errorf("after Restore the VM is %s, want it booted again with its workspace", st)
	}
	if out, _ := vmmtest.Sh(t, m, "echo booted"); out != "booted\n" {
		t.Errorf("after Restore: %q", out)
	}
	if err := m.Restore(ctx, "none"); !errors.Is(err, vmm.ErrNotFound) {
		t.Errorf("Restore(none) = %v, want ErrNotFound", err)
	}
	if err := m.DeleteCheckpoint(ctx, "cold"); err != nil {
		t.Errorf("DeleteCheckpoint = %v", err)
	}
	if err := m.Checkpoint(ctx, "../up"); err == nil {
		t.Error("Checkpoint(../up) = nil, want a bad-name error")
	}
}

// TestGuestPowerOff: when the guest's agent ends, the VMM exits (as
// upstream does on a guest power-off) and Done closes.
func TestGuestPowerOff(t *testing.T) {
	d, spec := doubleDriver(t)
	var events []vmm.Event
	d.OnEvent(func(e vmm.Event) { events = append(events, e) })
	m := create(t, d, spec("power-off"))
	m.Guest().Exec(context.Background(), execKillParent, nil, nil, nil)
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10s after the guest agent ended")
	}
	if last := events[len(events)-1]; last.Kind != "exit" {
		t.Errorf("last event %+v, want exit", last)
	}
	if err := m.Destroy(context.Background()); err != nil {
		t.Errorf("Destroy after power-off = %v", err)
	}
}

// TestGuestOrphans: what the guest orphans stays the guest's, as a VM's
// init adopts it: the double (its subreaper) reaps one that ends, and a
// destroy ends one still running. Without that, a command started in the
// background left the guest, ran on through a pause and outlived the VM.
func TestGuestOrphans(t *testing.T) {
	d, spec := doubleDriver(t)
	m := create(t, d, spec("orphans"))
	// Each prints its pid; the ender ends after the shell that started
	// it, so the double must reap it.
	out, _ := vmmtest.Sh(t, m, `setsid sh -c 'exec sleep 30' </dev/null >/dev/null 2>&1 & echo $!; setsid sh -c 'exec sleep 0.3' </dev/null >/dev/null 2>&1 & echo $!`)
	var sleeper, ender int
	if _, err := fmt.Sscan(out, &sleeper, &ender); err != nil {
		t.Fatalf("starting the orphans: %q", out)
	}
	double := m.st.VMM
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		adopted := parentOf(sleeper) == double
		reaped := syscall.Kill(ender, 0) != nil // a zombie is still there
		if adopted && reaped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s on: the sleeper (pid %d) adopted by the double (pid %d): %v; the ender (pid %d) reaped: %v", sleeper, double, adopted, ender, reaped)
		}
	}
	if err := m.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(sleeper, 0) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphaned sleeper (pid %d) outlived its VM by 10s", sleeper)
		}
	}
}

// parentOf is the parent of process pid, 0 if it is gone.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...
	var state string
	var ppid int
	fmt.Sscan(string(b[bytes.LastIndexByte(b, ')')+1:]), &state, &ppid)
	return ppid
}

// TestRecoverDeadVMM: a machine whose VMM died while the daemon was away
// is cleaned up and reported not found.
func TestRecoverDeadVMM(t *testing.T) {
	d, spec := doubleDriver(t)
	m := create(t, d, spec("dead-vmm"))
	syscall.Kill(m.proc().pid, syscall.SIGKILL)
	<-m.Done()
	if _, err := d.Recover(context.Background(), "dead-vmm"); !errors.Is(err, vmm.ErrNotFound) {
		t.Errorf("Recover(dead) = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(d.machineDir("dead-vmm")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead machine's directory left: %v", err)
	}
}

// execKillParent ends the guest agent from a process it started.
var execKillParent = guest.ExecRequest{Argv: []string{"sh", "-c", "kill -KILL $PPID"}}

// TestRecoverAfterRestart: a new driver over the same directory (a
// daemon that restarted) re-attaches to a machine through its sockets,
// and its Destroy ends the VMM and the virtiofsd the old one started.
func TestRecoverAfterRestart(t *testing.T) {
	needVirtiofsd(t)
	d, spec := doubleDriver(t)
	s := spec("restart")
	s.Workspace = t.TempDir()
	old := create(t, d, s)
	vmmPID, fsPID := old.proc().pid, old.virtiofsd.Load().pid
	old.Guest().Close()
	d2, err := New(d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	m, err := d2.Recover(context.Background(), "restart")
	if err != nil {
		t.Fatalf("Recover = %v", err)
	}
	if out, _ := vmmtest.Sh(t, m, "echo back"); out != "back\n" {
		t.Errorf("after Recover: %q", out)
	}
	if err := m.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	<-old.Done() // the old driver's view of the same VMM
	for what, pid := range map[string]int{"cloud-hypervisor": vmmPID, "virtiofsd": fsPID} {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil {
			t.Errorf("%s pid %d still runs after Destroy", what, pid)
		}
	}
	// A directory left with nothing started is cleaned up.
	os.MkdirAll(d2.machineDir("half-made"), 0o700)
	if _, err := d2.Recover(context.Background(), "half-made"); !errors.Is(err, vmm.ErrNotFound) {
		t.Errorf("Recover(half-made) = %v, want ErrNotFound", err)
	}
	if ids, _ := d2.List(context.Background()); len(ids) != 0 {
		t.Errorf("List = %v, want nothing left", ids)
	}
}
