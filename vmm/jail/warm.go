package jail

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"hearth/vmm"

	"golang.org/x/sys/unix"
)

// Prepared jails. Most of a jail's start does not depend on the sandbox
// that will use it: the namespaces, the writable layer (a loop-mounted
// image when the disk is limited), the cgroups, the host id range, the
// root assembled and pivoted into, loopback up, and the agent locked
// down (no_new_privs, capabilities dropped, seccomp filter on). What
// does is sent in a claim (default user, and the hostname for
// /etc/hosts) or set from the host at claim (cgroup limits, the
// hostname through the jail's UTS namespace). So the driver prepares
// jails ahead of time in spares/<id>/, for the shapes (image root, disk limit) machines
// were last created with, as vmm/qemu's warm.go does with VMs, and
// Create claims one of the right shape: it sets the limits, moves the
// directory to machines/<id> and the id range's record to the machine's
// id, sends the claim and connects. The claimed jail is replaced in the
// background.
//
// A prepared jail is only ever claimed once and never goes back to the
// pool, so nothing of one sandbox can reach another; its id range and
// cgroup were made for it alone (its cgroup keeps the spare's name,
// recorded in the machine's "cgroup" file, since cgroup v2 cannot rename
// one). Machines with a workspace are not claimed from the pool: the
// appliance reserves their id range before Create, to shift the view's
// owners onto it.
//
// Spares are not machines: List and Recover do not see them, Close
// destroys them, and New removes any a driver that died left behind (their
// agents end by themselves when the daemon's end of the control socket
// closes).

// warmShapes is how many shapes spares are kept for.
const warmShapes = 4

// spareTimeout bounds the preparation of one spare.
const spareTimeout = 30 * time.Second

// shape is what a prepared jail depends on.
type shape struct {
	rootFS string
	rootID string // the root directory's device, inode and time: a rebuilt image is another shape
	disk   int64
}

// shapeOf returns the shape of spec; ok is false for a spec no spare can
// serve: one with a workspace view (mounted on the machine's own id
// range before Create) or a writable layer of its own (a fork's copy).
func shapeOf(spec vmm.Spec) (shape, bool) {
	var st syscall.Stat_t
	if spec.Workspace != "" || spec.Layer != "" || syscall.Stat(spec.RootFS, &st) != nil {
		return shape{}, false
	}
	return shape{rootFS: spec.RootFS, disk: spec.Disk,
		rootID: fmt.Sprintf("%d:%d:%d.%d", st.Dev, st.Ino, st.Mtim.Sec, st.Mtim.Nsec)}, true
}

// prepared is a jail prepared ahead of time: its machine, and the socket
// its agent waits for its claim on.
type prepared struct {
	m    *machine
	ctrl *os.File
}

// sparePool is the driver's pool of prepared jails.
type sparePool = vmm.Spares[shape, *prepared]

// SetWarm keeps n jails prepared ahead of time for each of the last few
// shapes of machine created (0: none, the default). Call it once, before
// creating machines.
func (d *Driver) SetWarm(n int) {
	if n <= 0 || d.warm != nil {
		return
	}
	d.warm = vmm.NewSpares(n, warmShapes, d.prepareTimed, (*prepared).destroy)
	d.warm.SetSettle(spareSettle)
}

// spareSettle is how long a replacement jail waits before it is
// prepared: the sandbox that took the last one does its first exec
// meanwhile. Preparing one takes both cores of a small host for a few
// milliseconds, which made that exec (create to first answer: 7 ms)
// and the one after (4.2 ms against 2.3) slower.
const spareSettle = 30 * time.Millisecond

func (d *Driver) sparesDir() string { return filepath.Join(d.dir, "spares") }

// Warm prepares spares for machines of spec's shape and returns once one
// is ready, so the next Create of that shape claims it.
func (d *Driver) Warm(ctx context.Context, spec vmm.Spec) error {
	if d.warm == nil {
		return errors.New("jail driver: prepared jails are off (SetWarm)")
	}
	spec.ID = "warm"
	if err := spec.Validate(); err != nil {
		return err
	}
	s, ok := shapeOf(spec)
	if !ok {
		return fmt.Errorf("jail driver: machines with a workspace or without a root (%s) are not prepared ahead of time", spec.RootFS)
	}
	d.warm.Used(s)
	if err := d.warm.WaitReady(ctx, s); err != nil {
		return fmt.Errorf("jail driver: %w: see the audit log", err)
	}
	return nil
}

