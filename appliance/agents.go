package appliance

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"hearth/agents"
	"hearth/agents/channel"
	"hearth/agents/egress"
	"hearth/agents/gateway"
	"hearth/agents/inside"
	"hearth/agents/store"
	evstream "hearth/agents/stream"
	"hearth/fs"
	"hearth/fs/remote"
	"hearth/vmm"
)

// builtinPrices is the price table used when the config names none.
//
//go:embed prices.toml
var builtinPrices []byte

// agentService runs agent tasks for the API: the store of sessions,
// executions, events and credits, the metering gateway on a unix socket
// in the state directory, and the runner. Every execution runs in a
// goroutine counted by the daemon's WaitGroup, with the service's
// context: Close cancels it, so running executions end cancelled.
type agentService struct {
	cfg   Config
	store *store.Store
	// defs are the agent definitions, replaced whole by reload.
	defsMu sync.RWMutex
	defs   map[string]*agents.Definition
	ws     agentWorkspace // the daemon's own store
	// work is the workspace agents work in: ws, or the workspace node's
	// (workspace.remote).
	work   workspace
	images *imageService
	log    *slog.Logger
	// runner is nil when agents cannot run; unavailable says why.
	runner      *agents.Runner
	unavailable error
	// cluster is this daemon as a cluster's node; nil on a single host.
	cluster *clusterNode

	gw     *gateway.Gateway
	prices *gateway.Prices // the table in force, following [model] prices
	// otherPrices are the tables of the other providers served, by name.
	otherPrices map[string]*gateway.Prices
	gwSrv       *http.Server
	gwSock      string
	egress      *egress.Proxy
	egSrv       *http.Server
	egSock      string
	// inside is the hearth MCP server agents reach from their machines.
	inside *inside.Server
	inSrv  *http.Server
	inSock string

	ctx     context.Context
	cancel  context.CancelFunc
	stopped chan struct{}   // closed once Close has stopped every execution: streams end
	wg      *sync.WaitGroup // the daemon's

	// startMu makes the checks before a start and its acceptance one
	// step: two starts in one session cannot both pass the busy check.
	startMu sync.Mutex
	closed  bool // guarded by startMu

	mu   sync.Mutex
	runs map[string]*liveRun // by execution id, from acceptance to end

	hurry     chan struct{} // closed by Hurry
	hurryOnce sync.Once
}

// liveRun is an execution this daemon is running: what the gateway has
// metered so far (the store has the totals only once it ends), and a
// channel closed when it has ended.
type liveRun struct {
	turns  int
	usd    float64
	tokens store.Tokens
	done   chan struct{}
}

// AgentDeps is what an agentService is made of.
type AgentDeps struct {
	Config Config
	// Driver makes the executions' machines, shared with the sandboxes;
	// nil when there can be none, and DriverErr says why.
	Driver    vmm.Driver
	DriverErr error
	Workspace *fs.Store // where sessions live
	// Remote is the workspace node's store when another node holds the
	// workspace (workspace.remote); agents then work there.
	Remote *remote.Client
	Images *imageService
	WG     *sync.WaitGroup // the daemon's, for the servers it starts
	Log    *slog.Logger
}

