package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// JailConfig is what the jail driver sends the agent over its control
// socket before the agent serves. The agent is PID 1 of fresh user,
// mount, PID, network, IPC and UTS namespaces: root inside, an
// unprivileged id outside, so it cannot open the host's paths itself. The
// host prepares what the machine needs as detached mounts (new mount API)
// and passes them along as descriptors, in this order: the image root
// (read-only, ids mapped into the machine's range), the writable layer
// (holding upper/ and work/, ids mapped the same way), and the session's
// workspace view if Workspace is set.
type JailConfig struct {
	Workspace bool `json:"workspace"`
	// AwaitClaim makes a jail prepared ahead of time (vmm/jail's warm
	// pool): once its root is assembled the agent says so (one byte on
	// the control socket) and waits there for its JailClaim, before it
	// drops its privileges and serves.
	AwaitClaim bool `json:"await_claim,omitempty"`
}

// JailClaim is what a prepared jail learns when a sandbox takes it.
type JailClaim struct {
	Hostname string `json:"hostname"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
}

// receiveJail reads the config and its mounts from the control socket;
// the message is also the host's go-ahead (it has put us in our cgroups).
func receiveJail(fd int) (*JailConfig, []int, error) {
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*8))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("read jail config: %w", err)
	}
	fds, err := rights(oob[:oobn])
	if err != nil {
		return nil, nil, err
	}
	var c JailConfig
	if err := json.Unmarshal(buf[:n], &c); err != nil {
		return nil, nil, fmt.Errorf("jail config: %w", err)
	}
	if want := 2 + btoi(c.Workspace); len(fds) != want {
		return nil, nil, fmt.Errorf("jail config: got %d mounts, want %d", len(fds), want)
	}
	if !c.AwaitClaim {
		unix.Close(fd)
	}
	return &c, fds, nil
}

// rights returns the descriptors a message's control data carries.
func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) > 1 {
		return nil, fmt.Errorf("jail message: %d control messages (%v), want at most 1", len(msgs), err)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	return unix.ParseUnixRights(&msgs[0])
}

// awaitJailClaim tells the host the prepared jail is ready and waits for
// its claim; a host that goes away (EOF) ends the agent. The caller
// answers the claim (answerJailClaim) once it has taken it.
func awaitJailClaim(fd int) (JailClaim, error) {
	var c JailClaim
	if _, err := unix.Write(fd, []byte{1}); err != nil {
		return c, fmt.Errorf("tell the host the jail is ready: %w", err)
	}
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if err != nil || n == 0 {
		return c, fmt.Errorf("wait for the jail's claim: the host went away (%v)", err)
	}
	if err := json.Unmarshal(buf[:n], &c); err != nil {
		return c, fmt.Errorf("jail claim: %w", err)
	}
	return c, nil
}

// answerJailClaim tells the host the claim is taken, and the requests
// that waited for it go on: the host needs no health check.
// A host that did not wait for the answer (one from before it, which
// closed the socket after its claim) makes the write fail: the agent
// serves all the same, as that host expects.
func answerJailClaim(fd int) {
	unix.Write(fd, []byte{1})
	unix.Close(fd)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stage is where the machine's root is put together, on a tmpfs of the
// machine's own mounted over the host's /tmp in this mount namespace.
const stage = "/tmp"

// enterJail assembles the machine's root from the host's mounts and
// pivots into it.
func enterJail(c *JailConfig, fds []int) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := syscall.Mount("tmpfs", stage, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0700,size=64k"); err != nil {
		return fmt.Errorf("mount staging tmpfs: %w", err)
	}
	lower, rw, root := filepath.Join(stage, "lower"), filepath.Join(stage, "rw"), filepath.Join(stage, "root")
	for i, dst := range []string{lower, rw, root} {
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		if i < 2 {
			if err := attach(fds[i], dst); err != nil {
				return err
			}
		}
	}
	// userxattr: overlayfs keeps its metadata in user.overlay.* xattrs,
	// the ones a user namespace may set.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work,userxattr", lower, rw, rw)
	if err := syscall.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	if c.Workspace {
		dst := filepath.Join(root, "workspace/agents")
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := attach(fds[2], dst); err != nil {
			return err
		}
	}
	if err := minimalDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	if err := kernelMounts(root); err != nil {
		return err
	}
	return pivot(root)
}

// attach mounts a detached mount received from the host at dst.
func attach(fd int, dst string) error {
	defer unix.Close(fd)
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach host mount at %s: %w", dst, err)
	}
	return nil
}

// kernelMounts mounts proc, sys and a fresh /tmp in the new root. In a
// user namespace proc and sysfs may only be mounted while the host's are
// still in view, so this comes before the pivot.
func kernelMounts(root string) error {
	mounts := []struct {
		fstype, dst string
		flags       uintptr
		data        string
	}{
		{"proc", "proc", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
		{"sysfs", "sys", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC | syscall.MS_RDONLY, ""},
		{"tmpfs", "tmp", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=1777"},
	}
	for _, m := range mounts {
		dst := filepath.Join(root, m.dst)
		os.MkdirAll(dst, 0o755)
		if err := syscall.Mount(m.fstype, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on /%s: %w", m.fstype, m.dst, err)
		}
	}
	return nil
}

// minimalDev gives the machine a /dev with the harmless devices only.
func minimalDev(dev string) error {
	os.MkdirAll(dev, 0o755)
	if err := syscall.Mount("tmpfs", dev, "tmpfs", syscall.MS_NOSUID|syscall.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join(dev, name)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}
		if err := syscall.Mount("/dev/"+name, p, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", name, err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		os.MkdirAll(filepath.Join(dev, d), 0o755)
	}
	syscall.Mount("tmpfs", filepath.Join(dev, "shm"), "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777")
	// Terminals of its own for PTY execs, none of the host's.
	if err := syscall.Mount("devpts", filepath.Join(dev, "pts"), "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	os.Symlink("pts/ptmx", filepath.Join(dev, "ptmx"))
	for link, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		os.Symlink(target, filepath.Join(dev, link))
	}
	return nil
}

// pivot makes root the new / and drops the old one entirely.
func pivot(root string) error {
	old := filepath.Join(root, ".oldroot")
	if err := os.MkdirAll(old, 0o700); err != nil {
		return err
	}
	if err := syscall.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := syscall.Unmount("/.oldroot", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return os.Remove("/.oldroot")
}

// loopbackUp brings up lo, the only interface in the machine's network
// namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}

// attachWorkspace runs on the host, not in a machine: it replaces the
// workspace mount at target inside the mount namespace of process pid
// (a machine's agent) with the detached mount mountFD. After a daemon
// restart the old view's FUSE connection is gone, and a machine's view
// can only be swapped from inside its mount namespace. The agent itself
// cannot do it (its seccomp filter forbids mounts); this runs as root of
// the host, in a process of its own, so that joining the namespace
// touches nothing else.
func attachWorkspace(pid int, target string, mountFD int) error {
	runtime.LockOSThread() // never unlocked: the process ends after this
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return fmt.Errorf("machine's mount namespace: %w", err)
	}
	defer ns.Close()
	// A thread may join another mount namespace only with its own
	// filesystem attributes, which Go's threads share.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs attributes: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("join machine's mount namespace: %w", err)
	}
	// The old view may be dead (ENOTCONN) or absent; detach it either way.
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
		return fmt.Errorf("detach old workspace at %s: %w", target, err)
	}
	return attach(mountFD, target)
}
