// Package jail is the machine tier every Linux host can run: the agent
// runs as PID 1 of fresh user, mount, PID, network (loopback only), IPC
// and UTS namespaces (root inside is an unprivileged id outside), in an
// overlay of the image's root with a writable layer of
// its own, the session's workspace view bind-mounted at /workspace/agents,
// limited by cgroups (v1 or v2), and its processes run as the image's
// unprivileged user with no_new_privs. Only the appliance imports it.
package jail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// Driver makes jails. Its state lives under Dir: one directory per
// machine with its writable layer, agent socket, log and pid.
type Driver struct {
	dir   string
	agent string // path of the hearth-guest binary on the host

	auditMu sync.Mutex
	audit   *os.File        // <dir>/audit.jsonl: every lifecycle step, appended
	notify  func(vmm.Event) // also told each event, if set
}

// OnEvent sets a function told of every lifecycle event (after it is in
// the audit log). Set it before creating machines.
func (d *Driver) OnEvent(fn func(vmm.Event)) { d.notify = fn }

// record appends a lifecycle event to the audit log.
func (d *Driver) record(id, kind, detail string) {
	e := vmm.Event{Time: time.Now().UTC(), Machine: id, Kind: kind, Detail: detail}
	b, _ := json.Marshal(e)
	d.auditMu.Lock()
	d.audit.Write(append(b, '\n'))
	d.auditMu.Unlock()
	if d.notify != nil {
		d.notify(e)
	}
}

var _ vmm.Driver = (*Driver)(nil)

// New returns a driver keeping state in dir and starting agent (the
// hearth-guest binary) as each machine's PID 1.
func New(dir, agent string) (*Driver, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("jail driver: needs root (namespaces, mounts and cgroups)")
	}
	if _, err := os.Stat(agent); err != nil {
		return nil, fmt.Errorf("jail driver: agent binary: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "machines"), 0o700); err != nil {
		return nil, err
	}
	audit, err := os.OpenFile(filepath.Join(dir, "audit.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &Driver{dir: dir, agent: agent, audit: audit}, nil
}

func (d *Driver) Name() string { return "jail" }

func (d *Driver) Capabilities() vmm.Capabilities {
	return vmm.Capabilities{Isolation: "namespaces", Pause: true, HostIDOffset: IDBase}
}

// Every machine's user namespace maps its ids 0..IDCount-1 onto the host
// ids IDBase..IDBase+IDCount-1: root in a machine is an unprivileged
// user on the host, and so is its agent user (1000 inside, 101000
// outside). The image and the writable layer are mounted id-mapped, so on
// disk they keep the ids the image was built with.
const (
	IDBase  = 100000
	IDCount = 65536
)

// Create starts a machine and returns once its agent answers.
func (d *Driver) Create(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	dir := d.machineDir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return nil, fmt.Errorf("create machine %s: %w", spec.ID, vmm.ErrExists)
		}
		return nil, err
	}
	d.record(spec.ID, "create", fmt.Sprintf("rootfs=%s workspace=%s memory=%d cpus=%g pids=%d", spec.RootFS, spec.Workspace, spec.Memory, spec.CPUs, spec.Pids))
	start := time.Now()
	m, err := d.start(ctx, spec, dir)
	if err != nil {
		os.RemoveAll(dir)
		d.record(spec.ID, "destroy", "start failed: "+err.Error())
		return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
	}
	d.record(spec.ID, "start", fmt.Sprintf("agent pid %d answered after %v", m.pid, time.Since(start).Round(time.Microsecond)))
	return m, nil
}

// Close closes the audit log. Machines keep running; a new Driver over
// the same directory recovers them.
func (d *Driver) Close() error { return d.audit.Close() }

func (d *Driver) machineDir(id string) string { return filepath.Join(d.dir, "machines", id) }

