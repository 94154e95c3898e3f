package qemu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"hearth/vmm"
	"hearth/vmm/share"
)

// Warm machines. A machine's boot does not depend on its session until
// its agent is about to drop its privileges: the image, the memory, the
// CPUs, the writable disk's size and whether it has a workspace share
// are fixed when QEMU starts; the hostname, the default user and the
// workspace view are not (the agent waits for them in a claim, see
// guest.Claim, and the view is mounted into the share on the host). So
// the driver boots machines ahead of time, in spares/<id>/, for the
// shapes sessions were last created with, and Create takes one of the
// right shape: it moves the directory to machines/<id>, mounts the view,
// and sends the claim, instead of waiting for a boot. A spare still
// booting is waited for, a shorter wait than a boot of its own.
//
// Config.Warm spares are kept for each of the warmShapes shapes last
// created; a spare of an older shape is shut down. Spares are not
// machines: List and Recover do not see them, Close shuts them down, and
// New removes any a daemon that died left behind.

// warmShapes is how many shapes spares are kept for.
const warmShapes = 4

// shape is what a machine's boot depends on.
type shape struct {
	rootFS    string // the spec's, for the machine's spec
	disk      string // the root disk
	diskID    string // its inode, size and time: a rebuilt image is another shape
	memory    int64  // bytes
	cpus      int
	size      int64 // writable disk, bytes
	workspace bool
}

