package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
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
	"hearth/vmm/share"
)

// Files in a machine's directory.
const (
	qmpSock   = "qmp.sock"   // QEMU's machine protocol
	agentSock = "agent.sock" // the virtio-serial port of the guest agent
	fsSock    = "vfs.sock"   // virtiofsd's vhost-user socket
	qemuPID   = "qemu.pid"
	fsPID     = "virtiofsd.pid"
	accelFile = "accel"      // kvm or tcg: how QEMU runs the machine
	serialLog = "serial.log" // the guest's console
	qemuLog   = "qemu.log"
	fsLog     = "virtiofsd.log"
	shareDir  = "share" // what virtiofsd exports: the view is at share/agents
	// bootDirFile holds the directory QEMU and virtiofsd were started in,
	// which their command lines name: a warm machine is booted in spares/
	// and moved to machines/ when a session takes it.
	bootDirFile = "boot-dir"
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

// portName is the name of the agent's virtio-serial port; the guest finds
// the port by it (/dev/virtio-ports/hearth).
const portName = "hearth"

// errKVMFailed means KVM could not run the kernel (a nested, paravirtual
// KVM cannot run stock kernels): TCG may.
var errKVMFailed = errors.New("KVM could not run the kernel")

type machine struct {
	d     *Driver
	id    string
	spec  vmm.Spec
	dir   string
	accel string
	// shared: the machine has a virtio-fs share (for a workspace view).
	// A warm machine has it before it has a view.
	shared bool

	proc atomic.Pointer[qemuProc] // the QEMU running the machine now
	fsd  *exec.Cmd                // virtiofsd when started here; else its pid is in fsPID
	// fsdExited is closed when fsd has exited.
	fsdExited chan struct{}

	gc         atomic.Pointer[guest.Client]
	mu         sync.Mutex // serialises Destroy
	destroyed  bool
	destroying atomic.Bool
	restarting atomic.Bool // QEMU is stopped on purpose, to boot again
	done       chan struct{}
	doneOnce   sync.Once
}

var (
	_ vmm.Machine           = (*machine)(nil)
	_ vmm.UsageReporter     = (*machine)(nil)
	_ vmm.WorkspaceAttacher = (*machine)(nil)
)

// qemuProc is one QEMU process.
type qemuProc struct {
	pid    int
	exited chan struct{} // closed once it is gone
	err    error         // how it ended (if started here), set before exited is closed
}

func newMachine(d *Driver, spec vmm.Spec, dir string) *machine {
	return &machine{d: d, id: spec.ID, spec: spec, dir: dir, shared: spec.Workspace != "", done: make(chan struct{})}
}

// watch tells the machine when QEMU process p has exited.
func (m *machine) watch(p *qemuProc) {
	<-p.exited
	m.stopped(p, p.err)
}

func (m *machine) ID() string            { return m.id }
func (m *machine) Guest() *guest.Client  { return m.gc.Load() }
func (m *machine) Done() <-chan struct{} { return m.done }
func (m *machine) path(name string) string {
	return filepath.Join(m.dir, name)
}

// boot starts the machine and hands it to its session: the agent
// answers when it returns.
func (m *machine) boot(ctx context.Context, accel, disk string) error {
	if err := m.start(ctx, accel, disk); err != nil {
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, m.d.cfg.BootTimeout)
	defer cancel()
	return m.claim(bctx)
}

// start starts virtiofsd (for a share) and QEMU, and waits until the
// agent has opened its port: it then waits for its claim.
func (m *machine) start(ctx context.Context, accel, disk string) error {
	m.accel = accel
	if err := os.WriteFile(m.path(accelFile), []byte(accel), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(m.path(bootDirFile), []byte(m.dir), 0o600); err != nil {
		return err
	}
	if m.shared {
		if err := m.startVirtiofsd(); err != nil {
			return err
		}
	}
	cmd := exec.Command(m.d.cfg.QEMU, m.qemuArgs(accel, disk)...)
	log, err := os.Create(m.path(qemuLog))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	// Its own session: the machine outlives a daemon that stops, and a
	// signal to the daemon's process group does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	p := &qemuProc{pid: cmd.Process.Pid, exited: make(chan struct{})}
	m.proc.Store(p)
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	go m.watch(p)
	bctx, cancel := context.WithTimeout(ctx, m.d.cfg.BootTimeout)
	defer cancel()
	return m.waitPort(bctx)
}

// claim connects to the agent, which waits for its claim, sends it the
// hostname and user, and returns once the agent answers.
func (m *machine) claim(ctx context.Context) error {
	conn, err := m.dialPort(ctx, m.d.cfg.BootTimeout)
	if err != nil {
		return m.bootError(fmt.Sprintf("connect to the agent: %v", err))
	}
	hostname := m.spec.Hostname
	if hostname == "" {
		hostname = m.id
	}
	if err := guest.WriteClaim(conn, guest.Claim{Hostname: hostname, UID: m.spec.UID, GID: m.spec.GID, Time: time.Now().UnixNano()}); err != nil {
		conn.Close()
		return m.bootError(fmt.Sprintf("send the agent its claim: %v", err))
	}
	gc, err := guest.Open(ctx, conn, m.d.cfg.BootTimeout)
	if err != nil {
		return m.bootError(fmt.Sprintf("the agent did not answer its claim: %v", err))
	}
	m.gc.Store(gc)
	return nil
}

// qemuArgs is the command line of a microvm with the root disk, the
// writable disk, the workspace (if any) and the agent's port.
func (m *machine) qemuArgs(accel, disk string) []string {
	mem := m.spec.Memory
	if mem == 0 {
		mem = 512 << 20
	}
	memMiB := (mem + (1<<20 - 1)) >> 20
	cpus := max(1, int(math.Ceil(m.spec.CPUs)))
	// The hostname and the user come with the claim (see claim).
	cmdline := []string{vmm.KernelArgs,
		"hearth.root=/dev/vda", "hearth.rw=/dev/vdb",
		"hearth.channel=dev:/dev/virtio-ports/" + portName, "hearth.await"}
	if m.shared {
		cmdline = append(cmdline, "hearth.fs=workspace")
	}
	cmdline = append(cmdline, clockArgs(accel)...)
	args := []string{
		"-M", "microvm,memory-backend=mem", "-accel", accel, "-cpu", cpuModel(accel),
		"-m", fmt.Sprintf("%dM", memMiB), "-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-nographic", "-display", "none", "-no-reboot",
		// virtio-fs needs guest memory virtiofsd can map.
		"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", memMiB),
		// Modern virtio-mmio: virtiofsd fails on the legacy interface.
		"-global", "virtio-mmio.force-legacy=false",
		"-kernel", m.d.cfg.Kernel, "-initrd", m.d.cfg.Initramfs,
		"-append", strings.Join(cmdline, " "),
		"-serial", "file:" + m.path(serialLog),
		"-pidfile", m.path(qemuPID),
		"-qmp", "unix:" + m.path(qmpSock) + ",server=on,wait=off",
		"-drive", "id=root,file=" + disk + ",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=root",
		"-drive", "id=rw,file=" + m.path("rw.ext4") + ",format=raw,if=none",
		"-device", "virtio-blk-device,drive=rw",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + m.path(agentSock) + ",server=on,wait=off",
		"-device", "virtserialport,id=" + portName + ",chardev=agent,name=" + portName,
	}
	if m.shared {
		args = append(args,
			"-chardev", "socket,id=fs0,path="+m.path(fsSock),
			"-device", "vhost-user-fs-device,chardev=fs0,tag=workspace")
	}
	return args
}

// clockArgs are kernel parameters for the guest's clock. Under TCG the
// guest's TSC is the host's; on a busy host the kernel's calibration
// against the emulated PIT fails, and with no other clock the boot hangs:
// tell it the rate instead.
func clockArgs(accel string) []string {
	if khz := hostTSCkHz(); accel == "tcg" && khz > 0 {
		return []string{fmt.Sprintf("tsc_early_khz=%d", khz), "tsc=reliable"}
	}
	return nil
}

// hostTSCkHz is the host CPU's clock rate as /proc/cpuinfo gives it (on
// current CPUs the TSC runs at this nominal rate), 0 if unknown.
func hostTSCkHz() int64 {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return int64(mhz * 1000)
		}
	}
	return 0
}

