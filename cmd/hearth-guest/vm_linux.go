package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"hearth/vmm/guest"
	"hearth/vmm/share"
)

// The VM mode: the agent is /init of an initramfs (PID 1, started by the
// kernel with no --channel flag). It reads its settings from hearth.* keys
// on the kernel command line, loads the kernel modules the initramfs
// carries, mounts the image's root read-only under an overlay whose
// writable layer is on a disk of the VM's own, mounts the workspace over
// virtio-fs (see mountWorkspace), and makes that overlay the root before it serves the host.

// moduleList is image.ModuleList: where the initramfs lists its modules,
// in load order, relative to /lib/modules/<release>/.
const moduleList = "hearth.modules"

// A kernel command line with probeKey asks the agent to print probeReply
// on the console and power off at once: the host's trial boot (package
// vmm/qemu, BootsWithKVM) waits for that line.
const (
	probeKey   = "hearth.probe"
	probeReply = "hearth-guest: probe: the kernel started the agent"
)

// vmConfig is what the kernel command line says.
type vmConfig struct {
	root     string // device of the image's ext4 root, mounted read-only
	rw       string // device of the writable layer's ext4 disk; empty: tmpfs
	fs       string // virtio-fs tag of the workspace; empty: none
	channel  string // host channel, as --channel takes it
	hostname string
	uid, gid uint64
	// await: the host sends the hostname and the user as a claim line on
	// the channel (a dev: port) when a session takes the VM, which
	// may have been booted ahead of time.
	await bool
	// replug: the host may unplug the workspace's device and plug it in
	// again (Cloud Hypervisor around a snapshot), so the agent keeps a
	// helper to mount it again (remount_linux.go).
	replug bool
}

// parseCmdline reads the hearth.* keys of a kernel command line.
func parseCmdline(cmdline string) (vmConfig, error) {
	var c vmConfig
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "hearth.root":
			c.root = v
		case "hearth.rw":
			c.rw = v
		case "hearth.fs":
			c.fs = v
		case "hearth.channel":
			c.channel = v
		case "hearth.hostname":
			c.hostname = v
		case "hearth.uid":
			c.uid, err = strconv.ParseUint(v, 10, 32)
		case "hearth.gid":
			c.gid, err = strconv.ParseUint(v, 10, 32)
		case "hearth.await":
			c.await = true
		case "hearth.replug":
			c.replug = true
		}
		if err != nil {
			return c, fmt.Errorf("kernel command line: %s: %w", f, err)
		}
	}
	if c.root == "" || c.channel == "" {
		return c, fmt.Errorf("kernel command line %q: hearth.root and hearth.channel are required in a VM", cmdline)
	}
	if c.await && !strings.HasPrefix(c.channel, "dev:") {
		return c, fmt.Errorf("kernel command line %q: hearth.await needs a dev: channel", cmdline)
	}
	return c, nil
}

