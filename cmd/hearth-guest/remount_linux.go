package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"hearth/vmm/share"
)

// The workspace remount helper.
//
// Why it exists: Cloud Hypervisor cannot snapshot a VM with virtio-fs
// attached, so the host unplugs the workspace's device for a memory
// snapshot and plugs a new one in after (package vmm/chv). The guest's
// mount of the old device is dead from then on, and someone in the guest
// must mount the tag again. The agent cannot: once set up, it gives up
// its capabilities and its seccomp filter refuses mount(2), for it and for
// everything it starts, and neither can be undone.
//
// So before it does, the agent starts this helper: itself, re-executed
// (a Go program cannot fork without exec) with remountHelperArg, so the
// helper keeps the capabilities and has no filter. It serves a socket
// only the agent holds and does exactly one fixed thing per request:
// lazily unmount whatever is at the workspace's mount point and mount the
// workspace's source there again, then answer "ok" or the error.
//
// Why it is safe: the action and everything it acts on (source, file
// system type, mount point) are fixed when the agent starts the helper,
// from the kernel command line; the bytes of a request are not read at
// all, so whoever could send one can at most have the workspace mounted
// again. The socket's other end exists only in the agent, which hands it
// to no process it starts (close-on-exec).

// remountHelperArg, as the first argument, makes hearth-guest the remount
// helper: hearth-guest --workspace-remount-helper FSTYPE SOURCE TARGET,
// with the agent's end of the request socket at descriptor 3. FSTYPE is
// "virtiofs" (SOURCE is the tag) or "bind" (SOURCE is a directory, for a
// machine whose workspace device is emulated: the Cloud Hypervisor
// double).
const remountHelperArg = "--workspace-remount-helper"

// remountTimeout bounds one request.
const remountTimeout = 30 * time.Second