// newAgentService opens the store (<state_dir>/hearth.db, or the
// cluster's PostgreSQL database), ends what a
// previous daemon left running, loads the agent definitions and, when it
// has a machine driver and an API key, starts the gateway and the runner.
// A store that cannot be opened, a key file or price table that cannot be
// read is fatal (the config is wrong); no driver or no key leaves agents
// unavailable, and their routes say why. A definition that does not load
// is logged and left out.
func newAgentService(deps AgentDeps) (*agentService, error) {
	cfg, driver, driverErr, ws, images, wg, logger := deps.Config, deps.Driver, deps.DriverErr, deps.Workspace, deps.Images, deps.WG, deps.Log
	db := filepath.Join(cfg.StateDir, "hearth.db")
	st, err := cfg.Cluster.openStore(db)
	if err != nil {
		return nil, err
	}
	clearUploads(cfg.StateDir, logger) // the store's lock makes this daemon the only one
	a := &agentService{cfg: cfg, store: st, ws: newAgentWorkspace(cfg, ws, driver), images: images, log: logger, wg: wg,
		runs: map[string]*liveRun{}, gwSock: filepath.Join(cfg.StateDir, "gateway.sock"),
		egSock: filepath.Join(cfg.StateDir, "egress.sock"), inSock: filepath.Join(cfg.StateDir, "hearth-mcp.sock"),
		stopped: make(chan struct{}), hurry: make(chan struct{})}
	a.work = a.ws
	if deps.Remote != nil {
		a.work = newRemoteWorkspace(cfg, deps.Remote, driver)
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	if _, problems := a.loadDefinitions(); len(problems) > 0 {
		a.log.Warn("agents: some definitions were not loaded", "problems", strings.Join(problems, "; "))
	}
	providers, missing, prices, err := cfg.gatewayProviders()
	if err != nil {
		st.Close()
		return nil, err
	}
	a.prices = prices
	prices.OnReload(a.pricesReloaded)
	a.otherPrices = map[string]*gateway.Prices{}
	for name, p := range providers {
		if name != gateway.ProviderAnthropic {
			a.otherPrices[name] = p.Prices
		}
	}
	switch {
	case driver == nil:
		a.unavailable = fmt.Errorf("no machines to run them in: %v", driverErr)
	case len(providers) == 0:
		a.unavailable = fmt.Errorf("no model API key: set %s in the daemon's environment or model.api_key_file in the config (or configure [providers.openai] or [providers.gemini] with a key)", cfg.model().APIKeyEnv)
	default:
		if len(missing) > 0 {
			a.log.Warn("model providers without an API key are not served", "providers", strings.Join(missing, ", "))
		}
		a.unavailable = a.startRunner(driver, providers)
	}
	a.recover(driver)
	if a.unavailable != nil {
		a.log.Warn("agents are unavailable", "err", a.unavailable)
	} else {
		a.log.Info("agents ready", "defined", len(a.names()), "dir", cfg.AgentsDir(),
			"agents", strings.Join(a.names(), ", "), "model_providers", strings.Join(sortedNames(providers), ", "), "credits", onOff(cfg.Credits.Enabled))
	}
	return a, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// apiKey reads the provider's key: from the file if one is named (an
// unreadable or empty one is an error), else from the variable; "" if
// neither has one.
func (m ModelConfig) apiKey() (string, error) {
	if m.APIKeyFile != "" {
		b, err := os.ReadFile(m.APIKeyFile)
		if err != nil {
			return "", fmt.Errorf("model.api_key_file: %w", err)
		}
		key := strings.TrimSpace(string(b))
		if key == "" {
			return "", fmt.Errorf("model.api_key_file: %s is empty", m.APIKeyFile)
		}
		return key, nil
	}
	if m.APIKeyEnv == "" {
		return "", nil
	}
	return strings.TrimSpace(os.Getenv(m.APIKeyEnv)), nil
}

// prices reads the configured price table, or the built-in one.
func (m ModelConfig) prices() (*gateway.Prices, error) {
	if m.Prices == "" {
		return gateway.ParsePrices(gateway.BuiltIn, builtinPrices)
	}
	p, err := gateway.LoadPrices(m.Prices)
	if err != nil {
		return nil, fmt.Errorf("model.prices: %w", err)
	}
	return p, nil
}

// startRunner serves the gateway and the egress proxy on their sockets
// and makes the runner.
func (a *agentService) startRunner(driver vmm.Driver, providers map[string]gateway.Provider) error {
	gw, err := gateway.New(gateway.Config{Providers: providers,
		Unpriced: a.cfg.model().Unpriced, Log: a.log,
		OnEvent: a.gatewayEvent, Record: a.recordCall})
	if err != nil {
		return err
	}
	a.gw = gw
	if a.gwSrv, err = a.serveUnix("model gateway", a.gwSock, gw, true); err != nil {
		return err
	}
	// Each agent reaches only the domains its definition's network list
	// names; with an empty list it has no network at all.
	a.egress = egress.New(egress.Config{OnEvent: func(ev evstream.Event) { a.runner.Event(ev) }})
	if a.egSrv, err = a.serveUnix("egress proxy", a.egSock, a.egress, true); err != nil {
		return err
	}
	// The hearth MCP server: each agent's tools, as its execution.
	a.inside = inside.New(insidePlatform{a})
	if a.inSrv, err = a.serveUnix("hearth MCP server", a.inSock, a.inside, true); err != nil {
		return err
	}
	dial := func(sock string) func(ctx context.Context) (net.Conn, error) {
		return func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }
	}
	secret, err := loadSecret(filepath.Join(a.cfg.StateDir, "runner.secret"))
	if err != nil {
		return err
	}
	callSnaps, err := agents.ParseRetention(a.cfg.Agents.CallSnapshots)
	if err != nil {
		return fmt.Errorf("agents.%w", err)
	}
	callSnaps.MaxBytes = int64(a.cfg.Agents.CallSnapshotBytes)
	a.runner = agents.NewRunner(agents.RunnerConfig{
		Driver: driver, Workspace: a.work, Store: a.store,
		Gateway: gw, GatewayDial: dial(a.gwSock),
		Egress: a.egress, EgressDial: dial(a.egSock),
		Inside: a.inside, InsideDial: dial(a.inSock),
		Images:   a.image,
		Agents:   a.definitions(),
		Grace:    time.Duration(a.cfg.Agents.Grace),
		OnBudget: a.cfg.Agents.OnBudget, BudgetWait: time.Duration(a.cfg.Agents.BudgetWait),
		MaxDepth: a.cfg.Agents.MaxDepth, MaxChildren: a.cfg.Agents.MaxChildren,
		Credits:       a.cfg.Credits.Enabled,
		Secret:        secret,
		Disk:          int64(a.cfg.Sandbox.Disk),
		CallSnapshots: callSnaps,
	})
	return nil
}

// serveUnix serves h on a unix socket only root can reach, until Close;
// channels: to connections that name the machine channel they come
// through (the gateway's and the egress proxy's, see package channel).
func (a *agentService) serveUnix(what, sock string, h http.Handler, channels bool) (*http.Server, error) {
	os.Remove(sock) // left by a daemon that died
	ln, err := listenPrivate(sock)
	if err != nil {
		return nil, fmt.Errorf("serve the %s: %w", what, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
	if channels {
		ln, srv.ConnContext = channel.Listener(ln), channel.ConnContext
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("agents: serve", "what", what, "err", err)
		}
	}()
	return srv, nil
}

// CLIOf is the agent CLI that runs d's tasks: its own cli, else the one
// its image's recipe names ("" for neither).
func (a *agentService) CLIOf(d agents.Definition) string {
	if d.CLI != "" {
		return d.CLI
	}
	return a.images.catalog.CLI(d.Image)
}

// image resolves an agent's runtime image: its root and its user.
func (a *agentService) image(name string) (agents.Image, error) {
	img, err := a.images.resolve(name)
	if err != nil {
		return agents.Image{}, err
	}
	acct, err := imageUser(img)
	if err != nil {
		return agents.Image{}, err
	}
	// The recipe's CLI, not the manifest's: it changes no byte of the
	// image, so it is not in the hash, and an image built before the
	// recipe named it is still current. A saved image has no recipe and
	// keeps its parent's.
	cli := a.images.catalog.CLI(name)
	if cli == "" {
		cli = img.CLI
	}
	return agents.Image{RootFS: img.Rootfs(), UID: acct.uid, GID: acct.gid, CLI: cli}, nil
}

// gatewayEvent hands the event to the runner (which stores it and stops
// an execution at a refused call); a model_call one comes here only when
// recordCall could not store it, and is tallied too.
func (a *agentService) gatewayEvent(ev evstream.Event) {
	a.tally(ev)
	a.runner.Event(ev)
}

// recordCall stores a model call's start or finish record before the
// gateway goes on (forwards the call, charges its budget), so that a
// daemon that dies leaves what the next start needs to settle it
// (agents.SettleCalls), and keeps the running tally.
func (a *agentService) recordCall(ev evstream.Event) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.store.Append(ctx, ev); err != nil {
		return err
	}
	a.tally(ev)
	return nil
}

// tally adds a model call's finish record to its run's running totals.
func (a *agentService) tally(ev evstream.Event) {
	if ev.Type != evstream.ModelCall {
		return
	}
	var p gateway.ModelCallPayload
	if json.Unmarshal(ev.Payload, &p) != nil || p.Phase == gateway.PhaseStart {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if lr := a.runs[ev.Execution]; lr != nil {
		if p.MessageID != "" && !p.Duplicate {
			lr.turns++
		}
		lr.usd += p.USD
		lr.tokens.Input += p.InputTokens
		lr.tokens.Output += p.OutputTokens
		lr.tokens.CacheRead += p.CacheReadTokens
		lr.tokens.CacheCreation += p.CacheCreationTokens
	}
}

// recover ends what a daemon that stopped or died left: executions still
// pending or running become interrupted (with a status event, and the
// outputs their agent's patterns match now), their machines are
// destroyed and their views unmounted. The exception are executions a
// daemon left running on purpose (agents.on_shutdown = "leave"): when
// their machine is still there and agents can run, they are taken up
// again and go on.
func (a *agentService) recover(driver vmm.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	left := a.leftRunning(ctx, driver)
	keep := make([]string, 0, len(left))
	for id := range left {
		keep = append(keep, id)
	}
	a.settleCalls(ctx, keep)
	list, err := a.store.InterruptRunning(ctx, keep...)
	if err != nil {
		a.log.Warn("agents: mark interrupted executions", "err", err)
	}
	for _, e := range list {
		if got, err := agents.RecordTotals(ctx, a.store, e.ID, a.cfg.Credits.Enabled); err != nil {
			a.log.Warn("execution", "id", e.ID, "err", err)
		} else {
			e = got
		}
		if def := a.def(e.Agent); def != nil {
			e = a.keepOutputs(ctx, e, def.Outputs)
		}
		ev := evstream.New(e.Session, e.ID, evstream.Status, map[string]any{"status": e.Status, "error": e.Error, "outputs": e.Outputs})
		if _, err := a.store.Append(ctx, ev); err != nil {
			a.log.Warn("execution", "id", e.ID, "err", err)
		}
		a.log.Info("execution interrupted", "id", e.ID, "agent", e.Agent, "session", e.Session, "error", e.Error)
	}
	if driver != nil {
		ids, _ := driver.List(ctx)
		for _, id := range ids {
			if !strings.HasPrefix(id, executionPrefix) || left[id] != nil {
				continue
			}
			m, err := driver.Recover(ctx, id)
			if err != nil {
				a.log.Warn("execution: the machine it left", "id", id, "err", err)
				continue
			}
			if err := m.Destroy(ctx); err != nil {
				a.log.Warn("execution: destroy the machine it left running", "id", id, "err", err)
			} else {
				a.log.Info("execution: destroyed the machine it left running", "id", id)
			}
		}
	}
	a.work.cleanStaleViews()
	for id, m := range left {
		a.reattach(id, m)
	}
}

// settleCalls settles the model calls of the executions a daemon that
// died was running (all but those in keep, left running on purpose): a
// call it had started and not finished is recorded as cut and charged,
// and the ledger is brought level with the records, before the
// executions' reservations are released.
func (a *agentService) settleCalls(ctx context.Context, keep []string) {
	list, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Status: []store.Status{store.Pending, store.Running, store.AwaitingBudget}, Limit: 10000})
	if err != nil {
		a.log.Warn("agents: settle the model calls of interrupted executions", "err", err)
		return
	}
	for _, e := range list {
		if slices.Contains(keep, e.ID) {
			continue
		}
		s, err := agents.SettleCalls(ctx, a.store, e, a.cfg.Credits.Enabled)
		switch {
		case err != nil:
			a.log.Warn("execution", "id", e.ID, "err", err)
		case s.Cut > 0 || s.Charged > 0:
			a.log.Info("execution: model calls were in flight when the daemon stopped: recorded as cut, charged, and charged to credits to match the records",
				"id", e.ID, "cut", s.Cut, "cut_usd", s.CutUSD, "credits_usd", s.Charged)
		}
	}
}