// vmInit sets up a VM from the initramfs and switches to its root. On
// return the process runs in the overlay root with /dev moved there; the
// common init (initMounts) mounts proc, sys and /tmp afresh.
func vmInit() (vmConfig, error) {
	// The kernel starts init with no PATH; the agent looks programs up.
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	for _, m := range []struct{ fstype, dst string }{{"devtmpfs", "/dev"}, {"proc", "/proc"}, {"sysfs", "/sys"}} {
		os.MkdirAll(m.dst, 0o755)
		if err := syscall.Mount(m.fstype, m.dst, m.fstype, syscall.MS_NOSUID, ""); err != nil {
			return vmConfig{}, fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return vmConfig{}, err
	}
	if slices.Contains(strings.Fields(string(cmdline)), probeKey) {
		// A trial boot: the host only wants to know the kernel ran us.
		fmt.Fprintln(os.Stderr, probeReply)
		powerOff()
	}
	c, err := parseCmdline(string(cmdline))
	if err != nil {
		return c, err
	}
	if err := loadModules(c); err != nil {
		return c, err
	}
	if port, ok := strings.CutPrefix(c.channel, "dev:/dev/virtio-ports/"); ok {
		if err := linkPort(port); err != nil {
			return c, err
		}
	}
	if err := mountRoot(c, "/newroot"); err != nil {
		return c, err
	}
	if c.fs != "" {
		if err := mountWorkspace(c.fs, "/newroot"); err != nil {
			return c, err
		}
	}
	return c, switchRoot("/newroot")
}

// mountWorkspace sets up the workspace under root as package vmm/share's
// guest contract says: /workspace is a small tmpfs (whatever the image
// has there is hidden), the virtio-fs tag is mounted at share.GuestMount,
// and /workspace/agents is a symlink to the view inside it. The symlink,
// unlike a bind mount, is followed afresh on every lookup, so a view the
// host puts in place of a dead one is reached without anything done in
// here.
func mountWorkspace(tag, root string) error {
	ws := root + "/workspace"
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if err := syscall.Mount("tmpfs", ws, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", ws, err)
	}
	dst := root + share.GuestMount
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if err := syscall.Mount(tag, dst, "virtiofs", syscall.MS_NOSUID|syscall.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount virtio-fs %s on %s: %w", tag, dst, err)
	}
	if err := os.Symlink(share.GuestAgents, ws+"/agents"); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return syscall.Mount("", ws, "", syscall.MS_REMOUNT|syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
}

// optionalModules are modules of the list loaded only when the machine
// has what they drive, each a few tens of milliseconds saved at boot
// under software emulation. (The list holds every module any VM tier
// needs: the initramfs is the same for all.)
var optionalModules = map[string]func(c vmConfig) bool{
	// PCI transport: Cloud Hypervisor's devices; QEMU's microvm has no PCI.
	"virtio_pci": hasPCI, "virtio_pci_legacy_dev": hasPCI, "virtio_pci_modern_dev": hasPCI,
	// vsock: the host channel of Cloud Hypervisor; QEMU's is a serial port.
	"vsock": usesVsock, "vmw_vsock_virtio_transport_common": usesVsock, "vmw_vsock_virtio_transport": usesVsock,
	// virtio-fs: only a machine with a workspace.
	"fuse": hasWorkspace, "virtiofs": hasWorkspace,
}

func hasPCI(vmConfig) bool {
	devs, _ := os.ReadDir("/sys/bus/pci/devices")
	return len(devs) > 0
}
func usesVsock(c vmConfig) bool    { return strings.HasPrefix(c.channel, "vsock") }
func hasWorkspace(c vmConfig) bool { return c.fs != "" }

// loadModules loads the initramfs's modules in the order its list gives,
// but for the optional ones the machine does not need.
func loadModules(c vmConfig) error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]))
	list, err := os.ReadFile(filepath.Join(dir, moduleList))
	if err != nil {
		return fmt.Errorf("module list: %w (an initramfs for another kernel?)", err)
	}
	for _, m := range strings.Fields(string(list)) {
		name := strings.ReplaceAll(strings.TrimSuffix(filepath.Base(m), ".ko"), "-", "_")
		if need, ok := optionalModules[name]; ok && !need(c) {
			continue
		}
		if err := loadModule(filepath.Join(dir, m)); err != nil {
			return err
		}
	}
	return nil
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("load module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	return nil
}

