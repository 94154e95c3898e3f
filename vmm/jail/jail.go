// Package jail is the machine tier every Linux host can run: the agent
// runs as PID 1 of fresh user, mount, PID, network (loopback only), IPC
// and UTS namespaces (root inside is an unprivileged id outside, each
// machine in a range of host ids of its own: ids.go), in an
// overlay of the image's root with a writable layer of its own (size
// limited if asked), the session's workspace view bind-mounted at
// /workspace/agents, limited by cgroups (v1 or v2), and its processes run
// as the image's unprivileged user with no_new_privs and a seccomp
// filter. Only the appliance imports it.
package jail

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"hearth/vmm"
)

// Driver makes jails. Its state lives under its directory: one directory
// per machine (machines/<id>: spec.json, rw/ the writable layer,
// checkpoints/, agent.sock, agent.log, pid), the layer templates, and the
// audit log.
type Driver struct {
	dir     string
	agent   string // path of the hearth-guest binary on the host
	cgroups string // parent of the machines' cgroups: hearth/jail-<hash of dir>

	audit *vmm.AuditLog // <dir>/audit.jsonl: every lifecycle step, appended

	ids  IDPool     // where machines' host ids come from; see ids.go
	idMu sync.Mutex // serialises reserving ranges

	warm *sparePool // jails prepared ahead of time (warm.go); nil: none
}

var _ vmm.Driver = (*Driver)(nil)

// New returns a driver keeping state in dir and starting agent (the
// hearth-guest binary) as each machine's PID 1, its machines' host ids
// taken from DefaultIDPool.
func New(dir, agent string) (*Driver, error) { return NewWithIDs(dir, agent, DefaultIDPool) }

// NewWithIDs is New with the machines' host ids taken from pool, which
// no /etc/subuid or /etc/subgid line may overlap (ErrIDPool).
func NewWithIDs(dir, agent string, pool IDPool) (*Driver, error) {
	if err := pool.Check(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("jail driver: needs root (namespaces, mounts and cgroups)")
	}
	if _, err := os.Stat(agent); err != nil {
		return nil, fmt.Errorf("jail driver: agent binary: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "machines"), 0o700); err != nil {
		return nil, err
	}
	audit, err := vmm.OpenAuditLog(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		return nil, err
	}
	// Machines of drivers with different state (tests, a second
	// appliance) never share a cgroup, even under the same id.
	sum := sha256.Sum256([]byte(dir))
	cgroups := "hearth/jail-" + hex.EncodeToString(sum[:4])
	d := &Driver{dir: dir, agent: agent, cgroups: cgroups, audit: audit, ids: pool}
	d.cleanSpares()
	d.pruneIDs()
	return d, nil
}

func (d *Driver) Name() string { return "jail" }

func (d *Driver) Capabilities() vmm.Capabilities {
	return vmm.Capabilities{HostIDOffset: d.ids.Base}
}

// OnEvent sets a function told of every lifecycle event (after it is in
// the audit log). Set it before creating machines.
func (d *Driver) OnEvent(fn func(vmm.Event)) { d.audit.OnEvent(fn) }

// record appends a lifecycle event to the audit log.
func (d *Driver) record(id, kind, detail string) { d.audit.Record(id, kind, detail) }

// Close closes the audit log. Machines keep running; a new Driver over
// the same directory recovers them. The driver's parent cgroups go if no
// machine is left in them.
func (d *Driver) Close() error {
	if d.warm != nil {
		d.warm.Close()
	}
	removeCgroupParent(d.cgroups)
	return d.audit.Close()
}

func (d *Driver) machineDir(id string) string { return filepath.Join(d.dir, "machines", id) }

func (d *Driver) templates() string { return filepath.Join(d.dir, "layer-templates") }

// Create starts a machine and returns once its agent answers.
func (d *Driver) Create(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	dir := d.machineDir(spec.ID)
	exists := fmt.Errorf("create machine %s: %w", spec.ID, vmm.ErrExists)
	if _, err := os.Lstat(dir); err == nil {
		return nil, exists
	}
	d.record(spec.ID, "create", fmt.Sprintf("rootfs=%s workspace=%s memory=%d cpus=%g pids=%d disk=%d",
		spec.RootFS, spec.Workspace, spec.Memory, spec.CPUs, spec.Pids, spec.Disk))
	// A claimed spare's directory is renamed to dir, which must not
	// exist (the rename fails if it does): no directory is made and
	// removed again, each of which costs a claim more than its other
	// steps together on some hosts' ext4 (0.35-0.6 ms an inode).
	if m, err := d.claimSpare(ctx, spec, dir); m != nil || err != nil {
		if err != nil {
			return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
		}
		return m, nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return nil, exists
		}
		return nil, err
	}
	start := time.Now()
	m, err := d.start(ctx, spec, dir)
	if err != nil {
		os.RemoveAll(dir)
		d.releaseIDs(spec.ID)
		d.record(spec.ID, "destroy", "start failed: "+err.Error())
		return nil, fmt.Errorf("create machine %s: %w", spec.ID, err)
	}
	d.record(spec.ID, "start", fmt.Sprintf("agent pid %d answered after %v", m.agent().pid, time.Since(start).Round(time.Microsecond)))
	return m, nil
}

