// Package qemu is the VM tier that runs on any x86-64 Linux host with
// QEMU: each machine is a qemu-system-x86_64 microvm booting the kernel
// and initramfs made by package image, with the image's ext4 root as a
// read-only disk under an overlay whose writable layer is a disk of its
// own, the session's workspace view shared through virtiofsd (virtio-fs),
// and the guest agent reached over a virtio-serial port. It uses KVM when
// KVM can boot the kernel and QEMU's software emulation (TCG) only when
// the configuration allows it.
//
// Limits: Spec.Memory is the VM's memory (default 512 MiB), Spec.CPUs its
// virtual CPUs (rounded up), Spec.Disk the size of its writable disk;
// Spec.Pids is not enforced (the guest's own kernel bounds its processes).
// Machine ids are host ids: a VM needs no id mapping (HostIDOffset 0).
//
// Each machine's directory (machines/<id>) holds spec.json, the writable
// disk rw.ext4 (root.ext4 too when its root was a bare directory),
// checkpoints/ (copies of rw.ext4), share/ (what virtiofsd exports: a
// mount point with the workspace view mounted at share/agents), QEMU's
// QMP and agent sockets and pid file, virtiofsd's socket and pid file,
// and the logs (serial.log is the
// guest's console). QEMU and virtiofsd run in sessions of their own, so
// machines outlive a daemon that stops; Recover finds them again.
//
// With Config.Warm, machines are booted ahead of time in spares/<id>/
// for the shapes last created, paused, and Create takes one instead of
// booting (see warm.go): under TCG here 0.17 s instead of 2.5 s.
//
// Machines checkpoint, restore (a reboot from the saved disk) and export
// their root. Their workspace view can be replaced while they run
// (vmm.WorkspaceAttacher), although QEMU 7.2's vhost-user-fs device
// neither reconnects to a new virtiofsd nor hot-plugs on a microvm:
// virtiofsd exports share/, a directory of the machine's own with the
// view mounted at share/agents, and the guest reaches the view through a
// symlink (see package vmm/share), so a new view mounted there
// on the host reaches the running guest.
//
// Only the appliance imports it.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	"hearth/vmm"
	"hearth/vmm/share"
)

// Config says where the driver finds what it runs and keeps its state.
type Config struct {
	// Dir holds the driver's state: one directory per machine
	// (machines/<id>) and the audit log. Required.
	Dir string
	// Kernel is an ELF vmlinux with a PVH entry and Initramfs the
	// initramfs whose /init is hearth-guest (both from image.Builder.Boot).
	// Required.
	Kernel, Initramfs string
	// QEMU is the qemu-system-x86_64 binary; default found on PATH.
	QEMU string
	// Virtiofsd serves workspaces; default /usr/lib/qemu/virtiofsd.
	Virtiofsd string
	// AllowTCG lets machines run under QEMU's software emulation when KVM
	// is missing or cannot boot the kernel. It is many times slower.
	AllowTCG bool
	// NoKVM skips KVM even when /dev/kvm is there (with AllowTCG).
	NoKVM bool
	// DiskSize is the writable disk of a machine whose spec sets no Disk;
	// default 2 GiB (a sparse file: it takes what is written).
	DiskSize int64
	// BootTimeout bounds the wait for a new machine's agent; default 60s.
	BootTimeout time.Duration
	// Warm is how many machines to keep booted ahead of time for each of
	// the last few shapes (image, memory, CPUs, disk, workspace or not)
	// machines were created with, so that Create takes one instead of
	// booting (see warm.go). Each waits paused, holding the memory its
	// guest touched while booting (about 110 MiB) and, under TCG,
	// QEMU's translated code (about 130 MiB more). 0: none.
	Warm int
}

func (c *Config) setDefaults() {
	if c.QEMU == "" {
		c.QEMU = "qemu-system-x86_64"
	}
	if c.Virtiofsd == "" {
		c.Virtiofsd = "/usr/lib/qemu/virtiofsd"
	}
	if c.DiskSize == 0 {
		c.DiskSize = 2 << 30
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = 60 * time.Second
	}
}