// prepareTimed prepares a spare of shape s within spareTimeout, and
// says how it went in the audit log.
func (d *Driver) prepareTimed(ctx context.Context, s shape) (*prepared, error) {
	ctx, cancel := context.WithTimeout(ctx, spareTimeout)
	defer cancel()
	start := time.Now()
	m, ctrl, err := d.prepareSpare(ctx, s)
	if err != nil {
		d.record("spare", "destroy", "a spare was not prepared: "+err.Error())
		return nil, err
	}
	d.record(m.id, "spare", fmt.Sprintf("prepared in %v", time.Since(start).Round(time.Microsecond)))
	return &prepared{m: m, ctrl: ctrl}, nil
}

// destroy ends a spare's agent and removes what it was made of.
func (sp *prepared) destroy(why string) {
	sp.ctrl.Close() // the agent, waiting for its claim, ends with it too
	if err := sp.m.Destroy(context.Background()); err != nil {
		sp.m.d.record(sp.m.id, "destroy", fmt.Sprintf("spare (%s): %v", why, err))
	}
}

// prepareSpare makes a jail of shape s in spares/ and returns it once its
// agent waits for its claim, with the socket the claim goes on.
func (d *Driver) prepareSpare(ctx context.Context, s shape) (*machine, *os.File, error) {
	id := "spare-" + randomHex(6)
	dir := filepath.Join(d.sparesDir(), id)
	spec := vmm.Spec{ID: id, RootFS: s.rootFS, Disk: s.disk}
	l, cg, err := d.makeSpareParts(dir, spec)
	if err != nil {
		return nil, nil, err
	}
	m := newMachine(d, spec, dir, cg, l)
	if err := writeRecords(dir, spec, id); err != nil {
		m.Destroy(context.Background())
		return nil, nil, err
	}
	p, ctrl, err := m.spawnAgent(true)
	if err == nil {
		m.cur.Store(p)
		err = awaitReady(ctx, ctrl, p)
	}
	if err == nil {
		// Connected now, the claim has no connection to make, and one
		// health check sets the session up on both sides and leaves
		// the connection the sandbox's first request takes: the agent
		// serves its host before its claim (nothing but health checks
		// until then).
		err = m.dial()
	}
	if err == nil {
		_, err = m.gc.Load().Health(ctx)
	}
	if err != nil {
		if ctrl != nil {
			ctrl.Close()
		}
		m.Destroy(context.Background())
		return nil, nil, err
	}
	return m, ctrl, nil
}

// makeSpareParts makes a spare's directory, writable layer and cgroup
// or nothing.
func (d *Driver) makeSpareParts(dir string, spec vmm.Spec) (*layer, *cgroup, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	l, err := newLayer(dir, spec.Disk, d.templates())
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	cg, err := newCgroup(d.cgroups, spec.ID)
	if err != nil {
		l.Remove()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return l, cg, nil
}

// awaitReady waits for the agent's byte saying its root is ready.
func awaitReady(ctx context.Context, ctrl *os.File, p *agentProc) error {
	got := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := ctrl.Read(b)
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			return fmt.Errorf("prepared agent did not get ready: %w", err)
		}
		return nil
	case <-ctx.Done():
		ctrl.SetReadDeadline(time.Now()) // ends the read
		<-got
		return ctx.Err()
	}
}

// claimSpare gives machine spec a spare of its shape, moved to dir
// (which does not exist). It returns nil, nil, with dir left as it was,
// if there is none or the one there fails: Create starts a jail
// instead. Another machine of that id made meanwhile is vmm.ErrExists.
func (d *Driver) claimSpare(ctx context.Context, spec vmm.Spec, dir string) (*machine, error) {
	s, ok := shapeOf(spec)
	if !ok || d.warm == nil {
		return nil, nil
	}
	defer d.warm.Used(s)
	if _, reserved := d.readIDs(spec.ID); reserved {
		return nil, nil // ids reserved for a workspace view: see above
	}
	sp := d.warm.Take(s)
	if sp == nil {
		return nil, nil
	}
	select {
	case <-sp.Ready():
	case <-ctx.Done():
		d.warm.Discard(sp, "the create it was waited for was cancelled")
		return nil, ctx.Err()
	}
	if sp.Err != nil {
		return nil, nil
	}
	m, err := d.takeSpare(ctx, sp.M, spec, dir)
	if err == nil || ctx.Err() != nil || errors.Is(err, vmm.ErrExists) {
		return m, err
	}
	// takeSpare undid what it did: the machine it made is destroyed,
	// its directory with it.
	d.record(spec.ID, "start", "the prepared jail failed, starting one: "+err.Error())
	return nil, nil
}

