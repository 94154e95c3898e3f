package jail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
)

type machine struct {
	d     *Driver
	id    string
	spec  vmm.Spec
	dir   string
	cg    *cgroup
	layer *layer // nil only for a dead machine found after a restart

	mu         sync.Mutex // serialises Destroy, Restore, Checkpoint and Export
	cur        atomic.Pointer[agentProc]
	gc         atomic.Pointer[guest.Client]
	paused     atomic.Bool
	restarting atomic.Bool // the agent is stopped on purpose, to start again
	destroying atomic.Bool
	done       chan struct{}
	doneOnce   sync.Once
}

var (
	_ vmm.Machine           = (*machine)(nil)
	_ vmm.Checkpointer      = (*machine)(nil)
	_ vmm.Exporter          = (*machine)(nil)
	_ vmm.UsageReporter     = (*machine)(nil)
	_ vmm.WorkspaceAttacher = (*machine)(nil)
)

func newMachine(d *Driver, spec vmm.Spec, dir string, cg *cgroup, l *layer) *machine {
	return &machine{d: d, id: spec.ID, spec: spec, dir: dir, cg: cg, layer: l, done: make(chan struct{})}
}

func (m *machine) ID() string            { return m.id }
func (m *machine) Guest() *guest.Client  { return m.gc.Load() }
func (m *machine) Done() <-chan struct{} { return m.done }
func (m *machine) agent() *agentProc     { return m.cur.Load() }

// boot starts the agent and waits until it answers.
func (m *machine) boot(ctx context.Context) error {
	p, err := m.spawn()
	if err != nil {
		return err
	}
	m.cur.Store(p)
	m.paused.Store(false)
	return m.connect(ctx)
}

// adopt takes over a running agent that is not our child (after a daemon
// restart) and watches for its exit.
func (m *machine) adopt(pid int) {
	p := &agentProc{pid: pid, exited: make(chan struct{})}
	m.cur.Store(p)
	m.paused.Store(m.cg.frozen())
	go func() {
		for syscall.Kill(pid, 0) == nil {
			time.Sleep(100 * time.Millisecond)
		}
		close(p.exited)
		m.agentExited(p, nil)
	}()
}

// agentExited is told when an agent process ends. Unless the machine is
// restarting it, the machine has stopped.
func (m *machine) agentExited(p *agentProc, err error) {
	if m.restarting.Load() {
		return
	}
	if !m.destroying.Load() {
		m.d.record(m.id, "exit", fmt.Sprintf("agent ended by itself: %v", err))
	}
	m.doneOnce.Do(func() { close(m.done) })
}

// dial connects to an agent that serves, or will once claimed (a
// spare's, whose listener queues the connection until then): no health
// round trip; if it ended since, the first call fails.
func (m *machine) dial() error {
	conn, err := net.Dial("unix", filepath.Join(m.dir, "agent.sock"))
	if err != nil {
		return fmt.Errorf("connect to the agent: %w", err)
	}
	gc, err := guest.NewClient(conn)
	if err != nil {
		conn.Close()
		return fmt.Errorf("connect to the agent: %w", err)
	}
	m.gc.Store(gc)
	return nil
}