func (d *Driver) start(ctx context.Context, spec vmm.Spec, dir string) (*machine, error) {
	for _, p := range []string{"rw", "rw/upper", "rw/work"} {
		if err := os.Mkdir(filepath.Join(dir, p), 0o755); err != nil {
			return nil, err
		}
	}
	cg, err := newCgroup(spec.ID)
	if err != nil {
		return nil, err
	}
	if err := cg.limit(spec.Memory, spec.CPUs, spec.Pids); err != nil {
		cg.remove()
		return nil, err
	}
	m, err := d.spawn(spec, dir, cg)
	if err != nil {
		cg.remove()
		return nil, err
	}
	if err := m.connect(ctx); err != nil {
		m.Destroy(context.Background())
		return nil, err
	}
	return m, nil
}

// spawn starts the agent in new namespaces. It waits for its jail config
// until it is in its cgroups, so nothing it runs escapes the limits.
func (d *Driver) spawn(spec vmm.Spec, dir string, cg *cgroup) (*machine, error) {
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	ctrl, ctrlChild, err := socketPair()
	if err != nil {
		return nil, err
	}
	defer ctrl.Close()
	defer ctrlChild.Close()
	ln, err := listenFile(filepath.Join(dir, "agent.sock"))
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	// The agent cannot reach the binary's path from inside its user
	// namespace, so it is exec'd through a descriptor.
	exe, err := os.Open(d.agent)
	if err != nil {
		return nil, err
	}
	defer exe.Close()
	cmd := &exec.Cmd{Path: "/proc/self/fd/5", Args: []string{"hearth-guest", "--jail-fd", "3", "--channel", "listen-fd:4",
		"--exe-fd", "5", "--hostname", hostname, "--root", "/",
		"--uid", strconv.FormatUint(uint64(spec.UID), 10), "--gid", strconv.FormatUint(uint64(spec.GID), 10)}}
	cmd.ExtraFiles = []*os.File{ctrlChild, ln, exe}
	cmd.Stdout, cmd.Stderr = logf, logf
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: IDBase, Size: IDCount}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings: idmap, GidMappings: idmap, GidMappingsEnableSetgroups: true,
		Credential: &syscall.Credential{}, // root of the new namespace
		Setsid:     true,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	pid := cmd.Process.Pid
	if err := d.configure(pid, spec, dir, cg, ctrl); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(pid)), 0o600)
	m := &machine{d: d, id: spec.ID, dir: dir, pid: pid, cg: cg, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if !m.destroying.Load() {
			d.record(spec.ID, "exit", fmt.Sprintf("agent ended by itself: %v", err))
		}
		close(m.done)
	}()
	return m, nil
}

// configure puts the waiting agent in its cgroups, then sends it its jail
// config with the mounts it needs.
func (d *Driver) configure(pid int, spec vmm.Spec, dir string, cg *cgroup, ctrl *os.File) error {
	if err := cg.add(pid); err != nil {
		return err
	}
	mounts, err := jailMounts(pid, spec, dir)
	if err != nil {
		return err
	}
	defer func() {
		for _, fd := range mounts {
			unix.Close(fd)
		}
	}()
	cfg, _ := json.Marshal(jailConfig{Workspace: spec.Workspace != ""})
	if err := unix.Sendmsg(int(ctrl.Fd()), cfg, unix.UnixRights(mounts...), nil, 0); err != nil {
		return fmt.Errorf("send jail config: %w", err)
	}
	return nil
}

// jailConfig mirrors cmd/hearth-guest's JailConfig.
type jailConfig struct {
	Workspace bool `json:"workspace"`
}

// jailMounts prepares, as detached mounts, what the agent assembles its
// root from: the image (read-only) and the writable layer, both id-mapped
// into the agent's user namespace, and the workspace view.
func jailMounts(pid int, spec vmm.Spec, dir string) ([]int, error) {
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
		err = add(filepath.Join(dir, "rw"), &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NODEV, Userns_fd: nsfd})
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