func cpuModel(accel string) string {
	if accel == "kvm" {
		return "host"
	}
	return "max"
}

// startVirtiofsd serves the workspace on fsSock and waits for the socket.
func (m *machine) startVirtiofsd() error {
	log, err := os.Create(m.path(fsLog))
	if err != nil {
		return err
	}
	defer log.Close()
	os.Remove(m.path(fsSock)) // an earlier boot's: it would look ready
	cmd := exec.Command(m.d.cfg.Virtiofsd, "--socket-path="+m.path(fsSock), "-o", "source="+m.path(shareDir),
		"-o", "cache=auto", "-o", fmt.Sprintf("timeout=%g", entryTimeout.Seconds()))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start virtiofsd: %w", err)
	}
	exited := make(chan struct{})
	m.fsd, m.fsdExited = cmd, exited
	go func() { cmd.Wait(); close(exited) }()
	os.WriteFile(m.path(fsPID), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	for deadline := time.Now().Add(10 * time.Second); ; {
		// virtiofsd binds its socket before it listens: QEMU connecting
		// in between is refused (seen under load), and a probe
		// connection would be taken as virtiofsd's one frontend.
		if listening(m.path(fsSock)) {
			return nil
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(m.path(fsLog))
			return fmt.Errorf("virtiofsd exited at start: %s", bytes.TrimSpace(out))
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("virtiofsd did not listen on its socket within 10s")
		}
	}
}