// connect dials the agent's socket until it answers a health check.
func (m *machine) connect(ctx context.Context) error {
	sock := filepath.Join(m.dir, "agent.sock")
	p := m.agent()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			var gc *guest.Client
			if gc, err = guest.Open(ctx, conn, 5*time.Second); err == nil {
				m.gc.Store(gc)
				return nil
			}
		}
		select {
		case <-p.exited:
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

func (m *machine) Pause(ctx context.Context) error {
	if err := m.cg.freeze(true); err != nil {
		return fmt.Errorf("pause machine %s: %w", m.id, err)
	}
	m.paused.Store(true)
	m.d.record(m.id, "pause", "")
	return nil
}

func (m *machine) Resume(ctx context.Context) error {
	if err := m.cg.freeze(false); err != nil {
		return fmt.Errorf("resume machine %s: %w", m.id, err)
	}
	m.paused.Store(false)
	m.d.record(m.id, "resume", "")
	return nil
}

// Destroy kills the agent; as PID 1 of its namespace, its death takes
// every process of the machine with it, and its mounts go with its mount
// namespace. Then the layer, the cgroups and the state directory go.
func (m *machine) Destroy(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.destroying.Swap(true) {
		return nil
	}
	if err := m.stopAgent(ctx); err != nil {
		return fmt.Errorf("destroy machine %s: %w", m.id, err)
	}
	err := m.cleanup()
	m.d.record(m.id, "destroy", "")
	m.doneOnce.Do(func() { close(m.done) })
	return err
}

// stopAgent kills the current agent and waits for it to exit.
func (m *machine) stopAgent(ctx context.Context) error {
	if gc := m.gc.Load(); gc != nil {
		gc.Close()
	}
	p := m.agent()
	if p == nil {
		return nil
	}
	m.cg.freeze(false) // a frozen process cannot die
	syscall.Kill(p.pid, syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("agent %d did not exit", p.pid)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *machine) cleanup() error {
	err := m.cg.remove()
	if m.layer != nil {
		err = errors.Join(err, m.layer.Remove())
	} else {
		unmountLayer(filepath.Join(m.dir, layerMount)) // whatever a half-made layer left
	}
	err = errors.Join(err, os.RemoveAll(m.dir))
	m.d.releaseIDs(m.id)
	return err
}

func (m *machine) checkpointDir(name string) string {
	return filepath.Join(m.dir, "checkpoints", name)
}

// frozen runs fn with the machine paused, and leaves it as it found it.
func (m *machine) frozen(fn func() error) error {
	if !m.paused.Load() {
		if err := m.cg.freeze(true); err != nil {
			return err
		}
		defer m.cg.freeze(false)
	}
	return fn()
}

// Checkpoint saves the writable layer under the machine's checkpoints.
func (m *machine) Checkpoint(ctx context.Context, name string) error {
	if err := vmm.CheckName("checkpoint", name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dst := m.checkpointDir(name)
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("checkpoint %s of machine %s: %w", name, m.id, vmm.ErrExists)
	}
	os.MkdirAll(filepath.Dir(dst), 0o700)
	start := time.Now()
	if err := m.frozen(func() error { return m.layer.Checkpoint(dst) }); err != nil {
		return fmt.Errorf("checkpoint machine %s: %w", m.id, err)
	}
	// The copy keeps the layer's times; the checkpoint's own is now.
	now := time.Now()
	os.Chtimes(dst, now, now)
	m.d.record(m.id, "checkpoint", fmt.Sprintf("%s in %v", name, time.Since(start).Round(time.Microsecond)))
	return nil
}

// Restore stops every process in the machine, puts the checkpoint's
// layer back and starts the agent again.
func (m *machine) Restore(ctx context.Context, name string) error {
	if err := vmm.CheckName("checkpoint", name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	src := m.checkpointDir(name)
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("restore machine %s: checkpoint %s: %w", m.id, name, vmm.ErrNotFound)
	}
	m.restarting.Store(true)
	defer m.restarting.Store(false)
	err := m.stopAgent(ctx)
	if err == nil {
		err = m.layer.Restore(src)
	}
	if err == nil {
		err = m.boot(ctx)
	}
	if err != nil {
		// The machine cannot run as it was: it has stopped.
		m.d.record(m.id, "exit", "restore failed: "+err.Error())
		m.doneOnce.Do(func() { close(m.done) })
		return fmt.Errorf("restore machine %s to %s: %w", m.id, name, err)
	}
	m.d.record(m.id, "restore", fmt.Sprintf("%s; agent pid %d", name, m.agent().pid))
	return nil
}

// Checkpoints lists the machine's checkpoints, oldest first.
func (m *machine) Checkpoints(ctx context.Context) ([]vmm.Checkpoint, error) {
	ents, err := os.ReadDir(filepath.Join(m.dir, "checkpoints"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []vmm.Checkpoint
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, vmm.Checkpoint{Name: e.Name(), Taken: info.ModTime(), Size: vmm.DiskUsage(filepath.Join(m.dir, "checkpoints", e.Name()))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Taken.Before(out[j].Taken) })
	return out, nil
}

// DeleteCheckpoint removes a checkpoint.
func (m *machine) DeleteCheckpoint(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return vmm.RemoveCheckpoint(m.id, name, m.checkpointDir(name))
}

// Export writes the machine's root as it is now to dst: its layer is
// copied while it is paused, then merged with the image while it runs.
func (m *machine) Export(ctx context.Context, dst string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	tmp, err := os.MkdirTemp(m.dir, "export-")
	if err != nil {
		return err
	}
	os.Remove(tmp) // Checkpoint makes it
	defer os.RemoveAll(tmp)
	if err := m.frozen(func() error { return m.layer.Checkpoint(tmp) }); err != nil {
		return fmt.Errorf("export machine %s: %w", m.id, err)
	}
	if err := mergeLayers(m.spec.RootFS, tmp, dst); err != nil {
		return fmt.Errorf("export machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "export", dst)
	return nil
}

// Usage reports what the machine uses: CPU, memory and processes from its
// cgroups, disk from its writable layer (-1 when the layer has no limit:
// counting would mean walking it).
func (m *machine) Usage(ctx context.Context) (vmm.Usage, error) {
	u := m.cg.usage()
	var err error
	if m.layer != nil {
		u.Disk, u.DiskLimit, err = m.layer.Usage()
	}
	return u, err
}

// AttachWorkspace replaces the machine's workspace view with the one
// mounted at dir. The machine's agent cannot mount (its seccomp filter),
// so a short-lived agent process on the host does it from inside the
// machine's mount namespace.
func (m *machine) AttachWorkspace(ctx context.Context, dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	fd, err := detachedMount(dir, nil)
	if err != nil {
		return fmt.Errorf("attach workspace to machine %s: %w", m.id, err)
	}
	mnt := os.NewFile(uintptr(fd), "workspace")
	defer mnt.Close()
	cmd := exec.CommandContext(ctx, m.d.agent, "--attach-workspace", "/workspace/agents",
		"--target-pid", strconv.Itoa(m.agent().pid))
	cmd.ExtraFiles = []*os.File{mnt}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("attach workspace to machine %s: %w: %s", m.id, err, strings.TrimSpace(string(out)))
	}
	m.spec.Workspace = dir
	b, _ := json.Marshal(m.spec)
	if err := os.WriteFile(filepath.Join(m.dir, "spec.json"), b, 0o600); err != nil {
		return err
	}
	m.d.record(m.id, "attach-workspace", dir)
	return nil
}
