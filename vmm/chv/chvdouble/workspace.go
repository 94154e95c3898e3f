package chvdouble

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
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
// directory virtiofsd exports is mounted at share.GuestMount, where a real
// guest mounts the virtio-fs tag, and /workspace/agents is a symlink into
// it. Then it executes the agent. args: the exported directory, then the
// agent's command line.
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
	if err := unix.Mount(src, share.GuestMount, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("guest workspace: mount %s at %s: %w", src, share.GuestMount, err)
	}
	if err := os.Symlink(share.GuestAgents, ws+"/agents"); err != nil {
		return fmt.Errorf("guest workspace: %w", err)
	}
	if err := unix.Mount("", ws, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("guest workspace: remount %s read-only: %w", ws, err)
	}
	return unix.Exec(argv[0], argv, os.Environ())
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
