package chv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"hearth/internal/atomicfile"
	"hearth/vmm"
	"hearth/vmm/chv/api"
	"hearth/vmm/guest"
	"hearth/vmm/share"
)

// AgentPort is the vsock port the guest agent listens on.
const AgentPort = 1024

// Files in a machine's directory.
const (
	apiSock     = "api.sock"
	vsockSock   = "vsock.sock"
	fsSock      = "virtiofs.sock"
	rwDisk      = "rw.ext4"
	serialLog   = "serial.log"
	vmmLog      = "cloud-hypervisor.log"
	vmmOut      = "cloud-hypervisor.out"
	fsLog       = "virtiofsd.log"
	stateFile   = "state.json"
	workspaceID = "workspace" // the virtio-fs device id and tag
	shareDir    = "share"     // what virtiofsd exports: the view is at share/agents
)

// entryTimeout is how long the guest may keep a name or attributes it
// looked up in the workspace before asking virtiofsd again. Zero: the
// guest revalidates every name on every path walk, so a view put in
// place by AttachWorkspace (a new daemon's, after a restart) is what the
// very next lookup reaches. With any cache the guest's entry for the
// share's agents/ would point at the dead view until it expired, and it
// expires in guest time only: a VM paused across a daemon restart would
// resume into a gone workspace (issue 19). The host's view still caches
// on its side, so a lookup costs a round trip to virtiofsd, not to the
// store.
const entryTimeout time.Duration = 0

// state is what a machine keeps on disk to be recovered: its spec and the
// processes serving it.
type state struct {
	Spec      vmm.Spec `json:"spec"`
	Root      string   `json:"root"`      // the image's ext4 file
	VMM       int      `json:"vmm"`       // cloud-hypervisor's pid
	Virtiofsd int      `json:"virtiofsd"` // 0: none
}

func readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	return st, nil
}

