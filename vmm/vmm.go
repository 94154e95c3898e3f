package vmm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"hearth/internal/ids"
	"hearth/vmm/guest"
)

// KernelArgs start the kernel command line of every VM (package vmm/qemu
// and vmm/chv add the hearth.* keys the guest agent reads):
//   - console=ttyS0: the console is the serial port the driver logs;
//   - panic=-1: a panicking guest reboots at once, which the drivers run
//     with reboot off, so the VM stops instead of hanging;
//   - quiet: the boot messages are not printed (the serial port is slow,
//     under software emulation especially);
//   - cryptomgr.notests: the kernel does not self-test its crypto
//     algorithms at boot, a third of a second under TCG; the guest uses
//     no kernel crypto, and Debian's kernel is the tested build.
const KernelArgs = "console=ttyS0 panic=-1 quiet cryptomgr.notests"

// SetGuestClock puts a resumed VM's clock right: it stood still while the
// VM was paused, and nothing in the VM keeps time with the world. A VM
// driver's Resume calls it. An agent that cannot set the clock (an older
// one, or a machine whose clock is the host's) is left as it is; other
// failures are returned for the driver's audit log.
func SetGuestClock(ctx context.Context, gc *guest.Client) error {
	if gc == nil {
		return nil // not connected yet: the claim sets it
	}
	err := gc.SetClock(ctx, time.Now())
	if errors.Is(err, guest.ErrNotSupported) {
		return nil
	}
	return err
}

// Spec describes a machine to create.
type Spec struct {
	// ID names the machine: 1-63 lowercase letters, digits and '-'.
	ID string
	// RootFS is the image's root directory. The machine sees it read-only
	// under a writable layer of its own; the image never changes.
	RootFS string
	// Workspace is the host path of the session's mounted workspace view;
	// the machine sees it at /workspace/agents. Empty: none.
	Workspace string
	// Hostname inside the machine; default the ID.
	Hostname string
	// Limits; zero means none.
	CPUs   float64 // cores
	Memory int64   // bytes
	Pids   int64
	Disk   int64 // bytes the writable layer may hold
	// UID and GID run processes that ask for no user (the image's agent).
	UID, GID uint32
	// Layer is a writable layer a Forker of the same driver captured
	// (with the same Disk): the machine starts with a copy of it instead
	// of an empty one. Empty: an empty layer.
	Layer string
	// TakeLayer lets the machine take Layer itself (move it) instead of
	// copying it: the last of a capture's forks.
	TakeLayer bool
}

// Validate checks the spec.
func (s Spec) Validate() error {
	if err := ids.Check("machine id", s.ID); err != nil {
		return err
	}
	if s.RootFS == "" {
		return fmt.Errorf("machine %s: no root filesystem given", s.ID)
	}
	if s.CPUs < 0 || s.Memory < 0 || s.Pids < 0 || s.Disk < 0 {
		return fmt.Errorf("machine %s: limits must not be negative", s.ID)
	}
	return nil
}

// Capabilities say how a driver's machines differ in what the daemon
// must know of them. (Every driver pauses and isolates; what the tier
// isolates with is Driver.Name.)
type Capabilities struct {
	// HostIDOffset is added to a user or group id inside the machine to
	// get the id the host sees (in the workspace, on disk): machines with
	// a user namespace map their ids onto an unprivileged host range.
	HostIDOffset uint32
}

// IDRanger is a driver whose machines each run in a range of host ids of
// their own (so that one machine's processes cannot signal another's, nor
// a host user given the same range by /etc/subuid touch them).
// HostIDOffset is then the range the workspace stores owners in; a
// machine's workspace view shifts them onto the machine's range.
type IDRanger interface {
	// HostIDs reserves the range of machine id before it is created, or
	// returns the one it has: ids 0..size-1 inside are base..base+size-1
	// on the host. Destroying the machine frees it.
	HostIDs(id string) (base, size uint32, err error)
}

// Driver makes machines of one tier.
type Driver interface {
	// Name is the tier: "jail", "qemu", "chv".
	Name() string
	Capabilities() Capabilities
	// Create boots a machine and returns once its agent answers.
	Create(ctx context.Context, spec Spec) (Machine, error)
	// Recover re-attaches to a machine still running after the daemon
	// restarted. It returns ErrNotFound when the machine is gone (and
	// cleans up what it left).
	Recover(ctx context.Context, id string) (Machine, error)
	// List returns the ids of machines this driver has running.
	List(ctx context.Context) ([]string, error)
}

