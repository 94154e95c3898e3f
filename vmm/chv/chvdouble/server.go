package chvdouble

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"golang.org/x/sys/unix"

	"hearth/vmm/chv/api"
)

// Version is what vmm.ping reports: upstream's version the double follows,
// marked as the double.
const Version = "v53.0-chvdouble"

// Options configure one double, as the command line configures upstream.
type Options struct {
	APISocket string // --api-socket path=...
	// Guest is the guest agent binary started as a host process on boot.
	Guest string
	Log   *slog.Logger // --log-file; nil: discard
	// Subreaper makes this process the guest's subreaper (the command
	// sets it; a process running more than one double must not): what
	// the guest orphans, such as a command started in the background,
	// becomes this process's child, as in a VM it would be its init's,
	// so pause, resume and power-off reach it, and it is reaped when it
	// ends. Without it an orphan leaves the guest, and a pause leaves it
	// running.
	Subreaper bool
}

// VMM is one double: one API socket, at most one VM.
type VMM struct {
	opts   Options
	router routers.Router
	ln     net.Listener
	lock   *os.File
	srv    *http.Server

	mu       sync.Mutex
	vm       *vm // nil: no VM
	nextDev  int
	done     chan struct{}
	doneOnce sync.Once
}

var _ api.ServerInterface = (*VMM)(nil)

// Listen takes upstream's lock on <socket>.lock, removes a stale socket
// and listens, as upstream does before serving.
func Listen(opts Options) (*VMM, error) {
	if opts.APISocket == "" {
		return nil, errors.New("chv-double: --api-socket path=PATH is required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	doc, err := openapi3.NewLoader().LoadFromData(api.Document)
	if err != nil {
		return nil, fmt.Errorf("load API document: %w", err)
	}
	doc.Servers = nil // routes are matched after /api/v1 is stripped
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("API document: %w", err)
	}
	lock, err := os.OpenFile(opts.APISocket+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("API socket %s is in use by another VMM: %w", opts.APISocket, err)
	}
	os.Remove(opts.APISocket)
	ln, err := net.Listen("unix", opts.APISocket)
	if err != nil {
		lock.Close()
		return nil, err
	}
	if opts.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			ln.Close()
			lock.Close()
			return nil, fmt.Errorf("become the guest's subreaper: %w", err)
		}
	}
	v := &VMM{opts: opts, router: router, ln: ln, lock: lock, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("/api/v1/", http.StripPrefix("/api/v1", v.validate(api.HandlerWithOptions(v, api.StdHTTPServerOptions{
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) { fail(w, http.StatusBadRequest, err.Error()) },
	}))))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
	})
	v.srv = &http.Server{Handler: mux, MaxHeaderBytes: 1 << 16}
	return v, nil
}

// Serve answers the API until vmm.shutdown, or until the guest agent
// exits by itself (a guest power-off), then removes the socket.
func (v *VMM) Serve() error {
	errc := make(chan error, 1)
	go func() { errc <- v.srv.Serve(v.ln) }()
	if v.opts.Subreaper {
		go v.reapOrphans()
	}
	var err error
	select {
	case <-v.done:
	case err = <-errc:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v.srv.Shutdown(ctx)
	v.mu.Lock()
	if v.vm != nil {
		v.vm.stop()
		v.vm = nil
	}
	v.mu.Unlock()
	os.Remove(v.opts.APISocket)
	v.lock.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// reapOrphans reaps the guest's orphans (see Options.Subreaper) as they
// end, until the double does. It scans under the lock, while no helper
// the double runs and waits for itself (nsenter) is running, and leaves
// the agent to its own waiter.
func (v *VMM) reapOrphans() {
	sigc := make(chan os.Signal, 1) // one pending signal stands for every child that ended since the last scan
	signal.Notify(sigc, syscall.SIGCHLD)
	defer signal.Stop(sigc)
	for {
		select {
		case <-v.done:
			return
		case <-sigc:
		}
		v.mu.Lock()
		v.reapEnded()
		v.mu.Unlock()
	}
}

// reapEnded reaps every ended child but the agent.
func (v *VMM) reapEnded() {
	self := os.Getpid()
	for _, p := range processes() {
		if p.ppid != self || !p.ended || (v.vm != nil && v.vm.agent != nil && v.vm.agent.cmd.Process.Pid == p.pid) {
			continue
		}
		var ws syscall.WaitStatus
		syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
	}
}

func (v *VMM) exit() { v.doneOnce.Do(func() { close(v.done) }) }

// validate refuses a request the document does not allow, with 400 as
// upstream answers a body it cannot parse.
func (v *VMM) validate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 4<<20 {
			fail(w, http.StatusBadRequest, "request body over 4 MiB")
			return
		}
		route, params, err := v.router.FindRoute(r)
		if errors.Is(err, routers.ErrMethodNotAllowed) {
			fail(w, http.StatusBadRequest, fmt.Sprintf("%s %s: method not allowed", r.Method, r.URL.Path))
			return
		} else if err != nil {
			fail(w, http.StatusNotFound, fmt.Sprintf("%s %s: no such endpoint", r.Method, r.URL.Path))
			return
		}
		in := &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route}
		if err := openapi3filter.ValidateRequest(r.Context(), in); err != nil {
			v.opts.Log.Info("refused", "method", r.Method, "path", r.URL.Path, "err", err)
			fail(w, http.StatusBadRequest, "Error from API", "invalid request to "+r.URL.Path, err.Error())
			return
		}
		v.opts.Log.Info("request", "method", r.Method, "path", r.URL.Path)
		next.ServeHTTP(w, r)
	})
}

