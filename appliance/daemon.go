package appliance

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"hearth/fs"
	"hearth/fs/remote"
	"hearth/vmm"
	"hearth/vmm/jail"
)

// Daemon is a running appliance: the store, its host view, the image
// cache, the machine driver, the sandboxes, the agents and the API.
type Daemon struct {
	cfg    Config
	store  *fs.Store
	view   *fs.View
	wsAddr string // where the workspace is served to nodes; "" not served
	// wsID names the workspace when nodes share it (remote.WorkspaceID):
	// served from here or reached through wsClient; "" when it is this
	// daemon's alone.
	wsID string
	// wsClient reaches the workspace node when another node holds the
	// workspace (workspace.remote); nil when this daemon's store is it.
	wsClient *remote.Client
	images   *imageService
	sbx      *sandboxManager
	ports    *previews // the sandboxes' exposed ports
	agents   *agentService
	sched    *scheduleService
	srv      *http.Server
	ln       net.Listener
	// tcp serves the same API on api.tcp, behind the token; nil when
	// there is none.
	tcpSrv *http.Server
	tcpLn  net.Listener
	token  string
	// browsers are the dashboard's sessions on tcp, signed in with token.
	browsers *sessions
	log      *slog.Logger

	// driver makes the machines of sandboxes and agent executions alike;
	// nil (and driverErr says why) when there can be none.
	driver    vmm.Driver
	driverErr error
	tier      tierChoice // which tier the driver is, and why

	// undo closes what Start opened, last first.
	undo closers
	// stopSched and stopAgents stop the scheduler and the executions,
	// once: Close does it before stopping the API.
	stopSched, stopAgents func()

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
//
// ctx bounds the start only (the tier probe, fetching the VM kernel,
// attesting the tier): cancelled, Start closes what it opened, in
// reverse, and returns an error wrapping ctx's. The daemon then lives
// until Close. log nil logs text to stderr.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if err := secureStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log}
	steps := []func(context.Context) error{
		d.openSocket, d.openTCP, d.openWorkspace, d.openDriver,
		d.openSandboxes, d.openAgents, d.openCluster, d.openSchedules, d.openAPI,
	}
	for _, step := range steps {
		err := ctx.Err()
		if err != nil {
			err = fmt.Errorf("start cancelled: %w", err)
		} else {
			err = step(ctx)
		}
		if err != nil {
			if uerr := d.undo.unwind(); uerr != nil {
				log.Warn("closing what the failed start opened", "err", uerr)
			}
			return nil, err
		}
	}
	return d, nil
}

// closers are the closes of what Start opened, pushed as each part opens
// and unwound in reverse by a failed start and by Close alike, so the
// teardown order is written once.
type closers []closer

type closer struct {
	name  string
	close func() error
}

func (c *closers) push(name string, close func() error) {
	*c = append(*c, closer{name, close})
}

// unwind closes everything pushed, last first, and returns every error.
func (c *closers) unwind() error {
	var errs []error
	for i := len(*c) - 1; i >= 0; i-- {
		if err := (*c)[i].close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", (*c)[i].name, err))
		}
	}
	*c = nil
	return errors.Join(errs...)
}

// openSocket takes the API socket unless another daemon answers on it.
func (d *Daemon) openSocket(context.Context) error {
	sock := d.cfg.SocketPath()
	if c, err := net.DialTimeout("unix", sock, 200*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("another hearth daemon is serving %s: stop it first", sock)
	}
	os.Remove(sock) // stale socket from a crash
	ln, err := listenPrivate(sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	d.ln = ln
	d.undo.push("api socket", func() error {
		ln.Close() // closed already once the API served on it
		os.Remove(sock)
		return nil
	})
	return nil
}

// openTCP takes api.tcp, if set, and reads (or makes) the token that
// guards it.
func (d *Daemon) openTCP(context.Context) error {
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
	d.undo.push("api.tcp", func() error {
		ln.Close() // closed already once the API served on it
		return nil
	})
	return nil
}

// openWorkspace opens the workspace store and mounts its host view.
func (d *Daemon) openWorkspace(ctx context.Context) error {
	store, err := fs.Open(fs.Options{Dir: filepath.Join(d.cfg.StateDir, "workspace")})
	if err != nil {
		return err
	}
	d.store = store
	d.undo.push("workspace store", store.Close)
	for _, damage := range store.Damage() {
		d.log.Warn("workspace damaged", "damage", damage)
	}
	if n, err := store.CleanArchiveLeftovers(); err != nil {
		d.log.Warn("workspace: removing what archives left", "err", err)
	} else if n > 0 {
		d.log.Info("workspace: removed what interrupted archive downloads and uploads left", "count", n)
	}
	if d.view, err = store.Mount(d.cfg.Workspace.Mount, fs.ViewOptions{Host: true, AllowOther: d.cfg.Workspace.AllowOther}); err != nil {
		return err
	}
	d.undo.push("workspace view", d.view.Unmount)
	d.watchWorkspaceHealth(store)
	if err := d.serveWorkspace(store); err != nil {
		return err
	}
	return d.useRemoteWorkspace(ctx)
}

// openDriver opens the image cache and the machine driver of the tier
// the config asks for (or auto picks), attested, and moves the
// workspace's owners into the driver's id range.
func (d *Daemon) openDriver(ctx context.Context) error {
	var err error
	if d.images, err = newImageService(d.cfg.StateDir, d.log); err != nil {
		return err
	}
	var agent string
	d.driver, agent, d.tier, d.driverErr = newDriver(ctx, d.cfg, d.images, d.log)
	d.undo.push("machine driver", func() error { d.closeDriver(); return nil })
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start cancelled: %w", err)
	}
	if d.driver != nil {
		d.driver, d.tier, d.driverErr = attestTier(ctx, d.cfg, d.driver, d.tier, agent, d.store, d.log)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start cancelled: %w", err)
	}
	switch {
	case errors.Is(d.driverErr, errTierUnavailable):
		return d.driverErr // the config asks for what this host cannot run
	case errors.Is(d.driverErr, jail.ErrIDPool):
		return d.driverErr // host users own the ids the config gives machines
	case d.driver != nil:
		d.log.Info("machines ready", "tier", d.driver.Name(), "why", d.tier.Why, "guest_agent", agent)
	}
	return moveWorkspaceIDs(d.cfg.StateDir, d.store, d.driver, d.log)
}

