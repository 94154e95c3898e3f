package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"hearth/internal/atomicfile"
)

// ServerOptions configure the agent.
type ServerOptions struct {
	// Roots confine file requests: a path must lie under one of them after
	// symlinks are resolved. Empty means "/".
	Roots []string
	// MaxFileSize bounds uploads and downloads. Default 1 GiB.
	MaxFileSize int64
	// DefaultUID and DefaultGID run processes that ask for no user.
	DefaultUID, DefaultGID uint32
	// BaseEnv is every process's environment before its own.
	BaseEnv []string
	// RemountWorkspace mounts the machine's workspace again after the
	// host plugged its device back in (a VM whose virtio-fs device was
	// unplugged for a snapshot). Nil where the workspace never goes away
	// (the jail tier): the host's request is then refused as not
	// supported.
	RemountWorkspace func(context.Context) error
	// SetClock sets the machine's clock to the host's. A VM's clock
	// stands still while the VM is paused, and nothing in it keeps time
	// with the world. Nil where the clock is the host's own (the jail
	// tier): the host's request is then refused as not supported.
	SetClock func(time.Time) error
	// AwaitClaim makes an agent prepared ahead of time serve its host
	// before a sandbox claims it: the session, its first connection and
	// the code that serves are set up then, not in the sandbox's first
	// request. Until Claim, every request but a health check waits
	// (nothing runs in the machine), and DefaultUID and DefaultGID are
	// the claim's.
	AwaitClaim bool
}

// Server is the guest agent's side of the protocol.
type Server struct {
	opts    ServerOptions
	started time.Time
	sess    *yamux.Session
	mu      sync.Mutex
	procs   map[int]*exec.Cmd
	ptys    map[int]*os.File // terminal of each PTY exec, by pid
	jobs    jobTable
	claimed chan struct{} // closed by Claim, or at once without AwaitClaim

	fmu      sync.Mutex
	forwards map[string]*forwardPort // by listening address
}

// NewServer returns an agent with opts.
func NewServer(opts ServerOptions) *Server {
	if opts.MaxFileSize <= 0 {
		opts.MaxFileSize = 1 << 30
	}
	if len(opts.Roots) == 0 {
		opts.Roots = []string{"/"}
	}
	// os probes once whether pidfds work, with a clone of its own, at
	// the first process started or found: here, not in the first exec.
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		p.Release()
	}
	s := &Server{opts: opts, started: time.Now(), procs: map[int]*exec.Cmd{}, ptys: map[int]*os.File{},
		jobs: jobTable{jobs: map[string]*job{}}, claimed: make(chan struct{}), forwards: map[string]*forwardPort{}}
	if !opts.AwaitClaim {
		close(s.claimed)
	}
	return s
}

// Claim gives an agent made with AwaitClaim the user its processes run
// as by default, and lets the requests waiting for it go on. Call it
// once.
func (s *Server) Claim(uid, gid uint32) {
	s.opts.DefaultUID, s.opts.DefaultGID = uid, gid // read only after claimed is closed
	close(s.claimed)
}

// Serve runs an agent with opts on conn; see Server.Serve.
func Serve(conn io.ReadWriteCloser, opts ServerOptions) error {
	return NewServer(opts).Serve(conn)
}

// Serve runs the agent on conn until the host goes away. It returns the
// reason the session ended. Sessions may follow one another (a host that
// restarted connects again); processes started in one outlive it.
func (s *Server) Serve(conn io.ReadWriteCloser) error {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	// Forwarded connections beyond what the host serves at once wait to
	// be taken (see the host's maxForwardStreams), however long that is,
	// rather than being reset (more streams unacknowledged than its
	// backlog) or ending the session (one unacknowledged for 75 s).
	cfg.AcceptBacklog, cfg.StreamOpenTimeout = forwardBacklog, 0
	sess, err := yamux.Server(conn, cfg)
	if err != nil {
		return err
	}
	s.sess = sess
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 30 * time.Second}
	err = srv.Serve(sess) // yamux.Session is a net.Listener of host-opened streams
	sess.Close()
	return err
}