// fail answers with upstream's error body: a JSON array of strings.
func fail(w http.ResponseWriter, code int, msgs ...string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(msgs)
}

func reply(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}

func decode(r *http.Request, dst any) error {
	return json.NewDecoder(r.Body).Decode(dst)
}

// apiError is an error with the status upstream sends for it.
type apiError struct {
	code int
	msgs []string
}

func (e *apiError) Error() string { return strings.Join(e.msgs, ": ") }

func notCreated(call string) error {
	return &apiError{http.StatusNotFound, []string{"Error from API", "The VM could not " + call, "VM is not created"}}
}

func wrongState(call, why string) error {
	return &apiError{http.StatusInternalServerError, []string{"Error from API", "The VM could not " + call, why}}
}

func failed(call string, err error) error {
	var ae *apiError
	if err == nil || errors.As(err, &ae) {
		return err
	}
	return &apiError{http.StatusInternalServerError, []string{"Error from API", "The VM could not " + call, err.Error()}}
}

// answer sends err as upstream would, or 204 when it is nil.
func answer(w http.ResponseWriter, err error) {
	var ae *apiError
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.As(err, &ae):
		fail(w, ae.code, ae.msgs...)
	default:
		fail(w, http.StatusInternalServerError, "Error from API", err.Error())
	}
}

func (v *VMM) GetVmmPing(w http.ResponseWriter, r *http.Request) {
	pid := int64(os.Getpid())
	build := Version + " (test double)"
	reply(w, http.StatusOK, api.VmmPingResponse{Version: Version, BuildVersion: &build, Pid: &pid, Features: &[]string{}})
}

func (v *VMM) ShutdownVMM(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	if v.vm != nil {
		v.vm.stop()
		v.vm = nil
	}
	v.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	v.exit()
}

func (v *VMM) CreateVM(w http.ResponseWriter, r *http.Request) {
	var cfg api.VmConfig
	if err := decode(r, &cfg); err != nil {
		fail(w, http.StatusBadRequest, "Error from API", "invalid VM configuration", err.Error())
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm != nil {
		answer(w, wrongState("be created", "VM is already created"))
		return
	}
	v.vm = &vm{vmm: v, config: cfg, state: api.Created}
	answer(w, nil)
}

func (v *VMM) DeleteVM(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm != nil {
		v.vm.stop()
		v.vm = nil
	}
	answer(w, nil)
}

func (v *VMM) BootVM(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.vm == nil:
		answer(w, notCreated("boot"))
	case v.vm.state != api.Created:
		answer(w, wrongState("boot", "VM is already running"))
	default:
		answer(w, failed("boot", v.vm.start(api.Running)))
	}
}

func (v *VMM) GetVmInfo(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm == nil {
		answer(w, notCreated("be found"))
		return
	}
	reply(w, http.StatusOK, v.vm.info())
}