// takeSpare turns spare sp into machine spec. Its limits come first:
// the agent serves once claimed, and what it starts then (its threads
// count against the pids limit) must be inside them. Then the claim
// goes to the agent, so that it takes it (its /etc/hosts, its listener)
// while the host moves the spare to the machine: hostname on the side,
// id range, records and directory here. Nothing runs in the machine
// before Create returns, so none of these has to come before the claim;
// its answer is awaited last.
func (d *Driver) takeSpare(ctx context.Context, sp *prepared, spec vmm.Spec, dir string) (*machine, error) {
	old := sp.m
	p := old.agent()
	if err := old.cg.limit(spec.Memory, spec.CPUs, spec.Pids); err != nil {
		sp.destroy("its limits could not be set")
		return nil, err
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	if err := sendClaim(sp.ctrl, p, jailClaim{Hostname: hostname, UID: spec.UID, GID: spec.GID}); err != nil {
		sp.destroy("its claim could not be sent")
		return nil, err
	}
	side := make(chan error, 1)
	go func() { side <- setHostname(p.pid, hostname) }()
	if err := d.moveIDs(old.id, spec.ID); err != nil {
		<-side
		sp.destroy("its ids could not be moved")
		return nil, err
	}
	// The spec is written over the spare's own, in its directory, and
	// rename(2) moves it with the directory, the agent's socket and the
	// layer's mount, to dir, which must not exist.
	err := writeSpec(old.dir, spec)
	if err == nil {
		err = unix.Renameat2(unix.AT_FDCWD, old.dir, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			err = vmm.ErrExists
		}
		if err != nil {
			err = fmt.Errorf("move the prepared jail: %w", err)
		}
	}
	if err != nil {
		<-side
		d.moveIDs(spec.ID, old.id)
		sp.destroy("it could not be moved")
		return nil, err
	}
	m := newMachine(d, spec, dir, old.cg, old.layer.movedTo(dir))
	m.cur.Store(p)
	m.gc.Store(old.gc.Load())
	p.owner.Store(m)
	err = <-side
	if err == nil {
		err = m.awaitClaimed(ctx, sp.ctrl)
	}
	if err != nil {
		sp.ctrl.Close()
		m.Destroy(context.Background())
		return nil, err
	}
	d.record(spec.ID, "start", fmt.Sprintf("claimed prepared jail %s (agent pid %d)", old.id, p.pid))
	return m, nil
}

// writeRecords writes, in a spare's directory dir, what Recover reads of
// it once claimed: its spec (the spare's own until then, rewritten by
// the claim with writeSpec) and its cgroup's name (the spare's, for
// good). Made while the spare is prepared, the claim makes no file.
func writeRecords(dir string, spec vmm.Spec, cgroupName string) error {
	if err := writeSpec(dir, spec); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, cgroupFile), []byte(cgroupName), 0o600)
}

// writeSpec writes a machine's spec in its directory dir.
func writeSpec(dir string, spec vmm.Spec) error {
	b, _ := json.Marshal(spec)
	return os.WriteFile(filepath.Join(dir, "spec.json"), b, 0o600)
}

// sendClaim sends the waiting agent p its claim.
func sendClaim(ctrl *os.File, p *agentProc, c jailClaim) error {
	select {
	case <-p.exited:
		return errors.New("the prepared agent has ended")
	default:
	}
	b, _ := json.Marshal(c)
	if _, err := ctrl.Write(b); err != nil {
		return fmt.Errorf("send the claim: %w", err)
	}
	return nil
}