// leftRunning finds the executions a daemon left running on purpose
// whose machines are still there, with their recovered machines.
func (a *agentService) leftRunning(ctx context.Context, driver vmm.Driver) map[string]vmm.Machine {
	left := map[string]vmm.Machine{}
	if a.runner == nil || driver == nil {
		return left
	}
	running, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Status: []store.Status{store.Running}, Limit: 10000})
	if err != nil {
		a.log.Warn("agents: executions left running", "err", err)
		return left
	}
	for _, e := range running {
		if ok, err := a.runner.Detached(ctx, e.ID); !ok || err != nil {
			continue
		}
		m, err := driver.Recover(ctx, e.ID)
		if err != nil {
			a.log.Warn("execution: left running, but its machine is gone", "id", e.ID, "err", err)
			continue
		}
		left[e.ID] = m
	}
	return left
}

// reattach takes up an execution left running, in a counted goroutine,
// as launch starts one.
func (a *agentService) reattach(id string, m vmm.Machine) {
	done := make(chan struct{})
	a.mu.Lock()
	a.runs[id] = &liveRun{done: done}
	a.mu.Unlock()
	a.log.Info("execution: taking it up again where the last daemon left it", "id", id)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		res, err := a.runner.Reattach(a.ctx, id, m)
		a.ended(id, res, err)
	}()
}