// Driver makes QEMU machines.
type Driver struct {
	cfg Config
	// kvmBroken is set once KVM failed to boot the kernel (as a nested,
	// paravirtual KVM does), so later machines go straight to TCG.
	kvmBroken atomic.Bool

	audit *vmm.AuditLog // <dir>/audit.jsonl: every lifecycle step, appended
	warm  *sparePool    // nil: no warm machines
}

var (
	_ vmm.Driver             = (*Driver)(nil)
	_ vmm.WorkspaceRecoverer = (*Driver)(nil)
)

// New checks cfg and returns a driver. It fails if a required path is
// missing, or if neither KVM nor (allowed) TCG is available.
func New(cfg Config) (*Driver, error) {
	cfg.setDefaults()
	if cfg.Dir == "" {
		return nil, errors.New("qemu driver: no state directory (Config.Dir) given")
	}
	for _, f := range []struct{ what, path string }{{"kernel", cfg.Kernel}, {"initramfs", cfg.Initramfs}} {
		if f.path == "" {
			return nil, fmt.Errorf("qemu driver: no %s given: make one with image.Builder.Boot", f.what)
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("qemu driver: %s: %w (make it with image.Builder.Boot)", f.what, err)
		}
	}
	qemu, err := exec.LookPath(cfg.QEMU)
	if err != nil {
		return nil, fmt.Errorf("qemu driver: %w: apt-get install qemu-system-x86", err)
	}
	cfg.QEMU = qemu
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("qemu driver: %w: it makes machines' writable disks (apt-get install e2fsprogs)", err)
	}
	if kerr := kvmUsable(); (kerr != nil || cfg.NoKVM) && !cfg.AllowTCG {
		if kerr == nil {
			kerr = errors.New("KVM is turned off (NoKVM)")
		}
		return nil, fmt.Errorf("qemu driver: %v, and software emulation is not allowed: set AllowTCG to run machines under TCG (slow)", kerr)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	if err := os.MkdirAll(filepath.Join(dir, "machines"), 0o700); err != nil {
		return nil, fmt.Errorf("qemu driver: %w", err)
	}
	audit, err := vmm.OpenAuditLog(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("qemu driver: %w", err)
	}
	d := &Driver{cfg: cfg, audit: audit}
	if cfg.Warm > 0 {
		d.warm = newWarmPool(d)
	}
	return d, nil
}

func (d *Driver) Name() string { return "qemu" }

func (d *Driver) Capabilities() vmm.Capabilities {
	return vmm.Capabilities{}
}

// OnEvent sets a function told of every lifecycle event (after it is in
// the audit log). Set it before creating machines.
func (d *Driver) OnEvent(fn func(vmm.Event)) { d.audit.OnEvent(fn) }

func (d *Driver) record(id, kind, detail string) { d.audit.Record(id, kind, detail) }

// Close shuts down the warm machines and closes the audit log. Machines
// keep running; a new Driver over the same directory recovers them.
func (d *Driver) Close() error {
	if d.warm != nil {
		d.warm.Close()
	}
	return d.audit.Close()
}

func (d *Driver) machineDir(id string) string { return filepath.Join(d.cfg.Dir, "machines", id) }