// Recover re-attaches to a machine left running by a daemon that stopped.
func (d *Driver) Recover(ctx context.Context, id string) (vmm.Machine, error) {
	dir := d.machineDir(id)
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return nil, fmt.Errorf("recover machine %s: %w", id, vmm.ErrNotFound)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	cg, err := newCgroup(id)
	if err != nil {
		return nil, err
	}
	m := &machine{d: d, id: id, dir: dir, pid: pid, cg: cg, done: make(chan struct{})}
	if !d.isAgent(pid) {
		m.cleanup()
		d.record(id, "destroy", "found dead after a daemon restart; cleaned up")
		return nil, fmt.Errorf("recover machine %s: its agent is gone: %w", id, vmm.ErrNotFound)
	}
	go m.watch()
	if err := m.connect(ctx); err != nil {
		m.Destroy(context.Background())
		return nil, fmt.Errorf("recover machine %s: %w", id, err)
	}
	d.record(id, "recover", fmt.Sprintf("re-attached to agent pid %d", pid))
	return m, nil
}

// isAgent reports whether pid is still this driver's agent.
func (d *Driver) isAgent(pid int) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return pid > 0 && err == nil && strings.TrimSuffix(exe, " (deleted)") == d.agent
}

// List returns the machines with state on disk.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(d.dir, "machines"))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

type machine struct {
	d    *Driver
	id   string
	dir  string
	pid  int
	cg   *cgroup
	gc   *guest.Client
	done chan struct{}

	mu         sync.Mutex  // serialises Destroy
	destroying atomic.Bool // set by Destroy; the waiter reads it without the lock
}

var _ vmm.Machine = (*machine)(nil)

func (m *machine) ID() string            { return m.id }
func (m *machine) Guest() *guest.Client  { return m.gc }
func (m *machine) Done() <-chan struct{} { return m.done }

// connect dials the agent's socket until it answers a health check.
func (m *machine) connect(ctx context.Context) error {
	sock := filepath.Join(m.dir, "agent.sock")
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			gc, err := guest.NewClient(conn)
			if err == nil {
				hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err = gc.Health(hctx)
				cancel()
				if err == nil {
					m.gc = gc
					return nil
				}
				gc.Close()
			}
		}
		select {
		case <-m.done:
			log, _ := os.ReadFile(filepath.Join(m.dir, "agent.log"))
			return fmt.Errorf("agent exited while starting: %s", strings.TrimSpace(string(log)))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent did not answer on %s within 10s: %v", sock, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// watch closes done when a recovered agent (not our child) exits.
func (m *machine) watch() {
	for syscall.Kill(m.pid, 0) == nil {
		time.Sleep(100 * time.Millisecond)
	}
	close(m.done)
}

func (m *machine) Pause(ctx context.Context) error {
	if err := m.cg.freeze(true); err != nil {
		return fmt.Errorf("pause machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "pause", "")
	return nil
}

func (m *machine) Resume(ctx context.Context) error {
	if err := m.cg.freeze(false); err != nil {
		return fmt.Errorf("resume machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "resume", "")
	return nil
}

// Destroy kills the agent; as PID 1 of its namespace, its death takes
// every process of the machine with it, and its mounts go with its mount
// namespace.
func (m *machine) Destroy(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.destroying.Swap(true) {
		return nil
	}
	if m.gc != nil {
		m.gc.Close()
	}
	m.cg.freeze(false) // a frozen process cannot die
	syscall.Kill(m.pid, syscall.SIGKILL)
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("destroy machine %s: agent %d did not exit", m.id, m.pid)
	case <-ctx.Done():
		return ctx.Err()
	}
	err := m.cleanup()
	m.d.record(m.id, "destroy", "")
	return err
}

func (m *machine) cleanup() error {
	err := m.cg.remove()
	if rerr := os.RemoveAll(m.dir); err == nil {
		err = rerr
	}
	return err
}