func (d *Driver) start(ctx context.Context, spec vmm.Spec, dir string) (*machine, error) {
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "spec.json"), b, 0o600); err != nil {
		return nil, err
	}
	l, err := d.makeLayer(dir, spec)
	if err != nil {
		return nil, err
	}
	cg, err := newCgroup(d.cgroups, spec.ID)
	if err == nil {
		if err = cg.limit(spec.Memory, spec.CPUs, spec.Pids); err != nil {
			cg.remove()
		}
	}
	if err != nil {
		l.Remove()
		return nil, err
	}
	m := newMachine(d, spec, dir, cg, l)
	if err := m.boot(ctx); err != nil {
		m.Destroy(context.Background())
		return nil, err
	}
	return m, nil
}

// Recover re-attaches to a machine left running by a daemon that stopped.
// A machine whose agent is gone is cleaned up and reported ErrNotFound.
func (d *Driver) Recover(ctx context.Context, id string) (vmm.Machine, error) {
	dir := d.machineDir(id)
	b, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		return nil, fmt.Errorf("recover machine %s: %w", id, vmm.ErrNotFound)
	}
	var spec vmm.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("recover machine %s: %s: %w", id, filepath.Join(dir, "spec.json"), err)
	}
	cg, err := newCgroup(d.cgroups, cgroupName(dir, id))
	if err != nil {
		return nil, err
	}
	l, lerr := openLayer(dir)
	m := newMachine(d, spec, dir, cg, l)
	b, _ = os.ReadFile(filepath.Join(dir, "pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if !d.isAgent(pid) || lerr != nil {
		m.cleanup()
		d.record(id, "destroy", fmt.Sprintf("found dead after a daemon restart (layer: %v); cleaned up", lerr))
		return nil, fmt.Errorf("recover machine %s: its agent is gone: %w", id, vmm.ErrNotFound)
	}
	m.adopt(pid)
	// A paused machine's agent cannot answer: thaw it to connect, then
	// leave it paused as it was. Only the agent, where the host can: the
	// machine's other processes would find its workspace view gone until
	// the daemon attaches a new one, and their writes there would fail.
	paused := m.paused.Load()
	var refreeze func() error
	if paused {
		var one bool
		if refreeze, one, err = cg.thawOne(pid); !one {
			cg.freeze(false)
			refreeze = func() error { return cg.freeze(true) }
		}
	}
	if err == nil {
		err = m.connect(ctx)
	}
	if paused && refreeze != nil {
		if rerr := refreeze(); err == nil {
			err = rerr
		}
	}
	if err != nil {
		m.Destroy(context.Background())
		return nil, fmt.Errorf("recover machine %s: %w", id, err)
	}
	d.record(id, "recover", fmt.Sprintf("re-attached to agent pid %d (paused: %v)", pid, paused))
	return m, nil
}

// isAgent reports whether pid is still this driver's agent.
func (d *Driver) isAgent(pid int) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return pid > 0 && err == nil && strings.TrimSuffix(exe, " (deleted)") == d.agent
}

// List returns the machines with state on disk.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	return vmm.MachineDirs(filepath.Join(d.dir, "machines"))
}