// Create boots a machine and returns once its agent answers. The spec's
// RootFS is an image's root directory with the image's ext4 file beside
// it (rootfs and rootfs.ext4, as package image lays them out), or the
// ext4 file itself. A directory with no ext4 file beside it (a machine's
// export, say) is packed into one for this machine with mkfs.ext4 -d,
// which takes a while for a big root.
func (d *Driver) Create(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	disk, err := rootDisk(spec.RootFS)
	if err != nil {
		return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
	}
	if spec.Workspace != "" {
		if st, err := os.Stat(spec.Workspace); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("create machine %s: workspace %s is not a directory (%v)", spec.ID, spec.Workspace, err)
		}
		if _, err := os.Stat(d.cfg.Virtiofsd); err != nil {
			return nil, fmt.Errorf("create machine %s: a workspace needs virtiofsd: %w (apt-get install qemu-system-common)", spec.ID, err)
		}
	}
	dir := d.machineDir(spec.ID)
	// QEMU and virtiofsd listen on unix sockets in the machine's
	// directory, whose paths the kernel limits to 107 bytes.
	if sock := filepath.Join(dir, "agent.sock"); len(sock) > 107 {
		return nil, fmt.Errorf("create machine %s: socket path %s is longer than unix sockets allow (107 bytes): give the driver a shorter state directory", spec.ID, sock)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return nil, fmt.Errorf("create machine %s: %w", spec.ID, vmm.ErrExists)
		}
		return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
	}
	d.record(spec.ID, "create", fmt.Sprintf("root=%s workspace=%s memory=%d cpus=%g disk=%d",
		disk, spec.Workspace, spec.Memory, spec.CPUs, spec.Disk))
	if s, ok := d.shapeOf(spec, disk); ok && d.warm != nil && spec.Layer == "" {
		defer d.warm.Used(s)
		m, err := d.claimSpare(ctx, s, spec, dir)
		if err != nil {
			os.RemoveAll(dir)
			d.record(spec.ID, "destroy", "start failed: "+err.Error())
			return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
		}
		if m != nil {
			return m, nil
		}
	}
	if disk == "" {
		disk = filepath.Join(dir, packedRoot)
		if err := packRoot(ctx, spec.RootFS, disk); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
		}
	}
	if spec.Workspace != "" {
		if err := share.Setup(filepath.Join(dir, shareDir), spec.Workspace); err != nil {
			removeMachineDir(dir)
			return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
		}
	}
	start := time.Now()
	m, err := d.start(ctx, spec, dir, disk, spec.Workspace != "", true)
	if err != nil {
		removeMachineDir(dir)
		d.record(spec.ID, "destroy", "start failed: "+err.Error())
		return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
	}
	d.record(spec.ID, "start", fmt.Sprintf("agent answered after %v (accel %s)", time.Since(start).Round(time.Millisecond), m.accel))
	return m, nil
}

// removeMachineDir removes a machine's directory once its workspace view
// is unmounted from its share: never while the view is there.
func removeMachineDir(dir string) error {
	if err := share.Teardown(filepath.Join(dir, shareDir)); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// rootDisk finds the ext4 file of an image root: "" for a directory with
// none beside it, which must be packed.
func rootDisk(rootfs string) (string, error) {
	st, err := os.Stat(rootfs)
	if err != nil {
		return "", fmt.Errorf("root filesystem: %w", err)
	}
	if st.Mode().IsRegular() {
		return rootfs, nil
	}
	if !st.IsDir() {
		return "", fmt.Errorf("root filesystem %s is neither a directory nor an ext4 file", rootfs)
	}
	disk := filepath.Clean(rootfs) + ".ext4"
	if _, err := os.Stat(disk); err != nil {
		return "", nil
	}
	return disk, nil
}

// start boots the machine, with KVM first unless KVM is known not to
// work, then TCG if allowed.
func (d *Driver) start(ctx context.Context, spec vmm.Spec, dir, disk string, shared, claim bool) (*machine, error) {
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "spec.json"), b, 0o600); err != nil {
		return nil, err
	}
	size := spec.Disk
	if size == 0 {
		size = d.cfg.DiskSize
	}
	if err := writableDisk(ctx, spec, filepath.Join(dir, "rw.ext4"), size); err != nil {
		return nil, err
	}
	var accels []string
	if !d.cfg.NoKVM && !d.kvmBroken.Load() && kvmUsable() == nil {
		accels = append(accels, "kvm")
	}
	if d.cfg.AllowTCG {
		accels = append(accels, "tcg")
	}
	if len(accels) == 0 {
		return nil, errors.New("KVM cannot boot the kernel here and software emulation is not allowed: set AllowTCG to run under TCG (slow)")
	}
	var errs []error
	for i, accel := range accels {
		if i > 0 {
			// The failed try may have written to the disk.
			if err := writableDisk(ctx, spec, filepath.Join(dir, "rw.ext4"), size); err != nil {
				return nil, err
			}
		}
		m := newMachine(d, spec, dir)
		m.shared = shared
		start := m.start
		if claim {
			start = m.boot
		}
		err := start(ctx, accel, disk)
		if err == nil {
			return m, nil
		}
		m.destroying.Store(true) // its end is no news for the audit log
		m.kill()
		errs = append(errs, fmt.Errorf("with %s: %w", accel, err))
		if accel != "kvm" || !errors.Is(err, errKVMFailed) {
			break
		}
		d.kvmBroken.Store(true)
		d.record(spec.ID, "start", "KVM cannot boot the kernel, trying TCG: "+err.Error())
	}
	if len(accels) == 1 && accels[0] == "kvm" {
		errs = append(errs, errors.New("set AllowTCG to run under software emulation"))
	}
	return nil, errors.Join(errs...)
}