// ReapOrphans waits for children that are not the agent's own execs:
// processes orphaned inside the machine, whose parent becomes the agent
// when it is PID 1. Its own execs are left to their waiters. It returns
// when stop is closed.
func (s *Server) ReapOrphans(stop <-chan struct{}) {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	defer signal.Stop(sigc)
	tick := time.NewTicker(time.Second) // a SIGCHLD may come while an own exec blocks the scan
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-sigc:
		case <-tick.C:
		}
		for s.reapOne() {
		}
	}
}

// reapOne reaps one exited orphan, if there is one that is not an own
// exec, and reports whether it did.
func (s *Server) reapOne() bool {
	s.mu.Lock() // held across Start and track in run, so no exec is mistaken for an orphan
	defer s.mu.Unlock()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		return false
	}
	pid := int(siginfoPID(&info))
	if pid == 0 {
		return false
	}
	if _, own := s.procs[pid]; own {
		return false
	}
	var ws syscall.WaitStatus
	_, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	return err == nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", s.health)
	mux.HandleFunc("POST /v1/exec", s.exec)
	mux.HandleFunc("POST /v1/signal/{pid}/{sig}", s.signal)
	mux.HandleFunc("POST /v1/resize/{pid}", s.resize)
	mux.HandleFunc("GET /v1/files/content", s.download)
	mux.HandleFunc("PUT /v1/files/content", s.upload)
	mux.HandleFunc("GET /v1/files/stat", s.stat)
	mux.HandleFunc("GET /v1/files/list", s.list)
	mux.HandleFunc("POST /v1/forward", s.forward)
	mux.HandleFunc("POST /v1/dial/{port}", s.dial)
	mux.HandleFunc("POST /v1/workspace/remount", s.remountWorkspace)
	mux.HandleFunc("POST /v1/clock", s.setClock)
	s.jobRoutes(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health" {
			select {
			case <-s.claimed:
			case <-r.Context().Done():
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

func fail(w http.ResponseWriter, status int, code, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(&Error{Code: code, Message: fmt.Sprintf(format, args...)})
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// maxExecBodyRest bounds what is read after an exec's line when it has no
// stdin: the host sends nothing more.
const maxExecBodyRest = 4096

// exec runs a process and streams its output as frames while it runs.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	body := bufio.NewReader(r.Body)
	line, err := body.ReadBytes('\n')
	var req ExecRequest
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err != nil || len(req.Argv) == 0 {
		fail(w, http.StatusBadRequest, "bad_request", "exec: want one JSON line with argv: %v", err)
		return
	}
	if req.Stdin {
		// stdin keeps arriving on the body while output streams back.
		http.NewResponseController(w).EnableFullDuplex()
	} else {
		// The body ends right after the line. Reading its end arms the
		// server's watch for the host hanging up, which ends r.Context()
		// and so the process (TestExecEndsWhenHostGivesUp): unread, a
		// host that gave up left the process running to its end.
		io.Copy(io.Discard, io.LimitReader(body, maxExecBodyRest))
	}
	w.Header().Set("Connection", "close") // one stream per exec: yamux streams are cheap
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	out := &frameWriter{w: w, rc: http.NewResponseController(w), started: make(chan struct{})}
	st := s.run(r.Context(), &req, body, out)
	b, _ := json.Marshal(st)
	out.frame(FrameExit, b)
}

// frameWriter serialises frames from stdout and stderr copiers and flushes
// each, so the host sees output as it is produced.
type frameWriter struct {
	mu      sync.Mutex
	w       io.Writer
	rc      *http.ResponseController
	started chan struct{} // closed once the started frame is out: output waits for it
}

func (f *frameWriter) frame(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := writeFrame(f.w, kind, p); err != nil {
		return err
	}
	return f.rc.Flush()
}

type streamWriter struct {
	f    *frameWriter
	kind byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	<-s.f.started
	for off := 0; off < len(p); off += maxFrame {
		if err := s.f.frame(s.kind, p[off:min(off+maxFrame, len(p))]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func (s *Server) run(ctx context.Context, req *ExecRequest, stdin io.Reader, out *frameWriter) ExitStatus {
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.Timeout))
		defer cancel()
	}
	cmd := s.command(req)
	if req.PTY {
		return s.runPTY(ctx, req, cmd, stdin, out)
	}
	cmd.Stdout = streamWriter{out, FrameStdout}
	cmd.Stderr = streamWriter{out, FrameStderr}
	var stdinW io.WriteCloser
	if req.Stdin {
		var err error
		if stdinW, err = cmd.StdinPipe(); err != nil {
			return ExitStatus{Code: -1, Error: err.Error()}
		}
	}
	s.mu.Lock()
	err := cmd.Start()
	if err == nil {
		s.procs[cmd.Process.Pid] = cmd
	}
	s.mu.Unlock()
	if err != nil {
		close(out.started)
		return ExitStatus{Code: -1, Error: err.Error()}
	}
	pid := cmd.Process.Pid
	defer s.untrack(pid)
	out.frame(FrameStarted, []byte(strconv.Itoa(pid)))
	close(out.started)
	if stdinW != nil {
		go func() {
			io.Copy(stdinW, stdin)
			stdinW.Close()
		}()
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var timedOut bool
	select {
	case err := <-done:
		return exitStatus(cmd, err, false)
	case <-ctx.Done():
		timedOut = ctx.Err() == context.DeadlineExceeded
		syscall.Kill(-pid, syscall.SIGKILL) // the whole process group
		return exitStatus(cmd, <-done, timedOut)
	}
}

// command prepares req's process: environment, directory, user, and a
// process group of its own so signals reach its children too.
func (s *Server) command(req *ExecRequest) *exec.Cmd {
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Dir = req.Dir
	uid, gid := s.opts.DefaultUID, s.opts.DefaultGID
	if req.UID != nil {
		uid = *req.UID
	}
	if req.GID != nil {
		gid = *req.GID
	}
	cmd.Env = append(append([]string(nil), s.opts.BaseEnv...), userEnv(uid)...)
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if uid != uint32(os.Getuid()) || gid != uint32(os.Getgid()) {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	}
	return cmd
}

// userEnv is what a login would set for uid, from the machine's
// /etc/passwd: HOME, USER, LOGNAME and SHELL. Programs such as claude keep
// their state under HOME.
func userEnv(uid uint32) []string {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return []string{"HOME=/"}
	}
	env := []string{"HOME=" + u.HomeDir, "USER=" + u.Username, "LOGNAME=" + u.Username}
	if shell := loginShell(u.Username); shell != "" {
		env = append(env, "SHELL="+shell)
	}
	return env
}

// loginShell reads a user's shell from /etc/passwd (os/user does not).
func loginShell(name string) string {
	data, _ := os.ReadFile("/etc/passwd")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Split(line, ":"); len(f) == 7 && f[0] == name {
			return f[6]
		}
	}
	return ""
}

func exitStatus(cmd *exec.Cmd, err error, timedOut bool) ExitStatus {
	st := ExitStatus{TimedOut: timedOut}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		st.Code, st.Signal = -1, ws.Signal().String()
	case cmd.ProcessState != nil:
		st.Code = cmd.ProcessState.ExitCode()
	default:
		st.Code, st.Error = -1, fmt.Sprint(err)
	}
	return st
}