func init() {
	// The helper is dispatched before main so that nothing of the agent
	// (flags, setup) runs in it.
	if len(os.Args) > 1 && os.Args[1] == remountHelperArg {
		if err := runRemountHelper(os.Args[2:], os.NewFile(3, "remount-requests")); err != nil {
			fmt.Fprintln(os.Stderr, "hearth-guest: workspace remount helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// workspaceSource is what the workspace's mount point gets mounted from.
type workspaceSource struct {
	fstype string // "virtiofs" or "bind"
	source string // the virtio-fs tag, or the directory to bind
	target string // the mount point
}

func (w workspaceSource) check() error {
	switch {
	case w.fstype != "virtiofs" && w.fstype != "bind":
		return fmt.Errorf("file system type %q: want virtiofs or bind", w.fstype)
	case w.source == "":
		return errors.New("no source to mount")
	case !strings.HasPrefix(w.target, "/"):
		return fmt.Errorf("mount point %q is not an absolute path", w.target)
	}
	return nil
}

// startWorkspaceRemount starts the helper if this machine's workspace can
// be unplugged and plugged in again, and returns the hook that asks it
// to remount (nil where there is nothing to remount). In a VM the tag
// is hearth.fs of the kernel command line; outside one, device is the
// directory standing for the device (--workspace-device), if any.
// It must run while the agent still has its capabilities and no seccomp
// filter: the helper inherits both states.
func startWorkspaceRemount(vm bool, device string) (func(context.Context) error, error) {
	var src workspaceSource
	switch {
	case vm:
		b, err := os.ReadFile("/proc/cmdline")
		if err != nil {
			return nil, fmt.Errorf("workspace remount helper: %w", err)
		}
		c, err := parseCmdline(string(b))
		if err != nil {
			return nil, err
		}
		if c.fs == "" || !c.replug {
			return nil, nil // no workspace, or one whose device stays
		}
		src = workspaceSource{"virtiofs", c.fs, share.GuestMount}
	case device != "":
		src = workspaceSource{"bind", device, share.GuestMount}
	default:
		return nil, nil
	}
	// /proc/self/exe: in a VM the binary (/init) is deleted by now, but
	// the kernel still holds it.
	r, err := startRemountHelper(exec.Command("/proc/self/exe"), src)
	if err != nil {
		return nil, err
	}
	return r.remount, nil
}

// remounter is the agent's side of the helper.
type remounter struct {
	mu     sync.Mutex
	conn   *net.UnixConn
	broken error // set once an exchange failed: the socket may be out of step
	cmd    *exec.Cmd
}

// startRemountHelper starts cmd (hearth-guest, or a command that ends by
// executing it, such as unshare(1) in tests) with the helper's arguments
// for src appended.
func startRemountHelper(cmd *exec.Cmd, src workspaceSource) (*remounter, error) {
	if err := src.check(); err != nil {
		return nil, fmt.Errorf("workspace remount helper: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("workspace remount helper: socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "remount-helper"), os.NewFile(uintptr(fds[1]), "remount-requests")
	defer theirs.Close()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("workspace remount helper: %w", err)
	}
	cmd.Args = append(cmd.Args, remountHelperArg, src.fstype, src.source, src.target)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stderr, os.Stderr
	// The helper ends when the agent does: the agent holds the only other
	// end of the socket. (Not Pdeathsig: that fires when the thread that
	// started the helper ends, which a Go program does not control.)
	if err := cmd.Start(); err != nil {
		c.Close()
		return nil, fmt.Errorf("workspace remount helper: start: %w", err)
	}
	go cmd.Wait() // PID 1's reaper may get there first; either way no zombie
	return &remounter{conn: c.(*net.UnixConn), cmd: cmd}, nil
}

// remount asks the helper to mount the workspace again and returns its
// answer.
func (r *remounter) remount(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken != nil {
		return fmt.Errorf("the workspace remount helper is unusable after an earlier failure: %w", r.broken)
	}
	deadline := time.Now().Add(remountTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	r.conn.SetDeadline(deadline)
	if _, err := r.conn.Write([]byte{'r'}); err != nil {
		// A helper that died may fail the request's write (broken pipe)
		// or its answer's read, depending on how far the kernel got in
		// closing its end: either way it did not answer.
		r.broken = err
		return fmt.Errorf("the workspace remount helper did not answer: %w", err)
	}
	buf := make([]byte, 4096)
	n, err := r.conn.Read(buf)
	if err == nil && n == 0 {
		err = errors.New("it has exited")
	}
	if err != nil {
		r.broken = err
		return fmt.Errorf("the workspace remount helper did not answer: %w", err)
	}
	if answer := string(buf[:n]); answer != "ok" {
		return errors.New(answer)
	}
	return nil
}

// runRemountHelper is the helper process: args are FSTYPE SOURCE TARGET,
// requests arrive on f. It returns when the agent closes its end.
func runRemountHelper(args []string, f *os.File) error {
	if len(args) != 3 {
		return fmt.Errorf("want FSTYPE SOURCE TARGET, got %q", args)
	}
	src := workspaceSource{args[0], args[1], args[2]}
	if err := src.check(); err != nil {
		return err
	}
	buf := make([]byte, 16)
	for {
		// The request's bytes are not looked at: it carries nothing.
		n, err := f.Read(buf)
		if n == 0 || err != nil {
			return nil // the agent is gone
		}
		answer := "ok"
		if err := src.remount(); err != nil {
			answer = err.Error()
		}
		if _, err := f.Write([]byte(answer)); err != nil {
			return fmt.Errorf("answer: %w", err)
		}
	}
}

// remount detaches whatever is mounted at the target (a dead virtio-fs
// mount, possibly several stacked) and mounts the source there again.
func (w workspaceSource) remount() error {
	for i := 0; ; i++ {
		err := unix.Unmount(w.target, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) {
			break // nothing (more) is mounted there
		}
		if err != nil {
			return fmt.Errorf("detach what is mounted at %s: %w", w.target, err)
		}
		if i == 64 {
			return fmt.Errorf("detach what is mounted at %s: still a mount point after 64 unmounts", w.target)
		}
	}
	flags, fstype := uintptr(unix.MS_NOSUID|unix.MS_NODEV), w.fstype
	if fstype == "bind" {
		flags, fstype = unix.MS_BIND|unix.MS_REC, ""
	}
	if err := unix.Mount(w.source, w.target, fstype, flags, ""); err != nil {
		return fmt.Errorf("mount %s %s on %s: %w", w.fstype, w.source, w.target, err)
	}
	return nil
}