func (v *VMM) PauseVM(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm == nil || v.vm.state != api.Running {
		answer(w, wrongState("pause", "VM is not running"))
		return
	}
	answer(w, failed("pause", v.vm.pause()))
}

func (v *VMM) ResumeVM(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm == nil || v.vm.state != api.Paused {
		answer(w, wrongState("resume", "VM is not paused"))
		return
	}
	answer(w, failed("resume", v.vm.resume()))
}

func (v *VMM) ShutdownVM(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm == nil || (v.vm.state != api.Running && v.vm.state != api.Paused) {
		answer(w, wrongState("shut down", "VM is not running"))
		return
	}
	v.vm.stop()
	v.vm.state = api.Created // the config stays: it can boot again
	answer(w, nil)
}

func (v *VMM) PutVmAddFs(w http.ResponseWriter, r *http.Request) {
	var fs api.FsConfig
	if err := decode(r, &fs); err != nil {
		fail(w, http.StatusBadRequest, "Error from API", "invalid virtio-fs configuration", err.Error())
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm == nil {
		answer(w, notCreated("add a virtio-fs device"))
		return
	}
	info, err := v.vm.addFs(fs)
	if err != nil {
		answer(w, failed("add a virtio-fs device", err))
	} else if info != nil {
		reply(w, http.StatusOK, info)
	} else {
		answer(w, nil)
	}
}

func (v *VMM) PutVmRemoveDevice(w http.ResponseWriter, r *http.Request) {
	var rm api.VmRemoveDevice
	if err := decode(r, &rm); err != nil {
		fail(w, http.StatusBadRequest, "Error from API", "invalid device removal", err.Error())
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm == nil {
		answer(w, notCreated("remove a device"))
		return
	}
	id := ""
	if rm.Id != nil {
		id = *rm.Id
	}
	answer(w, v.vm.removeDevice(id))
}

func (v *VMM) PutVmSnapshot(w http.ResponseWriter, r *http.Request) {
	var sc api.VmSnapshotConfig
	if err := decode(r, &sc); err != nil {
		fail(w, http.StatusBadRequest, "Error from API", "invalid snapshot configuration", err.Error())
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm == nil || v.vm.state != api.Paused {
		answer(w, wrongState("be snapshotted", "VM is not paused: pause it before a snapshot"))
		return
	}
	dst := ""
	if sc.DestinationUrl != nil {
		dst = *sc.DestinationUrl
	}
	answer(w, failed("be snapshotted", v.vm.snapshot(dst)))
}

func (v *VMM) PutVmRestore(w http.ResponseWriter, r *http.Request) {
	var rc api.RestoreConfig
	if err := decode(r, &rc); err != nil {
		fail(w, http.StatusBadRequest, "Error from API", "invalid restore configuration", err.Error())
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.vm != nil {
		answer(w, wrongState("be restored", "VM is already created: restore needs a fresh VMM"))
		return
	}
	dir, err := fileURL(rc.SourceUrl)
	if err != nil {
		answer(w, &apiError{http.StatusBadRequest, []string{"Error from API", "The VM could not be restored", err.Error()}})
		return
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	var cfg api.VmConfig
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		answer(w, failed("be restored", fmt.Errorf("read snapshot %s: %w", dir, err)))
		return
	}
	state := api.Paused
	if rc.Resume != nil && *rc.Resume {
		state = api.Running
	}
	m := &vm{vmm: v, config: cfg, state: api.Created}
	if err := m.start(state); err != nil {
		answer(w, failed("be restored", err))
		return
	}
	v.vm = m
	answer(w, nil)
}

// fileURL is the directory of a file:// URL, which must exist.
func fileURL(u string) (string, error) {
	dir, ok := strings.CutPrefix(u, "file://")
	if !ok || !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%q is not a file:// URL of an absolute path", u)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%s: not a directory", dir)
	}
	return dir, nil
}

// guestExited is told when the agent ended by itself: the guest powered
// off, so the VMM goes, as upstream's does without --no-shutdown.
func (v *VMM) guestExited(m *vm) {
	v.mu.Lock()
	if v.vm == m {
		v.opts.Log.Info("guest powered off: exiting")
		m.stop()
		v.vm = nil
		v.mu.Unlock()
		v.exit()
		return
	}
	v.mu.Unlock()
}