func (s *Server) untrack(pid int) {
	s.mu.Lock()
	delete(s.procs, pid)
	s.mu.Unlock()
}

var signals = map[string]syscall.Signal{"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT,
	"HUP": syscall.SIGHUP, "QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT}

// signal sends a signal to a process the agent started (its group).
func (s *Server) signal(w http.ResponseWriter, r *http.Request) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	sig, ok := signals[strings.ToUpper(strings.TrimPrefix(r.PathValue("sig"), "SIG"))]
	if err != nil || !ok {
		fail(w, http.StatusBadRequest, "bad_request", "signal: want a pid and one of TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT")
		return
	}
	s.mu.Lock()
	_, mine := s.procs[pid]
	s.mu.Unlock()
	if !mine {
		fail(w, http.StatusNotFound, "not_found", "signal: no running process %d started by the agent", pid)
		return
	}
	if err := syscall.Kill(-pid, sig); err != nil {
		fail(w, http.StatusConflict, "gone", "signal %d: %v", pid, err)
		return
	}
	reply(w, map[string]int{"pid": pid})
}

// confine resolves p and checks it lies under an allowed root. With parent
// the file itself may not exist yet; its directory must.
func (s *Server) confine(p string, parent bool) (string, error) {
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: %q is not an absolute path", ErrOutside, p)
	}
	real, err := filepath.EvalSymlinks(p)
	if parent && errors.Is(err, fs.ErrNotExist) {
		var dir string
		if dir, err = filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
			real = filepath.Join(dir, filepath.Base(p))
		}
	}
	if err != nil {
		return "", err
	}
	for _, root := range s.opts.Roots {
		if rel, err := filepath.Rel(root, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return real, nil
		}
	}
	return "", fmt.Errorf("%w: %q", ErrOutside, p)
}