// listening reports whether a unix socket bound at path listens, from
// /proc/net/unix (flag __SO_ACCEPTCON).
func listening(path string) bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		// The path ends the line and may hold spaces.
		if f := strings.Fields(line); len(f) >= 8 && strings.HasSuffix(line, " "+path) {
			flags, err := strconv.ParseUint(f[3], 16, 32)
			return err == nil && flags&0x10000 != 0
		}
	}
	return false
}

// waitPort waits until the guest opens the agent's port, failing early if
// QEMU exits or the VM stops on an error.
func (m *machine) waitPort(ctx context.Context) error {
	exited := m.proc.Load().exited
	var q *qmp
	for q == nil {
		var err error
		if q, err = dialQMP(ctx, m.path(qmpSock)); err == nil {
			break
		}
		select {
		case <-exited:
			return m.bootError("qemu exited at start")
		case <-ctx.Done():
			return fmt.Errorf("qemu's QMP socket: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	defer q.close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	// Should the event be missed, connect's retries take over.
	fallback := time.After(15 * time.Second)
	for {
		select {
		case e := <-q.events:
			if e.Event == "VSERPORT_CHANGE" && bytes.Contains(e.Data, []byte(`"open": true`)) {
				return nil
			}
		case <-fallback:
			return nil
		case <-tick.C:
			st, err := q.status(ctx)
			if err != nil {
				continue // qemu exiting: the next case says why
			}
			if st == "internal-error" || st == "guest-panicked" || st == "shutdown" {
				return m.bootError("the VM stopped with status " + st)
			}
		case <-exited:
			return m.bootError("qemu exited while booting")
		case <-ctx.Done():
			return m.bootError(fmt.Sprintf("the agent did not open its port: %v", ctx.Err()))
		}
	}
}

// bootError describes a failed boot with the end of QEMU's log and of the
// guest's console. Under KVM it wraps errKVMFailed when KVM is to blame.
func (m *machine) bootError(what string) error {
	qlog, _ := os.ReadFile(m.path(qemuLog))
	serial, _ := os.ReadFile(m.path(serialLog))
	err := fmt.Errorf("%s; qemu: %s; console: %s", what, lastLines(qlog, 4), lastLines(serial, 6))
	if m.accel == "kvm" && (bytes.Contains(bytes.ToLower(qlog), []byte("kvm")) || strings.Contains(what, "internal-error")) {
		return fmt.Errorf("%w: %w", errKVMFailed, err)
	}
	return err
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// connect dials the agent's port until the agent answers a health check.
// Each try starts with the port handshake (guest.HostHandshake), which
// sets it apart from what earlier connections left in the port.
func (m *machine) connect(ctx context.Context) error {
	exited := m.proc.Load().exited
	var last error
	for {
		gc, err := m.dialAgent(ctx)
		if err == nil {
			m.gc.Store(gc)
			return nil
		}
		last = err
		select {
		case <-exited:
			return m.bootError("qemu exited while the agent was connecting")
		case <-ctx.Done():
			return fmt.Errorf("the agent did not answer on %s: %v (last: %v)", m.path(agentSock), ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dialPort connects to the agent's port and makes the port handshake
// (guest.HostHandshake) within timeout.
func (m *machine) dialPort(ctx context.Context, timeout time.Duration) (io.ReadWriteCloser, error) {
	var d net.Dialer
	sock, err := d.DialContext(ctx, "unix", m.path(agentSock))
	if err != nil {
		return nil, err
	}
	return guest.HostHandshake(ctx, sock, timeout)
}

func (m *machine) dialAgent(ctx context.Context) (*guest.Client, error) {
	conn, err := m.dialPort(ctx, 3*time.Second)
	if err != nil {
		return nil, err
	}
	return guest.Open(ctx, conn, 3*time.Second)
}

// attach takes over a running machine after a daemon restart: QEMU's pid
// from its pid file, checked against its QMP socket, and a new agent
// connection. A paused machine is resumed only while the agent connects.
func (m *machine) attach(ctx context.Context) error {
	p := &qemuProc{pid: readPID(m.path(qemuPID)), exited: make(chan struct{})}
	if !m.isOurQEMU(p.pid) {
		return vmm.ErrNotFound
	}
	m.proc.Store(p)
	accel, _ := os.ReadFile(m.path(accelFile))
	m.accel = string(accel)
	go func() {
		for syscall.Kill(p.pid, 0) == nil {
			time.Sleep(100 * time.Millisecond)
		}
		close(p.exited)
	}()
	go m.watch(p)
	var status string
	err := m.qmpDo(ctx, func(q *qmp) (err error) {
		if status, err = q.status(ctx); err == nil && status == "paused" {
			_, err = q.execute(ctx, "cont", nil)
		}
		return err
	})
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.connect(cctx); err != nil {
		return err
	}
	if status == "paused" {
		return m.Pause(ctx)
	}
	return nil
}

// isOurQEMU reports whether pid is the QEMU of this machine directory.
func (m *machine) isOurQEMU(pid int) bool {
	return cmdlineNames(pid, m.bootPath(qmpSock))
}

// bootPath is the path name had in the directory QEMU and virtiofsd were
// started in (see bootDirFile).
func (m *machine) bootPath(name string) string {
	dir, err := os.ReadFile(m.path(bootDirFile))
	if err != nil || len(dir) == 0 {
		return m.path(name)
	}
	return filepath.Join(string(dir), name)
}

// cmdlineNames reports whether process pid runs with path on its
// command line: a pid file's process is still the one it names.
func cmdlineNames(pid int, path string) bool {
	if pid <= 0 {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(path))
}

func readPID(path string) int {
	b, _ := os.ReadFile(path)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// stopped is told when QEMU process p has exited. Unless the machine
// is booting again, it has stopped.
func (m *machine) stopped(p *qemuProc, err error) {
	if m.proc.Load() != p || m.restarting.Load() {
		return
	}
	if !m.destroying.Load() {
		m.d.record(m.id, "exit", fmt.Sprintf("qemu ended by itself: %v", err))
	}
	m.doneOnce.Do(func() { close(m.done) })
}

// qmpDo runs fn on a fresh QMP connection. QEMU serves one QMP client at
// a time, so no connection is held between calls.
func (m *machine) qmpDo(ctx context.Context, fn func(*qmp) error) error {
	q, err := dialQMP(ctx, m.path(qmpSock))
	if err != nil {
		return fmt.Errorf("machine %s: qmp: %w", m.id, err)
	}
	defer q.close()
	return fn(q)
}

// Pause stops the VM's CPUs; its memory and devices stay as they are.
func (m *machine) Pause(ctx context.Context) error {
	return m.qmpDo(ctx, func(q *qmp) error {
		_, err := q.execute(ctx, "stop", nil)
		return err
	})
}

// Resume lets the VM's CPUs run again.
func (m *machine) Resume(ctx context.Context) error {
	err := m.qmpDo(ctx, func(q *qmp) error {
		_, err := q.execute(ctx, "cont", nil)
		return err
	})
	if err != nil {
		return err
	}
	if err := vmm.SetGuestClock(ctx, m.gc.Load()); err != nil {
		m.d.record(m.id, "resume", "the guest's clock stays behind: "+err.Error())
	}
	return nil
}

// Destroy ends QEMU and virtiofsd and removes the machine's directory.
func (m *machine) Destroy(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.destroyed {
		return nil
	}
	m.destroying.Store(true)
	if gc := m.gc.Load(); gc != nil {
		gc.Close()
	}
	m.kill()
	if err := removeMachineDir(m.dir); err != nil {
		return fmt.Errorf("destroy machine %s: %w", m.id, err)
	}
	m.destroyed = true
	m.doneOnce.Do(func() { close(m.done) })
	m.d.record(m.id, "destroy", "")
	return nil
}

// kill ends QEMU (asking it to quit first) and virtiofsd, and waits for
// both.
func (m *machine) kill() {
	if p := m.proc.Load(); p != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m.qmpDo(ctx, func(q *qmp) error { _, err := q.execute(ctx, "quit", nil); return err })
		cancel()
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			syscall.Kill(p.pid, syscall.SIGKILL)
			<-p.exited
		}
	}
	if m.fsd != nil {
		m.fsd.Process.Kill()
		<-m.fsdExited
		m.fsd = nil
		return
	}
	if pid := readPID(m.path(fsPID)); cmdlineNames(pid, m.bootPath(fsSock)) {
		syscall.Kill(pid, syscall.SIGKILL)
		for syscall.Kill(pid, 0) == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Usage reports what QEMU uses on the host: its CPU time and resident
// memory (the guest's memory as far as it has touched it), and the
// blocks the writable disk takes. Processes inside the VM are not
// counted from the host: Processes is the host processes of the machine.
func (m *machine) Usage(ctx context.Context) (vmm.Usage, error) {
	p := m.proc.Load()
	if p == nil {
		return vmm.Usage{}, fmt.Errorf("machine %s: usage: not running", m.id)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return vmm.Usage{}, fmt.Errorf("machine %s: usage: %w", m.id, err)
	}
	u := vmm.Usage{MemoryLimit: m.spec.Memory, DiskLimit: m.spec.Disk, Disk: -1, Processes: 1}
	if m.shared {
		u.Processes++
	}
	// Fields after the command name (which may hold spaces): utime is the
	// 14th field of the line, stime the 15th, rss (pages) the 24th.
	if i := bytes.LastIndexByte(stat, ')'); i > 0 {
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 21 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			rss, _ := strconv.ParseInt(f[21], 10, 64)
			u.CPUTime = time.Duration(ut+st) * time.Second / 100 // USER_HZ
			u.Memory = rss * int64(os.Getpagesize())
		}
	}
	var st syscall.Stat_t
	if syscall.Stat(m.path("rw.ext4"), &st) == nil {
		u.Disk = st.Blocks * 512
	}
	return u, nil
}

// AttachWorkspace mounts the view at dir in place of the machine's
// workspace view, on the host: virtiofsd and the VM go on untouched. The
// guest keeps no cached entry (entryTimeout), so its next path lookup
// under /workspace/agents reaches dir; a process whose working directory
// is in the old view keeps the old one.
func (m *machine) AttachWorkspace(ctx context.Context, dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.shared {
		return fmt.Errorf("attach workspace to machine %s: it was created without a workspace, so it has no virtio-fs device to reach one: create it with Spec.Workspace", m.id)
	}
	if err := share.Replace(m.path(shareDir), dir); err != nil {
		return fmt.Errorf("attach workspace to machine %s: %w", m.id, err)
	}
	m.spec.Workspace = dir
	b, _ := json.Marshal(m.spec)
	if err := os.WriteFile(m.path("spec.json"), b, 0o600); err != nil {
		return fmt.Errorf("attach workspace to machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "attach-workspace", dir)
	return nil
}
