// Package jail is the machine tier every Linux host can run: the agent
// runs as PID 1 of fresh mount, PID, network (loopback only), IPC and UTS
// namespaces, in an overlay of the image's root with a writable layer of
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
	return vmm.Capabilities{Isolation: "namespaces", Pause: true}
}

// jailConfig mirrors cmd/hearth-guest's JailConfig.
type jailConfig struct {
	Lower     string `json:"lower"`
	Upper     string `json:"upper"`
	Work      string `json:"work"`
	Merged    string `json:"merged"`
	Workspace string `json:"workspace"`
}

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
	cfg := jailConfig{Lower: spec.RootFS, Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"),
		Merged: filepath.Join(dir, "root"), Workspace: spec.Workspace}
	for _, p := range []string{cfg.Upper, cfg.Work, cfg.Merged} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return nil, err
		}
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "jail.json"), b, 0o600); err != nil {
		return nil, err
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

// spawn starts the agent in new namespaces, held at a pipe until it is in
// its cgroups, so nothing it runs escapes the limits.
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
	hold, release, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer hold.Close()
	defer release.Close()
	cmd := exec.Command(d.agent, "--jail", filepath.Join(dir, "jail.json"), "--channel", "listen:"+filepath.Join(dir, "agent.sock"),
		"--wait-fd", "3", "--hostname", hostname, "--root", "/",
		"--uid", strconv.FormatUint(uint64(spec.UID), 10), "--gid", strconv.FormatUint(uint64(spec.GID), 10))
	cmd.ExtraFiles = []*os.File{hold}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Setsid:     true,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	pid := cmd.Process.Pid
	if err := cg.add(pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	release.Write([]byte{1})
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
