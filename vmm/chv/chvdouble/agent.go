package chvdouble

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"hearth/vmm/chv/api"
)

// agent is the guest agent, run as a host process in place of the guest.
type agent struct {
	cmd      *exec.Cmd
	port     uint32 // the vsock port it listens on in a real guest
	sock     string // the unix socket it listens on here
	fsTag    string // the workspace's virtio-fs tag (hearth.fs); empty: none
	fsDevice string // the symlink standing for that device while it is plugged in (see workspace.go)
	exited   chan struct{}
	stopping atomic.Bool
	adopts   bool // the double is the guest's subreaper (Options.Subreaper)
}

func startAgent(m *vm) (*agent, error) {
	bin := m.vmm.opts.Guest
	if bin == "" {
		return nil, errors.New("chv-double: no guest agent to run: set CHV_DOUBLE_GUEST to the hearth-guest binary (this double runs it as a host process in place of a guest)")
	}
	if m.config.Vsock == nil {
		return nil, errors.New("chv-double: the VM has no vsock device, so its guest agent could not be reached")
	}
	port, uid, gid, tag, err := guestArgs(str(m.config.Payload.Cmdline))
	if err != nil {
		return nil, err
	}
	sock := fmt.Sprintf("%s.double-agent-%d", m.config.Vsock.Socket, port)
	os.Remove(sock)
	argv := []string{bin, "--channel", "listen:" + sock, "--uid", uid, "--gid", gid}
	device := ""
	if tag != "" {
		if strings.ContainsRune(tag, '/') {
			return nil, fmt.Errorf("chv-double: hearth.fs=%s: a virtio-fs tag has no /", tag)
		}
		device = fmt.Sprintf("%s.double-fs-%s", m.config.Vsock.Socket, tag)
		os.Remove(device)
		dir, ok, err := m.workspaceDir(tag)
		if err != nil {
			return nil, err
		}
		if ok {
			if err := os.Symlink(dir, device); err != nil {
				return nil, fmt.Errorf("chv-double: the guest's workspace: %w", err)
			}
		}
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("chv-double: the guest's workspace: %w", err)
		}
		argv = append(argv, "--workspace-device", device)
		argv = append([]string{self, GuestWorkspaceCommand, device}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if s := m.config.Serial; s != nil && s.Mode == "File" {
		f, err := os.OpenFile(str(s.File), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("serial file: %w", err)
		}
		defer f.Close()
		fmt.Fprintf(f, "chv-double: no kernel boots here; guest agent %s runs as a host process\n", bin)
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chv-double: start guest agent: %w", err)
	}
	a := &agent{cmd: cmd, port: port, sock: sock, fsTag: tag, fsDevice: device, exited: make(chan struct{}), adopts: m.vmm.opts.Subreaper}
	go func() {
		cmd.Wait()
		close(a.exited)
		os.Remove(sock)
		if !a.stopping.Load() {
			m.vmm.guestExited(m)
		}
	}()
	return a, nil
}

// workspaceDir is what the guest would mount for the virtio-fs tag its
// kernel command line names: the directory virtiofsd exports. ok is
// false when the guest has no workspace, or when the device is not there
// at boot (a VM restored from a snapshot gets it plugged in after, and
// its agent, which starts afresh here, goes without).
func (m *vm) workspaceDir(tag string) (dir string, ok bool, err error) {
	if tag == "" || m.config.Fs == nil {
		return "", false, nil
	}
	for _, fs := range *m.config.Fs {
		if fs.Tag != tag {
			continue
		}
		c := m.fsConns[str(fs.Id)]
		if c == nil {
			return "", false, nil
		}
		dir, err := exportedDir(c)
		if err != nil {
			return "", false, fmt.Errorf("chv-double: virtio-fs %s: %w", tag, err)
		}
		return dir, true, nil
	}
	return "", false, nil
}

// tree is the guest's processes: the agent and every process descended
// from it or, when the double is the guest's subreaper, from the double
// (the agent and the guest's orphans).
func (a *agent) tree() []int {
	children := map[int][]int{}
	for _, p := range processes() {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	out := []int{a.cmd.Process.Pid}
	if a.adopts {
		out = children[os.Getpid()]
	}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// proc is one process, as its /proc/PID/stat tells.
type proc struct {
	pid, ppid int
	ended     bool // a zombie, waiting for its parent to reap it
}

// processes lists the host's processes.
func processes() []proc {
	var out []proc
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parens.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, proc{pid: pid, ppid: ppid, ended: f[0] == "Z"})
	}
	return out
}

// stopTree stops every process of the guest, over again until no new
// one appears (one may fork while the walk runs).
func (a *agent) stopTree() {
	stopped := map[int]bool{}
	for {
		fresh := false
		for _, pid := range a.tree() {
			if !stopped[pid] {
				syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid], fresh = true, true
			}
		}
		if !fresh {
			return
		}
	}
}

