package jail

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"hearth/vmm"
)

// agentProc is one run of a machine's agent; a restore starts another.
type agentProc struct {
	pid    int
	exited chan struct{} // closed when the process has exited
	// owner is told of the exit: the machine, which a prepared jail's
	// claim replaces (warm.go).
	owner atomic.Pointer[machine]
}

// spawn starts the agent in new namespaces. It waits for its jail config
// until it is in its cgroups, so nothing it runs escapes the limits.
func (m *machine) spawn() (*agentProc, error) {
	p, _, err := m.spawnAgent(false)
	return p, err
}

// spawnAgent is spawn; with await, the agent is a prepared jail's: it
// waits for its claim on the control socket, returned open.
func (m *machine) spawnAgent(await bool) (*agentProc, *os.File, error) {
	spec, dir := m.spec, m.dir
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer logf.Close()
	ctrl, ctrlChild, err := socketPair()
	if err != nil {
		return nil, nil, err
	}
	keep := false
	defer func() {
		if !keep {
			ctrl.Close()
		}
	}()
	defer ctrlChild.Close()
	ln, err := listenFile(filepath.Join(dir, "agent.sock"))
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	// The agent cannot reach the binary's path from inside its user
	// namespace, so it is exec'd through a descriptor.
	exe, err := os.Open(m.d.agent)
	if err != nil {
		return nil, nil, err
	}
	defer exe.Close()
	cmd := &exec.Cmd{Path: "/proc/self/fd/5", Args: []string{"hearth-guest", "--jail-fd", "3", "--channel", "listen-fd:4",
		"--exe-fd", "5", "--hostname", hostname, "--root", "/",
		"--uid", strconv.FormatUint(uint64(spec.UID), 10), "--gid", strconv.FormatUint(uint64(spec.GID), 10)}}
	cmd.ExtraFiles = []*os.File{ctrlChild, ln, exe}
	cmd.Env = agentEnv
	cmd.Stdout, cmd.Stderr = logf, logf
	base, size, err := m.d.HostIDs(m.id)
	if err != nil {
		return nil, nil, err
	}
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: int(size)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings: idmap, GidMappings: idmap, GidMappingsEnableSetgroups: true,
		Credential: &syscall.Credential{}, // root of the new namespace
		Setsid:     true,
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start agent: %w", err)
	}
	pid := cmd.Process.Pid
	if err := m.configure(pid, ctrl, await); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, nil, err
	}
	os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(pid)), 0o600)
	p := &agentProc{pid: pid, exited: make(chan struct{})}
	p.owner.Store(m)
	go func() {
		err := cmd.Wait()
		close(p.exited)
		p.owner.Load().agentExited(p, err)
	}()
	keep = await
	if !await {
		ctrl = nil
	}
	return p, ctrl, nil
}

// agentEnv is the whole environment of a machine's PID 1. The daemon's
// own environment holds secrets (the provider's API key among them) and
// must never reach a machine, so nothing of it is passed on: the agent
// needs no variable, and gives the processes it starts an environment of
// its own (guest.ServerOptions.BaseEnv).
var agentEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/", "TERM=dumb"}

// configure puts the waiting agent in its cgroups, then sends it its jail
// config with the mounts it needs.
func (m *machine) configure(pid int, ctrl *os.File, await bool) error {
	if err := m.cg.add(pid); err != nil {
		return err
	}
	mounts, err := jailMounts(pid, m.spec, m.layer)
	if err != nil {
		return err
	}
	defer func() {
		for _, fd := range mounts {
			unix.Close(fd)
		}
	}()
	cfg, _ := json.Marshal(jailConfig{Workspace: m.spec.Workspace != "", AwaitClaim: await})
	if err := unix.Sendmsg(int(ctrl.Fd()), cfg, unix.UnixRights(mounts...), nil, 0); err != nil {
		return fmt.Errorf("send jail config: %w", err)
	}
	return nil
}

// jailConfig mirrors cmd/hearth-guest's JailConfig.
type jailConfig struct {
	Workspace  bool `json:"workspace"`
	AwaitClaim bool `json:"await_claim,omitempty"`
}

// jailClaim mirrors cmd/hearth-guest's JailClaim.
type jailClaim struct {
	Hostname string `json:"hostname"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
}

// jailMounts prepares, as detached mounts, what the agent assembles its
// root from: the image (read-only) and the writable layer, both id-mapped
// into the agent's user namespace, and the workspace view.
func jailMounts(pid int, spec vmm.Spec, l *layer) ([]int, error) {
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return nil, err
	}
	defer userns.Close()
	var fds []int
	add := func(path string, attr *unix.MountAttr) error {
		fd, err := detachedMount(path, attr)
		if err == nil {
			fds = append(fds, fd)
		}
		return err
	}
	nsfd := uint64(userns.Fd())
	err = add(spec.RootFS, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV, Userns_fd: nsfd})
	if err == nil {
		err = add(l.root, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NODEV, Userns_fd: nsfd})
	}
	if err == nil && spec.Workspace != "" {
		err = add(spec.Workspace, nil)
	}
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, err
	}
	return fds, nil
}

// detachedMount clones the mount tree at path into a detached mount and
// sets attr on it.
func detachedMount(path string, attr *unix.MountAttr) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("clone mount of %s: %w", path, err)
	}
	if attr != nil {
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("id-map mount of %s: %w (the filesystem must support id-mapped mounts, Linux 5.12+)", path, err)
		}
	}
	return fd, nil
}

// socketPair returns the two ends of a connected unix socket.
func socketPair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "jail-ctrl"), os.NewFile(uintptr(fds[1]), "jail-ctrl-child"), nil
}

// listenFile makes the agent's listening socket at path. The socket file
// stays when our copy closes: the agent keeps listening, and a restarted
// daemon connects to it there.
func listenFile(path string) (*os.File, error) {
	os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	defer ln.Close()
	os.Chmod(path, 0o600)
	return ln.File()
}