// awaitClaimed waits for the agent's answer to its claim, and connects
// if the spare was not connected already.
func (m *machine) awaitClaimed(ctx context.Context, ctrl *os.File) error {
	defer ctrl.Close()
	// The agent answers the claim once it has taken it and serves: that
	// answer, not a health request over the session, says it is ready,
	// one round trip through the agent fewer before the first exec.
	if err := claimAnswer(ctx, ctrl); err != nil {
		return err
	}
	if m.gc.Load() != nil {
		return nil // connected while the spare was prepared
	}
	return m.dial()
}

// claimAnswer reads the agent's byte saying it took its claim, within
// 10 s or ctx. An agent that ended first closed the socket: EOF.
func claimAnswer(ctx context.Context, ctrl *os.File) error {
	ctrl.SetReadDeadline(time.Now().Add(10 * time.Second))
	stop := context.AfterFunc(ctx, func() { ctrl.SetReadDeadline(time.Now()) })
	defer stop()
	b := make([]byte, 1)
	if _, err := ctrl.Read(b); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("the prepared agent did not take its claim: %w", err)
	}
	return nil
}

// setHostname sets the hostname of the jail whose agent is pid, from a
// thread of the driver's that joins its UTS namespace: the prepared
// agent has dropped the capability to (see its lockDown). The thread is
// never unlocked, so Go ends it rather than reuse it outside.
func setHostname(pid int, name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/uts", pid))
		if err != nil {
			errc <- fmt.Errorf("set the hostname: %w", err)
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWUTS); err != nil {
			errc <- fmt.Errorf("set the hostname: join the jail's namespace: %w", err)
			return
		}
		if err := unix.Sethostname([]byte(name)); err != nil {
			errc <- fmt.Errorf("set the hostname %q: %w", name, err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// cgroupFile, in a machine's directory, names its cgroup when that is not
// the machine's id (a claimed spare's).
const cgroupFile = "cgroup"

// cgroupName is the name of machine dir's cgroup.
func cgroupName(dir, id string) string {
	b, err := os.ReadFile(filepath.Join(dir, cgroupFile))
	if name := strings.TrimSpace(string(b)); err == nil && vmm.CheckName("cgroup", name) == nil {
		return name
	}
	return id
}

// moveIDs gives machine to the id range reserved for from.
func (d *Driver) moveIDs(from, to string) error {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	b, ok := d.readIDs(from)
	if !ok {
		return fmt.Errorf("host ids of %s: none reserved", from)
	}
	unlock, err := lockClaims()
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Lstat(d.idFile(to)); err == nil {
		return fmt.Errorf("host ids of machine %s: %w", to, vmm.ErrExists)
	}
	if err := os.Rename(d.idFile(from), d.idFile(to)); err != nil {
		return fmt.Errorf("host ids of machine %s: %w", to, err)
	}
	rec, err := filepath.Abs(d.idFile(to))
	if err == nil {
		err = os.WriteFile(claimFile(b), []byte(rec), 0o600)
	}
	if err != nil {
		return fmt.Errorf("host ids of machine %s: %w", to, err)
	}
	return nil
}

// cleanSpares removes the spares a driver that died left in spares/:
// their agents (ended by now, or ending, as their control socket closed
// with that daemon; killed if not), layers, cgroups and id ranges.
func (d *Driver) cleanSpares() {
	ents, _ := os.ReadDir(d.sparesDir())
	for _, e := range ents {
		id := e.Name()
		dir := filepath.Join(d.sparesDir(), id)
		b, _ := os.ReadFile(filepath.Join(dir, "pid"))
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); d.isAgent(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
			for deadline := time.Now().Add(5 * time.Second); syscall.Kill(pid, 0) == nil && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
		}
		l, _ := openLayer(dir)
		m := newMachine(d, vmm.Spec{ID: id}, dir, nil, l)
		if cg, err := newCgroup(d.cgroups, id); err == nil {
			m.cg = cg
		}
		m.cleanupSpare()
		d.record(id, "destroy", "spare left by an earlier driver")
	}
}

// cleanupSpare is cleanup for a spare found after a restart, whose
// cgroup may be missing.
func (m *machine) cleanupSpare() {
	if m.cg != nil {
		m.cg.remove()
	}
	if m.layer != nil {
		m.layer.Remove()
	} else {
		unmountLayer(filepath.Join(m.dir, layerMount))
	}
	os.RemoveAll(m.dir)
	m.d.releaseIDs(m.id)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