// linkPort makes /dev/virtio-ports/NAME for the virtio-serial port the
// host named NAME, as udev would, waiting for the host to announce it.
// The port's own node (/dev/vportXpY) is numbered by probe order, so only
// the name is stable.
func linkPort(name string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, f := range names {
			b, _ := os.ReadFile(f)
			if strings.TrimSpace(string(b)) != name {
				continue
			}
			node := filepath.Base(filepath.Dir(f))
			os.MkdirAll("/dev/virtio-ports", 0o755)
			if err := os.Symlink("../"+node, "/dev/virtio-ports/"+name); err != nil && !os.IsExist(err) {
				return fmt.Errorf("link virtio-serial port %s: %w", name, err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no virtio-serial port named %q appeared within 10s (ports: %v)", name, names)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mountRoot mounts the overlay of the image's root (read-only) and the
// writable layer at dst.
func mountRoot(c vmConfig, dst string) error {
	for _, d := range []string{"/lower", "/rw", dst} {
		os.MkdirAll(d, 0o755)
	}
	if err := mountDevice(c.root, "/lower", "ext4", syscall.MS_RDONLY, ""); err != nil {
		return err
	}
	if c.rw != "" {
		if err := mountDevice(c.rw, "/rw", "ext4", syscall.MS_NOATIME, ""); err != nil {
			return err
		}
	} else if err := syscall.Mount("tmpfs", "/rw", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on /rw: %w", err)
	}
	for _, d := range []string{"/rw/upper", "/rw/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	opts := "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work"
	if err := syscall.Mount("overlay", dst, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay (%s) on %s: %w", opts, dst, err)
	}
	return nil
}

// mountDevice mounts dev, waiting a little for it to appear: a driver may
// still be probing it after its module loaded.
func mountDevice(dev, dst, fstype string, flags uintptr, data string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.Stat(dev)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mount %s on %s: device never appeared: %w", dev, dst, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := syscall.Mount(dev, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", dev, fstype, dst, err)
	}
	return nil
}

// switchRoot makes newRoot the root, as switch_root(8) does: it frees the
// initramfs's files, moves /dev into the new root, and moves the new root
// over / (the initramfs cannot be unmounted, only covered).
func switchRoot(newRoot string) error {
	os.RemoveAll("/lib")
	os.Remove("/init")
	os.MkdirAll(newRoot+"/dev", 0o755)
	if err := syscall.Mount("/dev", newRoot+"/dev", "", syscall.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move /dev: %w", err)
	}
	syscall.Unmount("/proc", syscall.MNT_DETACH)
	syscall.Unmount("/sys", syscall.MNT_DETACH)
	if err := syscall.Chdir(newRoot); err != nil {
		return err
	}
	if err := syscall.Mount(".", "/", "", syscall.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move %s to /: %w", newRoot, err)
	}
	if err := syscall.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return syscall.Chdir("/")
}

// servePort serves the host over a virtio-serial port for as long as the
// VM runs. The port outlives host connections: a daemon that restarts
// connects again, and each connection starts with the port handshake
// (see vmm/guest's link.go) and gets a fresh protocol session. first,
// if not nil, is the session reader of the claim's connection.
func servePort(f *os.File, srv *guest.Server, first io.Reader) error {
	return srv.ServePort(f, func() { waitHost(f) }, first, logf)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "hearth-guest: "+format+"\n", args...)
}

// setClock sets the VM's wall clock.
func setClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set the clock: %w", err)
	}
	return nil
}

// openPort opens the virtio-serial port at path.
func openPort(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open host channel: %w", err)
	}
	return f, nil
}

// awaitClaim waits for a host to connect to the port and send the claim,
// and returns it with the reader of the session that follows it. A host
// that hangs up before it has sent the whole line is waited for again.
func awaitClaim(f *os.File) (guest.Claim, io.Reader, error) {
	for {
		r, err := guest.AcceptHost(f, func() { waitHost(f) })
		if err != nil {
			return guest.Claim{}, nil, fmt.Errorf("host port: %w", err)
		}
		c, err := guest.ReadClaim(r)
		if err == nil {
			return c, r, nil
		}
		logf("%v; waiting for the host again", err)
	}
}

// waitHost returns once a host is connected to the port.
func waitHost(f *os.File) {
	for {
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err == nil && n > 0 && fds[0].Revents&unix.POLLHUP == 0 {
			return
		}
		if err == nil && n == 0 {
			return // connected, nothing to read yet
		}
		time.Sleep(20 * time.Millisecond)
	}
}