// makeDisk makes a sparse ext4 file of size bytes for a writable layer.
func makeDisk(ctx context.Context, path string, size int64) error {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("writable disk: %w", err)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-L", "hearth-rw", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("writable disk: mkfs.ext4: %w: %s", err, out)
	}
	return nil
}

// Recover re-attaches to a machine left running by a daemon that stopped,
// through its QMP socket and its agent's channel. A machine whose QEMU is
// gone is cleaned up and reported ErrNotFound.
func (d *Driver) Recover(ctx context.Context, id string) (vmm.Machine, error) {
	if err := vmm.CheckName("machine", id); err != nil {
		return nil, err
	}
	dir := d.machineDir(id)
	b, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		return nil, fmt.Errorf("recover machine %s: %w", id, vmm.ErrNotFound)
	}
	var spec vmm.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("recover machine %s: %s: %w", id, filepath.Join(dir, "spec.json"), err)
	}
	m := newMachine(d, spec, dir)
	if err := m.attach(ctx); err != nil {
		m.Destroy(context.Background())
		if errors.Is(err, vmm.ErrNotFound) {
			d.record(id, "destroy", "found dead after a daemon restart; cleaned up")
		}
		return nil, fmt.Errorf("recover machine %s: %w", id, err)
	}
	d.record(id, "recover", fmt.Sprintf("re-attached to qemu pid %d", m.proc.Load().pid))
	return m, nil
}

// RecoverWithWorkspace is Recover with the view at dir put in the
// machine's share first: attach resumes a paused VM for a moment to reach
// its agent, and it must not reach the dead view meanwhile.
func (d *Driver) RecoverWithWorkspace(ctx context.Context, id, dir string) (vmm.Machine, error) {
	if err := vmm.CheckName("machine", id); err != nil {
		return nil, err
	}
	mdir := d.machineDir(id)
	b, err := os.ReadFile(filepath.Join(mdir, "spec.json"))
	if err != nil {
		return nil, fmt.Errorf("recover machine %s: %w", id, vmm.ErrNotFound)
	}
	var spec vmm.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("recover machine %s: %s: %w", id, filepath.Join(mdir, "spec.json"), err)
	}
	if spec.Workspace == "" {
		return nil, fmt.Errorf("recover machine %s with a workspace: %w", id, vmm.ErrNoWorkspace)
	}
	if err := share.Replace(filepath.Join(mdir, shareDir), dir); err != nil {
		return nil, fmt.Errorf("recover machine %s: %w", id, err)
	}
	spec.Workspace = dir
	if b, err = json.Marshal(spec); err == nil {
		err = os.WriteFile(filepath.Join(mdir, "spec.json"), b, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("recover machine %s: %w", id, err)
	}
	d.record(id, "attach-workspace", dir)
	return d.Recover(ctx, id)
}

// List returns the machines with state on disk.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	return vmm.MachineDirs(filepath.Join(d.cfg.Dir, "machines"))
}
