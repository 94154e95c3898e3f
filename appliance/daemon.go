package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/jail"
)

// Daemon is a running appliance: the store, its host view, the image
// cache, the machine driver, the sandboxes, the agents and the API.
type Daemon struct {
	cfg    Config
	store  *fs.Store
	view   *fs.View
	images *imageService
	sbx    *sandboxManager
	agents *agentService
	sched  *scheduleService
	srv    *http.Server
	ln     net.Listener
	// tcp serves the same API on api.tcp, behind the token; nil when
	// there is none.
	tcpSrv *http.Server
	tcpLn  net.Listener
	token  string
	// browsers are the dashboard's sessions on tcp, signed in with token.
	browsers *sessions
	log      *log.Logger

	// driver makes the machines of sandboxes and agent executions alike;
	// nil (and driverErr says why) when there can be none.
	driver    vmm.Driver
	driverErr error
	tier      tierChoice // which tier the driver is, and why

	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Start opens the store, mounts the host view, re-attaches to the
// sandboxes a previous daemon left running, marks the agent executions it
// left running interrupted (destroying their machines), starts the model
// gateway and serves the API. The API socket is taken first: it is what
// tells a second daemon on the same state to stop before it touches
// anything. A stale mount or socket left by a crashed daemon is cleaned
// up. Sandboxes or agents being unavailable (no guest agent, not root, no
// API key) is logged, not fatal: their routes then say why.
func Start(cfg Config, logger *log.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = log.New(os.Stderr, "hearth: ", log.LstdFlags)
	}
	if err := secureStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	ln, err := listen(cfg.SocketPath())
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, ln: ln, log: logger}
	err = d.listenTCP()
	if err == nil {
		err = d.open()
	}
	if err != nil {
		ln.Close()
		if d.tcpLn != nil {
			d.tcpLn.Close()
		}
		os.Remove(cfg.SocketPath())
		return nil, err
	}
	d.serve()
	return d, nil
}