func (s *Server) fileError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrOutside):
		fail(w, http.StatusForbidden, "outside", "%v", err)
	case errors.Is(err, fs.ErrNotExist):
		fail(w, http.StatusNotFound, "not_found", "%v", err)
	case errors.Is(err, ErrTooLarge):
		fail(w, http.StatusRequestEntityTooLarge, "too_large", "%v", err)
	default:
		fail(w, http.StatusInternalServerError, "io", "%v", err)
	}
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	p, err := s.confine(r.URL.Query().Get("path"), false)
	if err != nil {
		s.fileError(w, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		s.fileError(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.IsDir() {
		s.fileError(w, fmt.Errorf("download %s: not a regular file", p))
		return
	}
	if fi.Size() > s.opts.MaxFileSize {
		s.fileError(w, fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrTooLarge, p, fi.Size(), s.opts.MaxFileSize))
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	io.Copy(w, f)
}

// upload writes the body to a temporary file beside the target and renames
// it into place, so a cut-off upload leaves the old file as it was.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p, err := s.confine(q.Get("path"), true)
	if err != nil {
		s.fileError(w, err)
		return
	}
	mode := os.FileMode(0o644)
	if m, err := strconv.ParseUint(q.Get("mode"), 8, 32); err == nil {
		mode = os.FileMode(m) & os.ModePerm
	}
	var n int64
	err = atomicfile.Write(p, mode, func(tmp *os.File) error {
		var err error
		n, err = io.Copy(tmp, io.LimitReader(r.Body, s.opts.MaxFileSize+1))
		if err == nil && n > s.opts.MaxFileSize {
			err = fmt.Errorf("%w: upload to %s is over the limit of %d bytes", ErrTooLarge, p, s.opts.MaxFileSize)
		}
		if err != nil {
			return err
		}
		// Files put in the machine belong to its user unless asked.
		uid, gid := s.opts.DefaultUID, s.opts.DefaultGID
		if v, perr := strconv.ParseUint(q.Get("uid"), 10, 32); perr == nil {
			uid = uint32(v)
		}
		if v, perr := strconv.ParseUint(q.Get("gid"), 10, 32); perr == nil {
			gid = uint32(v)
		}
		return tmp.Chown(int(uid), int(gid))
	})
	if err != nil {
		s.fileError(w, err)
		return
	}
	reply(w, map[string]int64{"size": n})
}

func info(name string, fi os.FileInfo) FileInfo {
	return FileInfo{Name: name, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), ModTime: fi.ModTime(), IsDir: fi.IsDir()}
}