func (a *agent) contTree() {
	for _, pid := range a.tree() {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// kill ends the guest: stopped first, so no process escapes by forking
// or by losing its parent, then killed.
func (a *agent) kill() {
	a.stopping.Store(true)
	a.stopTree()
	for _, pid := range a.tree() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case <-a.exited:
	case <-time.After(5 * time.Second):
	}
	if a.fsDevice != "" {
		os.Remove(a.fsDevice)
	}
}

// muxer is the host side of the VM's vsock device: a unix socket where
// the host writes CONNECT <port>\n and reads OK <n>\n before the stream.
type muxer struct {
	m     *vm
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
	next  atomic.Uint32
}

func listenVsock(m *vm, path string) (*muxer, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("cannot bind vsock socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // upstream leaves the file
	x := &muxer{m: m, ln: ln, conns: map[net.Conn]bool{}}
	x.next.Store(1 << 30) // upstream's first local port
	go x.accept()
	return x, nil
}

func (x *muxer) accept() {
	for {
		c, err := x.ln.Accept()
		if err != nil {
			return
		}
		if !x.track(c, true) {
			c.Close()
			return
		}
		go func() {
			defer x.track(c, false)
			x.serve(c)
		}()
	}
}

// track adds or drops a connection; it refuses to add once closed.
func (x *muxer) track(c net.Conn, add bool) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !add {
		delete(x.conns, c)
		return true
	}
	if x.conns == nil {
		return false
	}
	x.conns[c] = true
	return true
}

// close stops accepting and closes the host's connections; their
// goroutines end as their streams do (the VMM's lock is held here, and
// they take it, so close does not wait for them).
func (x *muxer) close() {
	x.ln.Close()
	x.mu.Lock()
	for c := range x.conns {
		c.Close()
	}
	x.conns = nil
	x.mu.Unlock()
}

// serve answers one host connection as upstream's muxer does: a guest
// port nobody listens on closes it.
func (x *muxer) serve(c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	f := strings.Fields(line)
	if len(f) != 2 || !strings.EqualFold(f[0], "CONNECT") {
		return
	}
	port, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		return
	}
	a := x.waitRunning()
	if a == nil || uint32(port) != a.port {
		return
	}
	g, err := net.Dial("unix", a.sock)
	if err != nil {
		return // the agent is not listening yet
	}
	defer g.Close()
	if _, err := fmt.Fprintf(c, "OK %d\n", x.next.Add(1)); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(g, r); g.(*net.UnixConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, g); c.(*net.UnixConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// waitRunning holds a new connection while the VM is paused (its vsock
// device does not run) and returns the agent, nil once the VM is gone.
func (x *muxer) waitRunning() *agent {
	for {
		x.m.vmm.mu.Lock()
		live := x.m.vmm.vm == x.m && x.m.vsock == x
		state, a := x.m.state, x.m.agent
		x.m.vmm.mu.Unlock()
		if !live || a == nil {
			return nil
		}
		if state == api.Running {
			return a
		}
		time.Sleep(10 * time.Millisecond)
	}
}