// shapeOf returns the shape a machine of spec with root disk disk boots
// with; ok is false for a root packed for the machine alone.
func (d *Driver) shapeOf(spec vmm.Spec, disk string) (shape, bool) {
	var st syscall.Stat_t
	if disk == "" || syscall.Stat(disk, &st) != nil {
		return shape{}, false
	}
	s := shape{rootFS: spec.RootFS, disk: disk, memory: spec.Memory, cpus: max(1, int(math.Ceil(spec.CPUs))),
		size: spec.Disk, workspace: spec.Workspace != "",
		diskID: fmt.Sprintf("%d:%d:%d:%d.%d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec)}
	if s.memory == 0 {
		s.memory = 512 << 20
	}
	if s.size == 0 {
		s.size = d.cfg.DiskSize
	}
	return s, true
}

// sparePool is the driver's pool of warm machines.
type sparePool = vmm.Spares[shape, *machine]

func newWarmPool(d *Driver) *sparePool {
	d.cleanSpares()
	return vmm.NewSpares(d.cfg.Warm, warmShapes, d.bootTimed, (*machine).destroySpare)
}

// bootTimed boots a spare of shape s and says how it went in the audit
// log.
func (d *Driver) bootTimed(ctx context.Context, s shape) (*machine, error) {
	start := time.Now()
	m, err := d.bootSpare(ctx, s)
	if err != nil {
		d.record("spare", "destroy", "a spare did not boot: "+err.Error())
		return nil, err
	}
	d.record(m.id, "spare", fmt.Sprintf("booted in %v (accel %s)", time.Since(start).Round(time.Millisecond), m.accel))
	return m, nil
}

// cleanSpares shuts down spares a driver that died left in spares/.
func (d *Driver) cleanSpares() {
	dir := filepath.Join(d.cfg.Dir, "spares")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		d.reap(filepath.Join(dir, e.Name()), "left by an earlier driver")
	}
}

// reap kills the QEMU and virtiofsd of the machine directory dir by their
// pid files, with no agent connection or QMP needed, and removes dir.
func (d *Driver) reap(dir, why string) {
	m := newMachine(d, vmm.Spec{ID: filepath.Base(dir)}, dir)
	if pid := readPID(m.path(qemuPID)); m.isOurQEMU(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		for syscall.Kill(pid, 0) == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	m.destroySpare(why)
}

// bootSpare boots a machine of shape s in spares/ and returns it once its
// agent waits for its claim.
func (d *Driver) bootSpare(ctx context.Context, s shape) (*machine, error) {
	id := "spare-" + randomHex(6)
	dir := filepath.Join(d.cfg.Dir, "spares", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if s.workspace {
		if err := share.Prepare(filepath.Join(dir, shareDir)); err != nil {
			removeMachineDir(dir)
			return nil, err
		}
	}
	spec := vmm.Spec{ID: id, RootFS: s.rootFS, Memory: s.memory, CPUs: float64(s.cpus), Disk: s.size}
	m, err := d.start(ctx, spec, dir, s.disk, s.workspace, false)
	if err == nil {
		// Paused, it takes no CPU while it waits (an idle guest under TCG
		// takes a tenth of one); the claim sets its clock.
		err = m.Pause(ctx)
	}
	if err != nil {
		if m != nil {
			m.destroySpare("did not boot")
		}
		removeMachineDir(dir)
		return nil, err
	}
	return m, nil
}

// claimSpare gives the session of spec a spare of shape s, moved to dir
// (made empty by Create to hold the id). It returns nil, nil, with dir
// empty again, if there is no spare or the one there fails: Create boots
// one instead.
func (d *Driver) claimSpare(ctx context.Context, s shape, spec vmm.Spec, dir string) (*machine, error) {
	m, err := d.takeSpare(ctx, s, spec, dir)
	if err == nil || ctx.Err() != nil {
		return m, err
	}
	d.record(spec.ID, "start", "the warm machine failed, booting one: "+err.Error())
	if err := removeMachineDir(dir); err != nil {
		return nil, err
	}
	return nil, os.Mkdir(dir, 0o700)
}

func (d *Driver) takeSpare(ctx context.Context, s shape, spec vmm.Spec, dir string) (*machine, error) {
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
	old := sp.M
	// The directory moves; QEMU's and virtiofsd's sockets and open files
	// move with it (bootDirFile still names where they were started).
	// (os.Rename refuses an existing directory as the target: rename(2)
	// replaces the empty one.)
	if err := syscall.Rename(old.dir, dir); err != nil {
		old.destroySpare("could not be moved: " + err.Error())
		return nil, fmt.Errorf("move the warm machine: %w", err)
	}
	m := newMachine(d, spec, dir)
	m.accel, m.shared = old.accel, old.shared
	m.fsd, m.fsdExited = old.fsd, old.fsdExited
	p := old.proc.Swap(nil) // the old one's watcher now ignores QEMU's end
	m.proc.Store(p)
	go m.watch(p)
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(m.path("spec.json"), b, 0o600); err != nil {
		m.kill()
		return nil, err
	}
	if spec.Workspace != "" {
		if err := share.Replace(m.path(shareDir), spec.Workspace); err != nil {
			m.kill()
			return nil, err
		}
	}
	bctx, cancel := context.WithTimeout(ctx, d.cfg.BootTimeout)
	defer cancel()
	if err := m.Resume(bctx); err != nil {
		m.kill()
		return nil, err
	}
	if err := m.claim(bctx); err != nil {
		m.kill()
		return nil, err
	}
	d.record(spec.ID, "start", fmt.Sprintf("took warm machine %s (accel %s)", old.id, m.accel))
	return m, nil
}

// destroySpare shuts down a spare and removes its directory.
func (m *machine) destroySpare(why string) {
	m.destroying.Store(true)
	m.kill()
	removeMachineDir(m.dir)
	m.d.record(m.id, "destroy", why)
}

// Warm boots spares for machines of spec's shape (with Config.Warm set)
// and returns once one is ready, so the next Create of that shape takes
// it. Benchmarks use it to time a warm Create.
func (d *Driver) Warm(ctx context.Context, spec vmm.Spec) error {
	if d.warm == nil {
		return errors.New("qemu driver: warm machines are off (Config.Warm is 0)")
	}
	spec.ID = "warm"
	if err := spec.Validate(); err != nil {
		return err
	}
	disk, err := rootDisk(spec.RootFS)
	if err != nil {
		return err
	}
	s, ok := d.shapeOf(spec, disk)
	if !ok {
		return fmt.Errorf("qemu driver: %s has no ext4 image beside it, so its machines cannot be booted ahead of time", spec.RootFS)
	}
	d.warm.Used(s)
	if err := d.warm.WaitReady(ctx, s); err != nil {
		return fmt.Errorf("qemu driver: %w: see the audit log", err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