// executionPrefix starts every execution id, and so the id of its
// machine; sandbox ids may not use it.
const executionPrefix = "exec-"

// keepOutputs records the files an interrupted execution's patterns
// match now: its partial outputs.
func (a *agentService) keepOutputs(ctx context.Context, e store.Execution, patterns []string) store.Execution {
	var outputs []string
	for _, p := range patterns {
		m, _ := a.work.Glob(e.Session, p)
		outputs = append(outputs, m...)
	}
	if len(outputs) == 0 {
		return e
	}
	sort.Strings(outputs)
	got, err := a.store.UpdateExecution(ctx, e.ID, func(x *store.Execution) error { x.Outputs = outputs; return nil })
	if err != nil {
		return e
	}
	return got
}

func (a *agentService) names() []string {
	a.defsMu.RLock()
	defer a.defsMu.RUnlock()
	names := make([]string, 0, len(a.defs))
	for n := range a.defs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// outcome is how a run ended.
type outcome struct {
	res agents.Result
	err error
}

// launch starts run in a counted goroutine and returns once the runner
// has accepted the execution (it is recorded, its credits reserved, and
// it can be cancelled), with a channel that delivers the outcome. A run
// refused before that returns its error (the checks before a start catch
// most causes with a precise message; this catches the races they cannot
// see). The caller holds startMu.
func (a *agentService) launch(run func(ctx context.Context) (agents.Result, error)) (store.Execution, <-chan outcome, error) {
	if a.closed {
		return store.Execution{}, nil, unavailablef("the daemon is stopping")
	}
	accepted := make(chan store.Execution, 1)
	done := make(chan outcome, 1)
	var id string // set by the hook, which run calls in its own goroutine
	ctx := agents.WithAccepted(a.ctx, func(e store.Execution) {
		id = e.ID
		a.mu.Lock()
		a.runs[e.ID] = &liveRun{done: make(chan struct{})}
		a.mu.Unlock()
		accepted <- e
	})
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		res, err := run(ctx)
		a.ended(id, res, err)
		done <- outcome{res, err}
	}()
	select {
	case e := <-accepted:
		return e, done, nil
	case o := <-done:
		select {
		case e := <-accepted: // accepted, then ended at once
			done <- o
			return e, done, nil
		default:
		}
		return o.res.Execution, nil, o.err
	}
}