// listen takes the API socket unless another daemon answers on it.
func listen(sock string) (net.Listener, error) {
	if c, err := net.DialTimeout("unix", sock, 200*time.Millisecond); err == nil {
		c.Close()
		return nil, fmt.Errorf("another hearth daemon is serving %s: stop it first", sock)
	}
	os.Remove(sock) // stale socket from a crash
	ln, err := listenPrivate(sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	return ln, nil
}

// listenTCP takes api.tcp, if set, and reads (or makes) the token that
// guards it.
func (d *Daemon) listenTCP() error {
	if d.cfg.API.TCP == "" {
		return nil
	}
	token, err := loadToken(d.cfg.TokenPath())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", d.cfg.API.TCP)
	if err != nil {
		return fmt.Errorf("api.tcp: %w", err)
	}
	d.token, d.tcpLn, d.browsers = token, ln, newSessions()
	return nil
}

// open brings up the workspace store, the host view, the images, the
// machine driver, the sandboxes and the agents.
func (d *Daemon) open() error {
	store, err := fs.Open(fs.Options{Dir: filepath.Join(d.cfg.StateDir, "workspace")})
	if err != nil {
		return err
	}
	for _, damage := range store.Damage() {
		d.log.Printf("workspace: %s", damage)
	}
	if d.view, err = store.Mount(d.cfg.Workspace.Mount, fs.ViewOptions{Host: true, AllowOther: d.cfg.Workspace.AllowOther}); err != nil {
		store.Close()
		return err
	}
	d.store = store
	d.watchWorkspaceHealth(store)
	logs := serviceLogger(d.log) // until Start takes a *slog.Logger
	if d.images, err = newImageService(d.cfg.StateDir, logs); err == nil {
		var agent string
		d.driver, agent, d.tier, d.driverErr = newDriver(d.cfg, d.images, d.log)
		if d.driver != nil {
			d.driver, d.tier, d.driverErr = attestTier(d.cfg, d.driver, d.tier, agent, store, d.log)
		}
		switch {
		case errors.Is(d.driverErr, errTierUnavailable):
			err = d.driverErr // the config asks for what this host cannot run
		case errors.Is(d.driverErr, jail.ErrIDPool):
			err = d.driverErr // host users own the ids the config gives machines
		case d.driver != nil:
			d.log.Printf("machines: %s tier (%s), guest agent %s", d.driver.Name(), d.tier.Why, agent)
		}
	}
	if err == nil {
		err = moveWorkspaceIDs(d.cfg.StateDir, store, d.driver, d.log)
	}
	if err == nil {
		d.sbx, err = newSandboxManager(SandboxDeps{Config: d.cfg, Store: store, Images: d.images, Driver: d.driver, DriverErr: d.driverErr, Log: logs})
	}
	if err == nil {
		d.agents, err = newAgentService(AgentDeps{Config: d.cfg, Driver: d.driver, DriverErr: d.driverErr, Workspace: store, Images: d.images, WG: &d.wg, Log: logs})
		if err != nil {
			d.sbx.Close()
		}
	}
	if err == nil {
		err = d.startSchedules()
	}
	if err != nil {
		d.closeDriver()
		d.view.Unmount()
		store.Close()
		return err
	}
	return nil
}

// watchWorkspaceHealth logs when the workspace turns read-only (its
// journal found no space) and when it takes writes again.
func (d *Daemon) watchWorkspaceHealth(store *fs.Store) {
	sub := store.Events().Subscribe(1024)
	last := store.Health()
	if last != nil {
		d.log.Printf("workspace: %v", last)
	}
	go func() { // ends when the store closes its bus
		for e := range sub.C {
			if e.Op != fs.OpHealth && e.Dropped == 0 {
				continue
			}
			if h := store.Health(); (h == nil) != (last == nil) {
				last = h
				if h == nil {
					d.log.Printf("workspace: writable again")
				} else {
					d.log.Printf("workspace: %v", h)
				}
			}
		}
	}()
}

// startSchedules starts the scheduler after the runner it delegates to;
// on failure it closes the agents and sandboxes open already.
func (d *Daemon) startSchedules() error {
	var err error
	if d.sched, err = newScheduleService(ScheduleDeps{Config: d.cfg, Agents: d.agents, Log: serviceLogger(d.log)}); err == nil {
		err = d.sched.start()
		if err != nil {
			d.sched.Close()
		}
	}
	if err != nil {
		d.agents.Close()
		d.wg.Wait()
		d.agents.closeStore()
		d.sbx.Close()
	}
	return err
}

func (d *Daemon) closeDriver() {
	if c, ok := d.driver.(io.Closer); ok {
		c.Close()
	}
}

func (d *Daemon) serve() {
	h := d.routes()
	d.srv = d.serveOn(d.ln, guardBrowsers(h))
	if d.tcpLn != nil { // outermost, the guard covers signing in and out too
		d.tcpSrv = d.serveOn(d.tcpLn, guardBrowsers(requireToken(d.token, d.browsers, h)))
		d.log.Printf("api: also on http://%s (token in %s)", d.tcpLn.Addr(), d.cfg.TokenPath())
	}
}

func (d *Daemon) serveOn(ln net.Listener, h http.Handler) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Printf("api on %s: %v", ln.Addr(), err)
		}
	}()
	return srv
}

// Tier is the isolation tier the daemon's machines use, and why it was
// picked.
func (d *Daemon) Tier() (tier, why string) { return d.tier.Tier, d.tier.Why }

// Socket is the unix socket the API is served on.
func (d *Daemon) Socket() string { return d.cfg.SocketPath() }

// TCPAddr is the address the API is served on over TCP, "" if none.
func (d *Daemon) TCPAddr() string {
	if d.tcpLn == nil {
		return ""
	}
	return d.tcpLn.Addr().String()
}

// Token is the token TCP requests must carry, "" without api.tcp.
func (d *Daemon) Token() string { return d.token }

// Hurry cuts short a Close that is waiting for executions to finish
// (agents.on_shutdown = "finish"): they are stopped at once.
func (d *Daemon) Hurry() { d.agents.Hurry() }

// Store is the workspace store (for tests and in-process callers).
func (d *Daemon) Store() *fs.Store { return d.store }

// Close stops the scheduler, then the running agent executions (at once,
// or once they finish under agents.on_shutdown = "finish"; those stopped
// end cancelled, their partial outputs kept), stops the API, lets go of the sandboxes (they
// keep running for the next daemon), unmounts the workspace and closes
// the stores. Idempotent.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.sched.Close() // before the runner its runs delegate to
		d.agents.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, srv := range []*http.Server{d.srv, d.tcpSrv} {
			if srv != nil && srv.Shutdown(ctx) != nil {
				srv.Close() // streams still running after the grace period
			}
		}
		d.wg.Wait()
		os.Remove(d.cfg.SocketPath())
		err := d.agents.closeStore()
		d.sbx.Close()
		d.closeDriver()
		if uerr := d.view.Unmount(); err == nil {
			err = uerr
		}
		if cerr := d.store.Close(); err == nil {
			err = cerr
		}
		d.closeErr = err
	})
	return d.closeErr
}