// proc is a process the machine watches: its own child, or one adopted
// after a daemon restart.
type proc struct {
	pid    int
	exited chan struct{}
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

type machine struct {
	d    *Driver
	id   string
	spec vmm.Spec
	dir  string
	api  *client

	mu         sync.Mutex // serialises Destroy, Checkpoint and Restore; guards st
	st         state
	vmm        atomic.Pointer[proc]
	virtiofsd  atomic.Pointer[proc]
	gc         atomic.Pointer[guest.Client]
	restarting atomic.Bool // the VMM is stopped on purpose, to start again
	destroying atomic.Bool
	done       chan struct{}
	doneOnce   sync.Once

	// remount asks the guest to mount the workspace again; nil is
	// (*guest.Client).RemountWorkspace. Tests replace it to show what
	// a machine is like without it.
	remount func(*guest.Client, context.Context) error
}

var (
	_ vmm.Machine           = (*machine)(nil)
	_ vmm.Checkpointer      = (*machine)(nil)
	_ vmm.WorkspaceAttacher = (*machine)(nil)
)

func newMachine(d *Driver, spec vmm.Spec, dir, root string) *machine {
	return &machine{d: d, id: spec.ID, spec: spec, dir: dir, api: newClient(filepath.Join(dir, apiSock)),
		st: state{Spec: spec, Root: root}, done: make(chan struct{})}
}

func (m *machine) ID() string            { return m.id }
func (m *machine) Guest() *guest.Client  { return m.gc.Load() }
func (m *machine) Done() <-chan struct{} { return m.done }
func (m *machine) proc() *proc           { return m.vmm.Load() }
func (m *machine) path(name string) string {
	return filepath.Join(m.dir, name)
}

// create makes the writable disk, starts virtiofsd and the VMM, creates
// and boots the VM and connects to its agent.
func (m *machine) create(ctx context.Context) error {
	// A unix socket path holds at most 107 bytes; say so before a bind
	// deep in a child process fails.
	if p := m.path(vsockSock) + "_" + strconv.Itoa(AgentPort); len(p) > 107 {
		return fmt.Errorf("socket path %s is %d bytes, over the 107 a unix socket allows: use a shorter state directory", p, len(p))
	}
	size := m.spec.Disk
	if size == 0 {
		size = m.d.cfg.Disk
	}
	if err := makeDisk(ctx, m.path(rwDisk), size); err != nil {
		return err
	}
	if m.spec.Workspace != "" {
		if err := share.Setup(m.path(shareDir), m.spec.Workspace); err != nil {
			return err
		}
	}
	return m.boot(ctx, "")
}

// boot starts the VM from scratch, or from the memory snapshot in
// snapshot, and connects to its agent.
func (m *machine) boot(ctx context.Context, snapshot string) error {
	if m.spec.Workspace != "" && snapshot == "" {
		if err := m.startVirtiofsd(ctx); err != nil {
			return err
		}
	}
	if err := m.startVMM(ctx); err != nil {
		return err
	}
	// Upstream binds the vsock socket and never removes it.
	os.Remove(m.path(vsockSock))
	if snapshot != "" {
		if err := m.api.restore(ctx, snapshot); err != nil {
			return err
		}
		// The snapshot was taken without the workspace: plug it back.
		if m.spec.Workspace != "" {
			if err := m.attachFs(ctx); err != nil {
				return err
			}
		}
	} else {
		if err := m.api.create(ctx, m.vmConfig()); err != nil {
			return err
		}
		if err := m.api.put(ctx, "vm.boot"); err != nil {
			return err
		}
	}
	return m.connect(ctx)
}

// vmConfig is the VM: the image read-only and the writable disk, the
// workspace over virtio-fs, the agent's vsock, serial to a file.
func (m *machine) vmConfig() api.VmConfig {
	s := m.spec
	cpus := max(1, int(math.Ceil(s.CPUs)))
	mem := s.Memory
	if mem == 0 {
		mem = m.d.cfg.Memory
	}
	host := s.Hostname
	if host == "" {
		host = s.ID
	}
	cmdline := fmt.Sprintf("%s hearth.root=/dev/vda hearth.rw=/dev/vdb hearth.channel=vsock-listen:%d hearth.hostname=%s hearth.uid=%d hearth.gid=%d",
		m.d.cfg.Cmdline, AgentPort, host, s.UID, s.GID)
	// Shared memory always: virtio-fs needs it, also when the workspace
	// is plugged in later.
	shared, ro, raw := true, true, api.ImageType("Raw")
	cfg := api.VmConfig{
		Payload: api.PayloadConfig{Kernel: &m.d.cfg.Kernel, Initramfs: &m.d.cfg.Initramfs},
		Cpus:    &api.CpusConfig{BootVcpus: cpus, MaxVcpus: cpus},
		Memory:  &api.MemoryConfig{Size: mem, Shared: &shared},
		Disks: &[]api.DiskConfig{
			{Path: ptr(m.st.Root), Readonly: &ro, Id: ptr("root"), ImageType: &raw},
			{Path: ptr(m.path(rwDisk)), Id: ptr("rw"), ImageType: &raw},
		},
		Serial:  &api.SerialConfig{Mode: "File", File: ptr(m.path(serialLog))},
		Console: &api.ConsoleConfig{Mode: "Off"},
		Vsock:   &api.VsockConfig{Cid: 3, Socket: m.path(vsockSock), Id: ptr("vsock")},
	}
	if s.Workspace != "" {
		// Snapshots unplug the workspace and plug it in again.
		cmdline += " hearth.fs=" + workspaceID + " hearth.replug"
		cfg.Fs = &[]api.FsConfig{m.fsConfig()}
	}
	cfg.Payload.Cmdline = &cmdline
	return cfg
}

func (m *machine) fsConfig() api.FsConfig {
	return api.FsConfig{Tag: workspaceID, Socket: m.path(fsSock), NumQueues: 1, QueueSize: 1024, Id: ptr(workspaceID)}
}

func ptr[T any](v T) *T { return &v }

// saveState writes state.json, for Recover.
func (m *machine) saveState() error {
	b, _ := json.Marshal(m.st)
	return atomicfile.WriteFile(m.path(stateFile), b, 0o600)
}

// startVMM starts cloud-hypervisor with only its API socket (the VM is
// made over the API) and waits until it answers vmm.ping.
func (m *machine) startVMM(ctx context.Context) error {
	p, err := m.spawn("cloud-hypervisor", vmmOut, m.d.ch, "--api-socket", "path="+m.path(apiSock), "--log-file", m.path(vmmLog))
	if err != nil {
		return err
	}
	m.vmm.Store(p)
	go func() { <-p.exited; m.vmmExited(p) }()
	m.st.VMM = p.pid
	if err := m.saveState(); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := m.api.ping(ctx)
		if err == nil {
			return nil
		}
		if !p.alive() {
			return fmt.Errorf("cloud-hypervisor exited while starting: %s", m.tail(vmmOut, vmmLog))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cloud-hypervisor did not answer vmm.ping within 10s: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spawn starts a process of the machine in a session of its own (so it
// outlives the daemon), output to a file in the machine's directory, and
// reaps it.
func (m *machine) spawn(what, out, bin string, args ...string) (*proc, error) {
	f, err := os.OpenFile(m.path(out), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	attr := &os.ProcAttr{Dir: m.dir, Files: []*os.File{null, f, f}, Sys: &syscall.SysProcAttr{Setsid: true}}
	proc0, err := os.StartProcess(bin, append([]string{bin}, args...), attr)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", what, err)
	}
	p := &proc{pid: proc0.Pid, exited: make(chan struct{})}
	go func() { proc0.Wait(); close(p.exited) }()
	return p, nil
}

// adopt watches a cloud-hypervisor that is not our child (after a daemon
// restart).
func (m *machine) adopt(pid int) {
	p := &proc{pid: pid, exited: make(chan struct{})}
	m.vmm.Store(p)
	go func() {
		for syscall.Kill(pid, 0) == nil && m.d.isVMM(pid) {
			time.Sleep(100 * time.Millisecond)
		}
		close(p.exited)
		m.vmmExited(p)
	}()
}

// vmmExited is told when a cloud-hypervisor ends. Unless the machine is
// restarting it, the machine has stopped: its guest powered off, or the
// VMM died.
func (m *machine) vmmExited(p *proc) {
	if m.restarting.Load() || m.vmm.Load() != p {
		return
	}
	if !m.destroying.Load() {
		m.d.record(m.id, "exit", "cloud-hypervisor ended by itself (guest power-off or a crash): "+m.tail(serialLog, vmmLog))
	}
	m.doneOnce.Do(func() { close(m.done) })
}

// tail is the last lines of the first of files that has any, for errors.
func (m *machine) tail(files ...string) string {
	for _, f := range files {
		b, _ := os.ReadFile(m.path(f))
		s := strings.TrimSpace(string(b))
		if s == "" {
			continue
		}
		lines := strings.Split(s, "\n")
		if len(lines) > 5 {
			lines = lines[len(lines)-5:]
		}
		return f + ": " + strings.Join(lines, " | ")
	}
	return "(no output in " + strings.Join(files, ", ") + ")"
}

// connect dials the agent through the VMM's vsock socket until it
// answers a health check.
func (m *machine) connect(ctx context.Context) error {
	p := m.proc()
	deadline := time.Now().Add(60 * time.Second)
	for {
		gc, err := m.dialAgent(ctx)
		if err == nil {
			m.gc.Store(gc)
			return nil
		}
		if !p.alive() {
			return fmt.Errorf("cloud-hypervisor exited while the guest booted: %s", m.tail(serialLog, vmmLog, vmmOut))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("guest agent did not answer on vsock port %d within 60s (%v); serial: %s", AgentPort, err, m.tail(serialLog))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (m *machine) dialAgent(ctx context.Context) (*guest.Client, error) {
	conn, err := dialVsock(ctx, m.path(vsockSock), AgentPort)
	if err != nil {
		return nil, err
	}
	return guest.Open(ctx, conn, 5*time.Second)
}

// reattach connects to the agent of a recovered VM. A paused VM's agent
// cannot answer: it is resumed to connect, then paused again.
func (m *machine) reattach(ctx context.Context) (paused bool, err error) {
	if _, err := m.api.ping(ctx); err != nil {
		return false, err
	}
	info, err := m.api.info(ctx)
	if err != nil {
		return false, err
	}
	switch info.State {
	case api.Running:
	case api.Paused:
		paused = true
		if err := m.api.put(ctx, "vm.resume"); err != nil {
			return true, err
		}
	default:
		return false, fmt.Errorf("its VM is %s, not running", info.State)
	}
	if err := m.connect(ctx); err != nil {
		return paused, err
	}
	if paused {
		err = m.api.put(ctx, "vm.pause")
	}
	return paused, err
}

// vmState is the VM's state as the VMM reports it.
func (m *machine) vmState(ctx context.Context) (api.VmState, error) {
	info, err := m.api.info(ctx)
	return info.State, err
}

// Pause pauses the VM's vCPUs and devices. Idempotent.
func (m *machine) Pause(ctx context.Context) error {
	if s, err := m.vmState(ctx); err == nil && s == api.Paused {
		return nil
	}
	if err := m.api.put(ctx, "vm.pause"); err != nil {
		return fmt.Errorf("pause machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "pause", "")
	return nil
}

// Resume resumes a paused VM. Idempotent.
func (m *machine) Resume(ctx context.Context) error {
	if s, err := m.vmState(ctx); err == nil && s == api.Running {
		return nil
	}
	if err := m.api.put(ctx, "vm.resume"); err != nil {
		return fmt.Errorf("resume machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "resume", "")
	if err := vmm.SetGuestClock(ctx, m.gc.Load()); err != nil {
		m.d.record(m.id, "resume", "the guest's clock stays behind: "+err.Error())
	}
	return nil
}

// Destroy shuts the VM down, ends its VMM and virtiofsd, and removes the
// machine's directory. Idempotent.
func (m *machine) Destroy(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.destroying.Swap(true) {
		return nil
	}
	err := m.teardown(ctx)
	m.d.record(m.id, "destroy", "")
	m.doneOnce.Do(func() { close(m.done) })
	if err != nil {
		return fmt.Errorf("destroy machine %s: %w", m.id, err)
	}
	return nil
}

// teardown ends everything the machine runs and removes its directory,
// once the workspace view is unmounted from its share (never while the
// view is there: it would be emptied with the directory).
func (m *machine) teardown(ctx context.Context) error {
	err := m.stopVMM(ctx)
	m.stopVirtiofsd()
	if serr := share.Teardown(m.path(shareDir)); serr != nil {
		return errors.Join(err, serr)
	}
	return errors.Join(err, os.RemoveAll(m.dir))
}

// stopVMM ends the VM and its VMM through the API (vm.shutdown,
// vm.delete, vmm.shutdown), killing it if it does not go, and waits for
// it to exit.
func (m *machine) stopVMM(ctx context.Context) error {
	if gc := m.gc.Load(); gc != nil {
		gc.Close()
	}
	p := m.proc()
	if p == nil || !p.alive() {
		return nil
	}
	// A VM that is not running refuses vm.shutdown; vm.delete and
	// vmm.shutdown still end it.
	m.api.put(ctx, "vm.shutdown")
	m.api.put(ctx, "vm.delete")
	m.api.put(ctx, "vmm.shutdown")
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	syscall.Kill(p.pid, syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("cloud-hypervisor pid %d did not exit", p.pid)
	}
}

// AttachWorkspace mounts the view at dir in place of the machine's
// workspace view, on the host: virtiofsd and the VM go on untouched (see
// package vmm/share). The guest keeps no cached entry (entryTimeout),
// so its next path lookup under /workspace/agents reaches dir; a process
// whose working directory is in the old view keeps the old one.
func (m *machine) AttachWorkspace(ctx context.Context, dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.spec.Workspace == "" {
		return fmt.Errorf("attach workspace to machine %s: it was created without a workspace, so it has no virtio-fs device to reach one: create it with Spec.Workspace", m.id)
	}
	if err := share.Replace(m.path(shareDir), dir); err != nil {
		return fmt.Errorf("attach workspace to machine %s: %w", m.id, err)
	}
	m.spec.Workspace = dir
	m.st.Spec.Workspace = dir
	if err := m.saveState(); err != nil {
		return fmt.Errorf("attach workspace to machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "attach-workspace", dir)
	return nil
}