func (s *Server) stat(w http.ResponseWriter, r *http.Request) {
	p, err := s.confine(r.URL.Query().Get("path"), false)
	if err != nil {
		s.fileError(w, err)
		return
	}
	fi, err := os.Stat(p)
	if err != nil {
		s.fileError(w, err)
		return
	}
	reply(w, info(p, fi))
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	p, err := s.confine(r.URL.Query().Get("path"), false)
	if err != nil {
		s.fileError(w, err)
		return
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		s.fileError(w, err)
		return
	}
	out := make([]FileInfo, 0, len(ents))
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			out = append(out, info(e.Name(), fi))
		}
	}
	reply(w, out)
}

// forward listens on a loopback port inside the machine; every connection
// to it becomes a stream to the host, which connects it to the service
// named in the request. The port outlives the session that asked for it:
// while no host is connected (a daemon restarting, its agents left
// running), connections to it wait up to forwardWait for the next host
// that asks for the same forward, instead of being refused, so a client
// inside that reconnects at once (an agent CLI's MCP client) finds its
// service again.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Listen string `json:"listen"`
		Name   string `json:"name"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil || req.Name == "" {
		fail(w, http.StatusBadRequest, "bad_request", "forward: want {\"listen\": \"127.0.0.1:PORT\", \"name\": SERVICE}")
		return
	}
	host, _, err := net.SplitHostPort(req.Listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		fail(w, http.StatusBadRequest, "bad_request", "forward: listen address %q must be on loopback", req.Listen)
		return
	}
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if f := s.forwards[req.Listen]; f != nil {
		if !f.take(s.sess, req.Name) {
			fail(w, http.StatusConflict, "listen", "forward: %s already forwards to %q for a connected host", req.Listen, f.name)
			return
		}
		reply(w, map[string]string{"listen": req.Listen, "name": req.Name})
		return
	}
	ln, err := net.Listen("tcp", req.Listen)
	if err != nil {
		fail(w, http.StatusConflict, "listen", "forward: %v", err)
		return
	}
	f := &forwardPort{ln: ln, next: make(chan struct{}), waiting: make(chan struct{}, forwardWaiting)}
	f.take(s.sess, req.Name)
	s.forwards[ln.Addr().String()] = f
	go f.accept()
	reply(w, map[string]string{"listen": ln.Addr().String(), "name": req.Name})
}

// forwardWait bounds how long a connection to a forwarded port waits for
// a host: a daemon's restart, with its machines left running. At most
// forwardWaiting connections wait on one port; more are closed at once,
// as a refused one would be, so a process inside that opens connections
// in a loop while no host is there holds a bounded number of descriptors
// and goroutines, not one per connection for a minute each.
const (
	forwardWait    = time.Minute
	forwardWaiting = 64
)

// forwardPort is one forwarded port and the host session it serves.
type forwardPort struct {
	ln   net.Listener
	mu   sync.Mutex
	sess *yamux.Session
	name string
	hdr  []byte        // the stream header naming the service
	next chan struct{} // closed when a session takes the port
	// waiting holds a token for each connection waiting for a host.
	waiting chan struct{}
}

// take gives the port to sess for the service name. A port still served
// to another connected session, for another service, is not taken.
func (f *forwardPort) take(sess *yamux.Session, name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sess != nil && !f.sess.IsClosed() && f.name != name {
		return false
	}
	hdr, _ := json.Marshal(Forward{Name: name})
	f.sess, f.name, f.hdr = sess, name, append(hdr, '\n')
	close(f.next)
	f.next = make(chan struct{})
	return true
}

func (f *forwardPort) current() (*yamux.Session, []byte, chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sess, f.hdr, f.next
}

func (f *forwardPort) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		go f.serve(c)
	}
}

// serve connects c to the host's service through the current session, or
// through the next one to take the port within forwardWait.
func (f *forwardPort) serve(c net.Conn) {
	defer c.Close()
	timeout := time.NewTimer(forwardWait)
	defer timeout.Stop()
	for {
		sess, hdr, next := f.current()
		if !sess.IsClosed() {
			if st, err := sess.OpenStream(); err == nil {
				defer st.Close()
				if _, err := st.Write(hdr); err == nil {
					splice(c, st)
				}
				return
			}
		}
		if !f.waitForHost(next, timeout.C) {
			return
		}
	}
}

// waitForHost waits, while no host serves the port, until next closes (a
// host took the port) or timeout fires, and reports whether a host came.
// It refuses to wait (false) when forwardWaiting connections already do.
func (f *forwardPort) waitForHost(next chan struct{}, timeout <-chan time.Time) bool {
	select {
	case f.waiting <- struct{}{}:
		defer func() { <-f.waiting }()
	default:
		return false
	}
	select {
	case <-next:
		return true
	case <-timeout:
		return false
	}
}

// dial connects to 127.0.0.1:port inside the machine (its own network
// namespace) and, once connected, turns the request's stream into that
// connection: the answer is 101 Switching Protocols, then raw bytes both
// ways. A port nothing listens on answers 502 before any switch.
func (s *Server) dial(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err == nil {
		err = CheckPort(port)
	}
	if err != nil {
		fail(w, http.StatusBadRequest, "bad_request", "dial: %v", err)
		return
	}
	var d net.Dialer
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	cancel()
	if err != nil {
		fail(w, http.StatusBadGateway, "refused", "dial 127.0.0.1:%d in the machine: %v", port, err)
		return
	}
	defer c.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		fail(w, http.StatusInternalServerError, "io", "dial: %v", err)
		return
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"); err != nil {
		return
	}
	if n := brw.Reader.Buffered(); n > 0 { // bytes the host sent after the request
		buf, _ := brw.Reader.Peek(n)
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
	splice(c, conn)
}

// splice copies both ways until either side is done.
func splice(a, b io.ReadWriteCloser) {
	done := make(chan struct{}, 2)
	cp := func(dst, src io.ReadWriteCloser) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	h := Health{Uptime: Duration(time.Since(s.started)), AgentPID: os.Getpid(), AgentIsInit: os.Getpid() == 1}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		h.Load1 = float64(si.Loads[0]) / 65536
		h.MemTotal = si.Totalram * uint64(si.Unit)
		h.MemFree = (si.Freeram + si.Bufferram) * uint64(si.Unit)
	}
	var st syscall.Statfs_t
	if syscall.Statfs("/", &st) == nil {
		h.DiskTotal, h.DiskFree = st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize)
	}
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				h.Processes++
			}
		}
	}
	reply(w, h)
}

// setClock runs the machine's SetClock hook with the time the host sent.
func (s *Server) setClock(w http.ResponseWriter, r *http.Request) {
	if s.opts.SetClock == nil {
		fail(w, http.StatusNotImplemented, "not_supported", "this machine's agent does not set the clock: only a VM has a clock of its own")
		return
	}
	var req struct {
		Time int64 `json:"time"` // Unix nanoseconds
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil || req.Time <= 0 {
		fail(w, http.StatusBadRequest, "bad_request", "clock: want {\"time\": UNIX_NANOSECONDS}")
		return
	}
	if err := s.opts.SetClock(time.Unix(0, req.Time)); err != nil {
		fail(w, http.StatusInternalServerError, "clock_failed", "set the clock: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// remountWorkspace runs the machine's RemountWorkspace hook.
func (s *Server) remountWorkspace(w http.ResponseWriter, r *http.Request) {
	if s.opts.RemountWorkspace == nil {
		fail(w, http.StatusNotImplemented, "not_supported", "this machine's agent cannot mount its workspace again: only a VM's workspace, whose device can be unplugged, needs it")
		return
	}
	if err := s.opts.RemountWorkspace(r.Context()); err != nil {
		fail(w, http.StatusInternalServerError, "remount_failed", "mount the workspace again: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