// Machine is one running machine.
type Machine interface {
	ID() string
	// Guest is the client of the machine's agent: exec, files, ports.
	Guest() *guest.Client
	// Pause freezes every process; Resume thaws them. Both are idempotent.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Destroy kills everything in the machine and removes everything it
	// made. Idempotent.
	Destroy(ctx context.Context) error
	// Done is closed once the machine has stopped, for whatever reason.
	Done() <-chan struct{}
}

// Errors drivers return.
var (
	ErrNotFound = errors.New("machine not found")
	ErrExists   = errors.New("machine already exists")
)

// Event is one step in a machine's life, for the audit trail.
type Event struct {
	Time    time.Time `json:"time"`
	Machine string    `json:"machine"`
	Kind    string    `json:"kind"` // create, start, pause, resume, recover, destroy, exit
	Detail  string    `json:"detail,omitempty"`
}

// Checkpointer is a machine whose writable layer can be saved and put
// back. Names follow the rules of machine ids.
type Checkpointer interface {
	// Checkpoint saves the writable layer as name, pausing the machine
	// while it copies. It fails with ErrExists if name is taken.
	Checkpoint(ctx context.Context, name string) error
	// Restore puts checkpoint name back: every process in the machine
	// ends and its agent starts again, so Guest returns a new client.
	// It fails with ErrNotFound if there is no such checkpoint.
	Restore(ctx context.Context, name string) error
	// Checkpoints lists the saved checkpoints, oldest first.
	Checkpoints(ctx context.Context) ([]Checkpoint, error)
	// DeleteCheckpoint removes one; ErrNotFound if there is none.
	DeleteCheckpoint(ctx context.Context, name string) error
}

// Checkpoint describes a saved writable layer.
type Checkpoint struct {
	Name  string    `json:"name"`
	Taken time.Time `json:"taken"`
	Size  int64     `json:"size"` // bytes on disk
}

// Exporter is a machine that can write out its root filesystem as it is
// now (the image with the writable layer applied), for a new image.
type Exporter interface {
	// Export writes the root to dst, which must not exist. The machine
	// is paused only while its writable layer is copied.
	Export(ctx context.Context, dst string) error
}

// CheckName checks the name of a machine, checkpoint or other thing a
// driver keeps on disk (the rule of package ids).
func CheckName(what, name string) error { return ids.Check(what+" name", name) }

// UsageReporter is a machine that can say what it uses, as the host
// measures it.
type UsageReporter interface {
	Usage(ctx context.Context) (Usage, error)
}

// Usage is what a machine uses now. Limits of 0 mean none.
type Usage struct {
	CPUTime     time.Duration `json:"cpu_time"` // since it started
	Memory      int64         `json:"memory"`   // bytes charged now
	MemoryLimit int64         `json:"memory_limit,omitempty"`
	Processes   int64         `json:"processes"`
	Disk        int64         `json:"disk"` // bytes in the writable layer; -1 if unknown
	DiskLimit   int64         `json:"disk_limit,omitempty"`
}

// WorkspaceRecoverer is a driver that puts a new workspace view in place
// while it recovers a machine, before the machine runs again: a driver
// that must resume a paused VM for a moment to reach its agent would
// otherwise let it write into the dead view of the last daemon (bytes
// lost across a restart, issue 19).
type WorkspaceRecoverer interface {
	// RecoverWithWorkspace is Recover with dir (a workspace view on the
	// host) at /workspace/agents in the machine before anything in it
	// runs. ErrNoWorkspace: the machine has no workspace device, and
	// nothing was done.
	RecoverWithWorkspace(ctx context.Context, id, dir string) (Machine, error)
}

// ErrNoWorkspace means a machine was made without a workspace device.
var ErrNoWorkspace = errors.New("the machine was created without a workspace device")

// WorkspaceAttacher is a machine whose workspace view can be replaced
// while it runs. A view is served by the daemon; after the daemon
// restarts, its machines' old views are dead and new ones must take their
// place.
type WorkspaceAttacher interface {
	// AttachWorkspace mounts dir (a workspace view on the host) at
	// /workspace/agents in the machine, replacing what was there.
	AttachWorkspace(ctx context.Context, dir string) error
}