// ended logs how an accepted execution ended and forgets it.
func (a *agentService) ended(id string, res agents.Result, err error) {
	if id == "" {
		return // refused: the caller reports it
	}
	e := res.Execution
	var ran time.Duration
	if !e.Started.IsZero() {
		ran = e.Ended.Sub(e.Started).Round(time.Millisecond)
	}
	switch {
	case errors.Is(err, agents.ErrDetached):
		a.log.Info("execution left running in its machine; the next start takes it up", "id", id, "agent", e.Agent, "session", e.Session)
	case err != nil:
		a.log.Warn("execution", "id", id, "err", err)
	default:
		a.log.Info("execution ended", "id", id, "agent", e.Agent, "session", e.Session, "status", e.Status, "ran", ran, "turns", e.Turns, "usd", e.USD)
	}
	a.mu.Lock()
	if lr := a.runs[id]; lr != nil {
		delete(a.runs, id)
		close(lr.done)
	}
	a.mu.Unlock()
}

// live returns what the gateway metered so far for a running execution.
func (a *agentService) live(id string) (liveRun, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lr := a.runs[id]
	if lr == nil {
		return liveRun{}, false
	}
	return *lr, true
}

// Close refuses new executions, cancels the running ones and waits for
// them: each ends cancelled (its agent TERMed, then KILLed after the
// grace period), its partial outputs kept, its last events streamed.
// Then the event streams end and the gateway stops. The daemon closes
// the store (closeStore) once its WaitGroup is done.
func (a *agentService) Close() {
	a.startMu.Lock()
	a.closed = true
	a.startMu.Unlock()
	if n := a.running(); n > 0 && a.cfg.Agents.OnShutdown == OnShutdownFinish {
		limit := time.Duration(a.cfg.Agents.shutdownTimeout())
		a.log.Info("agents: waiting for running executions to finish; new ones are refused (stop now: signal again)", "limit", limit, "running", n)
		select {
		case <-a.runsDone():
		case <-time.After(limit):
		case <-a.hurry:
		}
	}
	if n := a.running(); n > 0 && a.cfg.Agents.OnShutdown == OnShutdownLeave && a.runner != nil {
		a.drainGateway()
		a.log.Info("agents: leaving running executions in their machines; the next start takes them up", "running", n)
		a.runner.Detach()
		a.waitRuns()
	}
	if n := a.running(); n > 0 {
		a.log.Info("agents: stopping running executions: they end cancelled, their events and partial outputs kept", "running", n)
	}
	a.cancel()
	a.waitRuns()
	close(a.stopped)
	if a.gwSrv != nil {
		a.gwSrv.Close()
		os.Remove(a.gwSock)
	}
	if a.egSrv != nil {
		a.egress.Close()
		a.egSrv.Close()
		os.Remove(a.egSock)
	}
	if a.inSrv != nil {
		a.inSrv.Close()
		os.Remove(a.inSock)
	}
}

