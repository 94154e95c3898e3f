// Package chv is the Cloud Hypervisor machine tier: each machine is a
// microVM with its own kernel, run by one cloud-hypervisor process driven
// only through its REST API on --api-socket (the client generated in
// vmm/chv/api). The image's ext4 root is the VM's first disk (read-only),
// a writable ext4 disk of the machine's own the second; the session's
// workspace view reaches the guest through a virtiofsd per VM (virtio-fs
// tag "workspace", which needs shared guest memory); the guest agent
// (hearth-guest as PID 1 from the initramfs) listens on vsock port 1024,
// which the host reaches through the VMM's vsock unix socket. The machine
// survives a daemon restart: Recover re-attaches through the API and
// vsock sockets, and AttachWorkspace gives it the new daemon's view
// (virtiofsd exports share/, with the view mounted at share/agents: see
// package vmm/share). Machines export their root (vmm.Exporter) and report
// what their processes use (vmm.UsageReporter). Memory snapshots detach the workspace first, since
// Cloud Hypervisor cannot snapshot virtio-fs (upstream issues #4994,
// #6931), or fall back to a disk-only checkpoint, and say which happened.
// Only the appliance imports it.
package chv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"hearth/vmm"
	"hearth/vmm/share"
)

// Config says where the driver finds what it runs and keeps its state.
type Config struct {
	// Dir holds the driver's state: machines/<id>/ per machine (spec and
	// process ids, the API, vsock and virtiofsd sockets, logs, the
	// writable disk, checkpoints, and share/, the mount point virtiofsd
	// exports with the workspace view at share/agents), and audit.jsonl.
	Dir string
	// CloudHypervisor is the cloud-hypervisor binary; default: the one on
	// PATH.
	CloudHypervisor string
	// Virtiofsd serves a machine's workspace; default
	// /usr/lib/qemu/virtiofsd (Debian's qemu-system-common).
	Virtiofsd string
	// Kernel (an uncompressed vmlinux with a PVH note, or a bzImage) and
	// Initramfs (whose /init is hearth-guest) boot every machine.
	Kernel, Initramfs string
	// Cmdline starts the kernel command line; the driver adds the
	// hearth.* keys. Default: vmm.KernelArgs.
	Cmdline string
	// Memory and Disk are used when a spec sets no limit: default 512 MiB
	// of guest memory and a 2 GiB (sparse) writable disk.
	Memory, Disk int64
}

// DefaultConfig returns the defaults for state under dir.
func DefaultConfig(dir string) Config {
	return Config{
		Dir:             dir,
		CloudHypervisor: "cloud-hypervisor",
		Virtiofsd:       "/usr/lib/qemu/virtiofsd",
		Cmdline:         vmm.KernelArgs,
		Memory:          512 << 20,
		Disk:            2 << 30,
	}
}

// Validate checks the config, naming the key at fault and what to do.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("chv: config Dir: give a state directory")
	}
	if c.CloudHypervisor == "" {
		return errors.New("chv: config CloudHypervisor: give the cloud-hypervisor binary (from its releases, cloud-hypervisor-static)")
	}
	if _, err := exec.LookPath(c.CloudHypervisor); err != nil {
		return fmt.Errorf("chv: config CloudHypervisor: %w (install cloud-hypervisor-static from its releases, or choose another tier)", err)
	}
	for key, path := range map[string]string{"Kernel": c.Kernel, "Initramfs": c.Initramfs} {
		if path == "" {
			return fmt.Errorf("chv: config %s: give the path (package image builds it)", key)
		}
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("chv: config %s: %w", key, err)
		}
	}
	if c.Memory < 64<<20 {
		return fmt.Errorf("chv: config Memory %d: give at least 64 MiB", c.Memory)
	}
	if c.Disk < 16<<20 {
		return fmt.Errorf("chv: config Disk %d: give at least 16 MiB", c.Disk)
	}
	return nil
}

// Driver makes Cloud Hypervisor machines.
type Driver struct {
	cfg Config
	ch  string // the cloud-hypervisor binary, resolved

	audit *vmm.AuditLog // <dir>/audit.jsonl: every lifecycle step, appended
}

var (
	_ vmm.Driver             = (*Driver)(nil)
	_ vmm.WorkspaceRecoverer = (*Driver)(nil)
)

// New returns a driver for cfg.
func New(cfg Config) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ch, err := exec.LookPath(cfg.CloudHypervisor)
	if err == nil {
		ch, err = filepath.Abs(ch)
	}
	if err == nil {
		ch, err = filepath.EvalSymlinks(ch)
	}
	if err != nil {
		return nil, fmt.Errorf("chv: cloud-hypervisor binary: %w", err)
	}
	// Compared with /proc/<pid>/exe to find a recovered machine's
	// virtiofsd.
	if real, err := filepath.EvalSymlinks(cfg.Virtiofsd); err == nil {
		cfg.Virtiofsd = real
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "machines"), 0o700); err != nil {
		return nil, err
	}
	audit, err := vmm.OpenAuditLog(filepath.Join(cfg.Dir, "audit.jsonl"))
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg, ch: ch, audit: audit}, nil
}

func (d *Driver) Name() string { return "chv" }

func (d *Driver) Capabilities() vmm.Capabilities {
	return vmm.Capabilities{}
}

// OnEvent sets a function told of every lifecycle event (after it is in
// the audit log). Set it before creating machines.
func (d *Driver) OnEvent(fn func(vmm.Event)) { d.audit.OnEvent(fn) }

