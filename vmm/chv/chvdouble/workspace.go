package chvdouble

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"hearth/vmm/share"
)

// GuestWorkspaceCommand is the first argument of the double's own
// command line re-executed to set up a guest's workspace (see
// RunGuestWorkspace). A program that serves the double (Listen) must
// hand the rest of such a command line to RunGuestWorkspace, as the
// chv-double command does.
const GuestWorkspaceCommand = "guest-workspace"

// RunGuestWorkspace is the guest's part of the workspace, done for the
// agent the double runs on the host, as hearth-guest's VM mode does it
// in a real guest (package vmm/share's guest contract): in a mount
// namespace of the agent's own, /workspace becomes a small tmpfs, the
// device (a symlink to the directory virtiofsd exports, see startAgent)
// is mounted at share.GuestMount, where a real guest mounts the virtio-fs
// tag, and /workspace/agents is a symlink into it. A device that is not
// plugged in (the symlink is absent: a VM restored from a snapshot) is
// not mounted, as a real guest restored from a snapshot taken without the
// device has nothing live there. Then it executes the agent. args: the
// device, then the agent's command line.
//
// The namespace is a slave of the host's, so a view the host puts in
// place in the share reaches the agent as it reaches virtiofsd. If the
// host has no /workspace, an empty one is made on its root as the mount
// point: the double runs on test machines only.
func RunGuestWorkspace(args []string) error {
	if len(args) < 2 {
		return errors.New("chv-double guest-workspace: give the exported directory and the agent's command line")
	}
	src, argv := args[0], args[1:]
	// Namespaces belong to threads: the one that unshares must exec.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("guest workspace: unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("guest workspace: make / a slave: %w", err)
	}
	const ws = "/workspace"
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return fmt.Errorf("guest workspace: %w", err)
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", ws, "tmpfs", flags, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("guest workspace: mount tmpfs on %s: %w", ws, err)
	}
	if err := os.Mkdir(share.GuestMount, 0o755); err != nil {
		return fmt.Errorf("guest workspace: %w", err)
	}
	if _, err := os.Stat(src); err == nil {
		if err := unix.Mount(src, share.GuestMount, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("guest workspace: mount %s at %s: %w", src, share.GuestMount, err)
		}
	}
	if err := os.Symlink(share.GuestAgents, ws+"/agents"); err != nil {
		return fmt.Errorf("guest workspace: %w", err)
	}
	if err := unix.Mount("", ws, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("guest workspace: remount %s read-only: %w", ws, err)
	}
	return unix.Exec(argv[0], argv, os.Environ())
}

// The workspace's device across unplug and plug, as a real guest sees it:
// the guest's mount of a virtio-fs device that is unplugged dies, and a
// device plugged in again is not mounted by anything but the guest's own
// remount (hearth-guest's remount helper, asked by the driver through
// package vmm/guest). Here the device is the symlink agent.fsDevice to the
// directory its virtiofsd exports: it is there while the device is
// plugged in, the agent's mount of it is detached when the guest ejects
// the device (so /workspace/agents leads nowhere, as a dead mount does),
// and hearth-guest, started with --workspace-device, binds it at
// share.GuestMount again when asked to remount.

// plugWorkspace makes the device hot-plugged as id with tag, if it is the
// agent's workspace, the one its remount binds.
func (m *vm) plugWorkspace(id, tag string) error {
	a := m.agent
	if a == nil || a.fsDevice == "" || tag != a.fsTag {
		return nil
	}
	dir, err := exportedDir(m.fsConns[id])
	if err != nil {
		return fmt.Errorf("chv-double: virtio-fs %s: %w", tag, err)
	}
	os.Remove(a.fsDevice)
	if err := os.Symlink(dir, a.fsDevice); err != nil {
		return fmt.Errorf("chv-double: virtio-fs %s: %w", tag, err)
	}
	return nil
}

// unplugWorkspace does to the agent what ejecting the device of tag does
// to a real guest, if it is the agent's workspace: the device is gone,
// and so is what the agent had mounted from it.
func (m *vm) unplugWorkspace(tag string) {
	a := m.agent
	if a == nil || a.fsDevice == "" || tag != a.fsTag {
		return
	}
	os.Remove(a.fsDevice)
	if err := detachIn(a.cmd.Process.Pid, share.GuestMount); err != nil {
		fmt.Fprintf(os.Stderr, "chv-double: eject virtio-fs %s: %v\n", tag, err)
	}
}

// detachIn lazily unmounts what is mounted at target in the mount
// namespace of process pid, with nsenter(1) and umount(8): joining it
// from this process would take a thread that is never given back, and
// the agent, started with Pdeathsig, dies with the thread that started it.
func detachIn(pid int, target string) error {
	out, err := exec.Command("nsenter", "--target", strconv.Itoa(pid), "--mount", "umount", "--lazy", target).CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("not mounted")) {
		return fmt.Errorf("detach %s in the guest: %v: %s", target, err, bytes.TrimSpace(out))
	}
	return nil
}

// exportedDir is the directory the virtiofsd at the other end of a
// vhost-user connection exports, read from its command line: C
// virtiofsd's -o source=DIR, or the Rust one's --shared-dir DIR.
func exportedDir(c net.Conn) (string, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return "", errors.New("the vhost-user connection is not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return "", err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return "", fmt.Errorf("who serves the vhost-user socket: %w", cerr)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cred.Pid))
	if err != nil {
		return "", fmt.Errorf("command line of virtiofsd pid %d: %w", cred.Pid, err)
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for i, a := range args {
		next := ""
		if i+1 < len(args) {
			next = args[i+1]
		}
		switch {
		case a == "--shared-dir":
			return next, nil
		case strings.HasPrefix(a, "--shared-dir="):
			return strings.TrimPrefix(a, "--shared-dir="), nil
		case a == "-o" || strings.HasPrefix(a, "-o"):
			opts := strings.TrimPrefix(a, "-o")
			if opts == "" {
				opts = next
			}
			for _, o := range strings.Split(opts, ",") {
				if dir, ok := strings.CutPrefix(o, "source="); ok {
					return dir, nil
				}
			}
		}
	}
	return "", fmt.Errorf("virtiofsd pid %d (%s) names no exported directory (-o source=DIR or --shared-dir DIR)", cred.Pid, strings.Join(args, " "))
}