func (d *Daemon) openSandboxes(context.Context) error {
	var err error
	if d.sbx, err = newSandboxManager(SandboxDeps{Config: d.cfg, Store: d.store, Images: d.images, Driver: d.driver, DriverErr: d.driverErr, Log: d.log, RemoteWorkspace: d.cfg.Workspace.Remote}); err != nil {
		return err
	}
	d.undo.push("sandboxes", d.sbx.Close)
	return nil
}

// openAgents opens the agent service; its close waits for the
// executions' goroutines (and, under Close, the API's) before closing
// the store they write to.
func (d *Daemon) openAgents(context.Context) error {
	var err error
	if d.agents, err = newAgentService(AgentDeps{Config: d.cfg, Driver: d.driver, DriverErr: d.driverErr, Workspace: d.store, Remote: d.wsClient, Images: d.images, WG: &d.wg, Log: d.log}); err != nil {
		return err
	}
	d.stopAgents = sync.OnceFunc(d.agents.Close)
	d.undo.push("agents", func() error {
		d.stopAgents()
		d.wg.Wait()
		return d.agents.closeStore()
	})
	return nil
}

// openSchedules starts the scheduler after the runner it delegates to.
func (d *Daemon) openSchedules(context.Context) error {
	var err error
	if d.sched, err = newScheduleService(ScheduleDeps{Config: d.cfg, Agents: d.agents, Log: d.log}); err != nil {
		return err
	}
	d.stopSched = sync.OnceFunc(d.sched.Close)
	d.undo.push("schedules", func() error { d.stopSched(); return nil })
	return d.sched.start()
}

// watchWorkspaceHealth logs when the workspace turns read-only (its
// journal found no space) and when it takes writes again.
func (d *Daemon) watchWorkspaceHealth(store *fs.Store) {
	sub := store.Events().Subscribe(1024)
	last := store.Health()
	if last != nil {
		d.log.Warn("workspace read-only", "err", last)
	}
	go func() { // ends when the store closes its bus
		for e := range sub.C {
			if e.Op != fs.OpHealth && e.Dropped == 0 {
				continue
			}
			if h := store.Health(); (h == nil) != (last == nil) {
				last = h
				if h == nil {
					d.log.Info("workspace writable again")
				} else {
					d.log.Warn("workspace read-only", "err", h)
				}
			}
		}
	}()
}

func (d *Daemon) closeDriver() {
	if c, ok := d.driver.(io.Closer); ok {
		c.Close()
	}
}

// openAPI serves the API. Its close first stops the scheduler and the
// running executions (at once, or once they finish under
// agents.on_shutdown = "finish"), while the API still answers, so that a
// client watching an execution sees it end; then it stops the servers,
// giving requests in flight a grace period.
func (d *Daemon) openAPI(context.Context) error {
	d.ports = newPreviews(d.cfg.API.TCP, d.isCredential, d.sbx, d.log)
	d.sbx.ports = d.ports
	d.undo.push("previews", d.ports.closeAll)
	h := d.routes()
	d.srv = d.serveOn(d.ln, guardBrowsers(h))
	if d.tcpLn != nil { // outermost, the guard covers signing in and out too
		d.tcpSrv = d.serveOn(d.tcpLn, guardBrowsers(requireToken(d.token, d.browsers, h)))
		d.log.Info("api also on tcp", "url", "http://"+d.tcpLn.Addr().String(), "token_file", d.cfg.TokenPath())
	}
	d.undo.push("api", func() error {
		d.stopSched() // before the runner its runs delegate to
		d.stopAgents()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, srv := range []*http.Server{d.srv, d.tcpSrv} {
			if srv != nil && srv.Shutdown(ctx) != nil {
				srv.Close() // streams still running after the grace period
			}
		}
		return nil
	})
	return nil
}

// isCredential says whether v is the API token or a dashboard session's
// id: what the API takes as bearer on api.tcp.
func (d *Daemon) isCredential(v string) bool {
	if v == "" || d.token == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(v), []byte(d.token)) == 1 || d.browsers.valid(v)
}

func (d *Daemon) serveOn(ln net.Listener, h http.Handler) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("api stopped serving", "addr", ln.Addr().String(), "err", err)
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
// end cancelled, their partial outputs kept), stops the API, lets go of
// the sandboxes (they keep running for the next daemon), unmounts the
// workspace, closes the stores and removes the socket: what Start opened,
// in reverse. Idempotent.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.undo.unwind() })
	return d.closeErr
}