func (d *Driver) record(id, kind, detail string) { d.audit.Record(id, kind, detail) }

// Close closes the audit log. Machines keep running; a new Driver over
// the same directory recovers them.
func (d *Driver) Close() error { return d.audit.Close() }

func (d *Driver) machineDir(id string) string { return filepath.Join(d.cfg.Dir, "machines", id) }

// Create boots a machine and returns once its agent answers.
func (d *Driver) Create(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	root, err := rootDisk(spec.RootFS)
	if err != nil {
		return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
	}
	dir := d.machineDir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return nil, fmt.Errorf("create machine %s: %w", spec.ID, vmm.ErrExists)
		}
		return nil, err
	}
	d.record(spec.ID, "create", fmt.Sprintf("root=%s workspace=%s memory=%d cpus=%g disk=%d",
		root, spec.Workspace, spec.Memory, spec.CPUs, spec.Disk))
	start := time.Now()
	m := newMachine(d, spec, dir, root)
	if err := m.create(ctx); err != nil {
		m.teardown(context.Background())
		d.record(spec.ID, "destroy", "start failed: "+err.Error())
		return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
	}
	d.record(spec.ID, "start", fmt.Sprintf("cloud-hypervisor pid %d; agent answered after %v", m.proc().pid, time.Since(start).Round(time.Millisecond)))
	return m, nil
}

// rootDisk is the ext4 image a spec's RootFS names: the file itself, or
// rootfs.ext4 beside an image's root directory (package image keeps both).
func rootDisk(rootfs string) (string, error) {
	st, err := os.Stat(rootfs)
	if err != nil {
		return "", fmt.Errorf("root filesystem: %w", err)
	}
	if !st.IsDir() {
		return filepath.Abs(rootfs)
	}
	img := filepath.Join(filepath.Dir(filepath.Clean(rootfs)), "rootfs.ext4")
	if _, err := os.Stat(img); err != nil {
		return "", fmt.Errorf("root filesystem %s is a directory and there is no rootfs.ext4 beside it: a VM needs the image as an ext4 file (package image builds it)", rootfs)
	}
	return filepath.Abs(img)
}

// Recover re-attaches to a machine left running by a daemon that stopped,
// through its API socket and its vsock socket. A machine whose VMM is gone
// is cleaned up and reported ErrNotFound.
func (d *Driver) Recover(ctx context.Context, id string) (vmm.Machine, error) {
	return d.recover(ctx, id, "")
}

// RecoverWithWorkspace is Recover with the view at dir put in the
// machine's share first: reattach resumes a paused VM for a moment to
// reach its agent, and it must not reach the dead view meanwhile.
func (d *Driver) RecoverWithWorkspace(ctx context.Context, id, dir string) (vmm.Machine, error) {
	return d.recover(ctx, id, dir)
}

// recover re-attaches to machine id, with view (if not empty) put in its
// share before it runs.
func (d *Driver) recover(ctx context.Context, id, view string) (vmm.Machine, error) {
	if err := vmm.CheckName("machine", id); err != nil {
		return nil, err
	}
	dir := d.machineDir(id)
	st, err := readState(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// No state: nothing was started, or the machine is gone.
			if _, err := os.Stat(dir); err == nil {
				if err := share.Teardown(filepath.Join(dir, shareDir)); err != nil {
					return nil, fmt.Errorf("recover machine %s: %w", id, err)
				}
				os.RemoveAll(dir)
				d.record(id, "destroy", "found with nothing started after a daemon restart; cleaned up")
			}
			return nil, fmt.Errorf("recover machine %s: %w", id, vmm.ErrNotFound)
		}
		return nil, fmt.Errorf("recover machine %s: %w", id, err)
	}
	if view != "" && st.Spec.Workspace == "" {
		return nil, fmt.Errorf("recover machine %s with a workspace: %w", id, vmm.ErrNoWorkspace)
	}
	m := newMachine(d, st.Spec, dir, st.Root)
	m.st = st
	if !d.isVMM(st.VMM) {
		m.teardown(context.Background())
		d.record(id, "destroy", "found dead after a daemon restart; cleaned up")
		return nil, fmt.Errorf("recover machine %s: its cloud-hypervisor is gone: %w", id, vmm.ErrNotFound)
	}
	if view != "" {
		if err := share.Replace(m.path(shareDir), view); err != nil {
			return nil, fmt.Errorf("recover machine %s: %w", id, err)
		}
		m.spec.Workspace, m.st.Spec.Workspace = view, view
		if err := m.saveState(); err != nil {
			return nil, fmt.Errorf("recover machine %s: %w", id, err)
		}
		d.record(id, "attach-workspace", view)
	}
	m.adopt(st.VMM)
	paused, err := m.reattach(ctx)
	if err != nil {
		m.Destroy(context.Background())
		return nil, fmt.Errorf("recover machine %s: %w", id, err)
	}
	d.record(id, "recover", fmt.Sprintf("re-attached to cloud-hypervisor pid %d (paused: %v)", st.VMM, paused))
	return m, nil
}

// isVMM reports whether pid is still this driver's cloud-hypervisor.
func (d *Driver) isVMM(pid int) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return pid > 0 && err == nil && trimDeleted(exe) == d.ch
}

// List returns the machines with state on disk.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	return vmm.MachineDirs(filepath.Join(d.cfg.Dir, "machines"))
}