// leaveDrain bounds how long a daemon leaving its executions running
// waits for their model calls in flight; a second signal (Hurry) ends it
// sooner.
const leaveDrain = 5 * time.Minute

// drainGateway lets the model calls in flight finish, before a daemon
// leaves its executions running: their answers reach the agents whole
// and are metered, while new calls are answered with a retryable 529
// (the agents retry into the next daemon). Cutting them instead would
// fail the agent's call and lose the metering of what it was sent.
func (a *agentService) drainGateway() {
	ctx, cancel := context.WithTimeout(context.Background(), leaveDrain)
	defer cancel()
	go func() {
		select {
		case <-a.hurry:
			cancel()
		case <-ctx.Done():
		}
	}()
	t0 := time.Now()
	if err := a.gw.Drain(ctx); err != nil {
		a.log.Warn("agents: model calls in flight did not finish, they are cut", "err", err)
		return
	}
	if took := time.Since(t0); took > time.Second {
		a.log.Info("agents: the model calls in flight finished", "waited", took.Round(time.Millisecond))
	}
}

// Hurry ends the wait of a Close under on_shutdown = "finish" (the
// executions still running are stopped at once) or "leave" (model calls
// still in flight are cut).
func (a *agentService) Hurry() { a.hurryOnce.Do(func() { close(a.hurry) }) }

// running counts the executions this daemon runs.
func (a *agentService) running() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.runs)
}

// runsDone is closed once no execution is running.
func (a *agentService) runsDone() <-chan struct{} {
	c := make(chan struct{})
	go func() { a.waitRuns(); close(c) }()
	return c
}

// waitRuns waits until no execution is running.
func (a *agentService) waitRuns() {
	for {
		a.mu.Lock()
		var done chan struct{}
		for _, lr := range a.runs {
			done = lr.done
			break
		}
		a.mu.Unlock()
		if done == nil {
			return
		}
		<-done
	}
}

func (a *agentService) closeStore() error { return a.store.Close() }
