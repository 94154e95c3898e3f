package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"hearth/agents/adapter"
	"hearth/agents/egress"
	"hearth/agents/gateway"
	"hearth/agents/inside"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/vmm"
)

// Workspace is what the runner needs of the shared tree; the appliance
// provides it from package fs.
type Workspace interface {
	// EnsureSession makes the session's directories if they are missing,
	// owned by uid:gid as the host sees them, and gives it quota q.
	EnsureSession(session string, uid, gid uint32, q Quota) error
	// WriteFile puts r at path (relative to the session) with owner.
	WriteFile(session, path string, r io.Reader, uid, gid uint32) error
	// MountView mounts a view of the workspace where session is writable,
	// for one machine, and returns its directory and how to unmount it.
	MountView(session, machine string) (dir string, unmount func() error, err error)
	// Glob lists the session's files matching a pattern such as
	// outputs/*.md, relative to the session.
	Glob(session, pattern string) ([]string, error)
	// FileEvents reports the session's file changes until stop is called:
	// every change after it returns, unless the reader falls behind.
	FileEvents(session string) (events <-chan FileEvent, stop func(), err error)
	// MkdirAll makes directory path (relative to the session) and the
	// missing ones above it, owned by uid:gid; it follows no symbolic
	// link.
	MkdirAll(session, path string, uid, gid uint32) error
	// RemoveAll removes path and what it holds; it follows no symbolic
	// link, and a missing path is no error.
	RemoveAll(session, path string) error
	// Chmod sets path's permission bits, following no symbolic link.
	Chmod(session, path string, mode os.FileMode) error
	// OpenSession opens the session's files as the host sees them, to
	// read (skills from a session): a symbolic link in them cannot lead
	// out of the session.
	OpenSession(session string) (*os.Root, error)
	// Snapshot takes snapshot name of the session's whole tree (.home
	// included); Snapshots lists the session's snapshots, oldest first,
	// cheaply (it is called after each one the runner takes);
	// DeleteSnapshot deletes one. The runner's call snapshots use them
	// (callsnap.go).
	Snapshot(session, name string) error
	Snapshots(session string) ([]SnapshotRef, error)
	DeleteSnapshot(session, name string) error
	// SnapshotHolds lists the session's snapshots, oldest first, with
	// the bytes each pins (fs.Store.SnapshotHolds).
	SnapshotHolds(session string) ([]SnapshotRef, error)
}

// Quota is what an agent's definition asks of its session's quota; zero
// fields take the appliance's defaults.
type Quota struct{ Bytes, Files int64 }

// FileEvent is a change in a session's files.
type FileEvent struct {
	Op   string `json:"op"`   // created, written, renamed, removed
	Path string `json:"path"` // relative to the session
}

// Image is a runtime image resolved for a machine.
type Image struct {
	RootFS   string
	UID, GID uint32 // the image's agent user
	// CLI is the agent CLI the image runs (CLIClaudeCode...), the
	// default of a definition that names none.
	CLI string
}

// RunnerConfig wires a Runner.
type RunnerConfig struct {
	Driver    vmm.Driver
	Workspace Workspace
	Store     *store.Store
	Gateway   *gateway.Gateway
	// GatewayDial connects to where the gateway is served on the host
	// (through channel.Listener, with channel.ConnContext); each
	// machine's agent forwards 127.0.0.1:GatewayPort to it, its
	// connections named by channel.Dial.
	GatewayDial func(ctx context.Context) (net.Conn, error)
	GatewayPort int // default 4000
	// Egress is the proxy through which an agent reaches the domains its
	// definition's network list names. When it is set and the list is not
	// empty, the machine's agent forwards 127.0.0.1:EgressPort to
	// EgressDial (where the proxy is served on the host) and the agent's
	// HTTPS_PROXY and HTTP_PROXY point there. Without it an agent has no
	// network, whatever its list says.
	Egress     *egress.Proxy
	EgressDial func(ctx context.Context) (net.Conn, error)
	EgressPort int // default 4001
	// Inside is the hearth MCP server agents reach from inside their
	// machines (package agents/inside). When it is set, every execution
	// is registered with it, the machine's agent forwards
	// 127.0.0.1:InsidePort to InsideDial (where it is served on the host,
	// through channel.Listener), and the agent CLI is started with an MCP
	// configuration naming it "hearth". Without it agents have no hearth
	// tools.
	Inside     *inside.Server
	InsideDial func(ctx context.Context) (net.Conn, error)
	InsidePort int // default 4002
	// Images resolves an agent's runtime image.
	Images func(name string) (Image, error)
	// Agents are the definitions tasks may name; SetAgents replaces them.
	Agents map[string]*Definition
	// Grace is how long a stopped agent has between TERM and KILL.
	Grace time.Duration // default 10s
	// KillWait bounds each wait on the machine of an agent being stopped:
	// for a signal to be delivered, and for the agent to end after KILL.
	// An agent still running past it is in a machine that stopped
	// answering, and is given up on with its machine.
	KillWait time.Duration // default 30s
	// Memory for each machine; default 2 GiB (claude alone keeps about
	// 200 MiB resident).
	Memory int64
	// Disk bounds each machine's writable root layer (what the agent
	// writes outside the workspace and /tmp); 0: no limit.
	Disk int64
	// Credits makes the store's credit ledger the outermost budget: an
	// execution reserves its USD limit from the balance before it starts
	// (and must have one), is charged what the gateway meters, and
	// releases the rest when it ends.
	Credits bool
	// OnBudget is what reaching the USD limit does when neither the
	// agent nor the task says (Limits.OnBudget); default OnBudgetStop.
	OnBudget string
	// BudgetWait bounds how long a paused execution waits for a top-up
	// before it is stopped as at the limit (budget_exceeded, its partial
	// outputs kept); default 24h.
	BudgetWait time.Duration
	// Secret derives each execution's gateway and egress tokens, so that
	// the runner of a daemon started again on the same state admits the
	// tokens of the agents it takes up (Reattach). Keep it secret and
	// stable; nil makes random tokens, and nothing can be taken up.
	Secret []byte
	// MaxDepth bounds delegation: a root execution is at depth 0, a child
	// at its parent's depth + 1, refused above MaxDepth. Default 3.
	MaxDepth int
	// MaxChildren bounds the children one execution has running at once.
	// Default 8.
	MaxChildren int
	// CallSnapshots is which snapshots of a session the runner keeps of
	// those it takes at each execution's start, after each of its model
	// calls and at its end (agents.call_snapshots; see ParseRetention).
	// The zero value keeps the last DefaultCallSnapshots of each kind.
	CallSnapshots Retention
}

// Runner runs agent tasks, each execution in a machine of its own.
type Runner struct {
	cfg RunnerConfig

	mu     sync.Mutex
	runs   map[string]*run // by execution id, while running
	agents map[string]*Definition
}

// NewRunner returns a runner. The caller routes the gateway's and the
// egress proxy's events to Runner.Event.
func NewRunner(cfg RunnerConfig) *Runner {
	if cfg.GatewayPort == 0 {
		cfg.GatewayPort = 4000
	}
	if cfg.EgressPort == 0 {
		cfg.EgressPort = 4001
	}
	if cfg.InsidePort == 0 {
		cfg.InsidePort = 4002
	}
	if cfg.Grace == 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.KillWait == 0 {
		cfg.KillWait = 30 * time.Second
	}
	if cfg.Memory == 0 {
		cfg.Memory = 2 << 30
	}
	if cfg.OnBudget == "" {
		cfg.OnBudget = OnBudgetStop
	}
	if cfg.BudgetWait == 0 {
		cfg.BudgetWait = DefaultBudgetWait
	}
	if r := cfg.CallSnapshots; !r.Off && !r.All && r.Last == 0 && r.Age == 0 {
		cfg.CallSnapshots.Last = DefaultCallSnapshots
	}
	r := &Runner{cfg: cfg, runs: map[string]*run{}, agents: cfg.Agents}
	if cfg.Store != nil {
		cfg.Store.OnWriteFailure(r.storeFailed)
	}
	return r
}

// storeFailed stops the executions whose record or events the store could
// not write: going on would make model calls nobody can account for.
func (r *Runner) storeFailed(err error, executions []string) {
	for _, id := range executions {
		r.mu.Lock()
		ru := r.runs[id]
		r.mu.Unlock()
		if ru != nil {
			ru.storeFailed(err)
		}
	}
}

// SetAgents replaces the definitions new tasks may name (the daemon
// reloads them). Running executions keep the definition they started
// with.
func (r *Runner) SetAgents(defs map[string]*Definition) {
	r.mu.Lock()
	r.agents = defs
	r.mu.Unlock()
}

// TaskRequest is a task delegated to an agent.
type TaskRequest struct {
	Agent  string
	Prompt string
	// Inputs are copied into the session's inputs/, by name.
	Inputs map[string][]byte
	// InputFiles are too, from these host files (uploads too big to hold
	// in memory), streamed.
	InputFiles map[string]string
	// Outputs override the agent's output patterns, if set.
	Outputs []string
	// Limits may only tighten the agent's.
	Limits Limits
	// Session continues an existing session (a new execution in it with
	// the agent's full context), or "" for a new one.
	Session string
	// MCPServers, Skills and Context add to the agent's own (see
	// Definition); CheckTask says whether they may.
	MCPServers []MCPServer
	Skills     []string
	Context    []ContextFile
	// Parent is the execution delegating this task, which must be running
	// in this runner; "" for a root execution. The child runs in a new
	// session under limits carved out of what the parent has left (see
	// delegate.go); the parent's end cancels it.
	Parent string
}

// Result is how an execution ended.
type Result struct {
	Execution store.Execution
	Outputs   []string // files matched by the output patterns, relative to the session
	// Stream is what the adapter made of the agent CLI's output when the
	// execution ran its agent to an end (zero otherwise): lines it could
	// not read (Malformed) and kinds it skipped on purpose (Ignored), so
	// a CLI whose output changed can be told from one that only failed.
	Stream adapter.Summary
}

// Run runs a task to its end and returns what it did. Events go to the
// store as they happen. With req.Session set it resumes that session: a
// new execution with the agent's full context (its CLI resumes its own
// session).
func (r *Runner) Run(ctx context.Context, req TaskRequest) (Result, error) {
	p, err := r.plan(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return r.execute(ctx, p)
}

// planned is an execution worked out from its request, not yet recorded.
type planned struct {
	def          *Definition
	limits       Limits
	exec         store.Execution
	outputs      []string
	agentSession string
	req          TaskRequest
	adm          *admission
	// queued: recorded here to run on some node with the image, which
	// need not be this one.
	queued bool
}

// plan checks a task and works out its execution, making its session if
// it is new.
func (r *Runner) plan(ctx context.Context, req TaskRequest) (planned, error) {
	st := r.cfg.Store
	kind, previous, agentSession := store.Run, "", ""
	var sess store.Session
	if req.Parent != "" && req.Session != "" {
		return planned{}, fmt.Errorf("%w: a delegated task runs in a new session of its own: leave the session out", ErrRefused)
	}
	if req.Session != "" {
		var err error
		if sess, err = st.GetSession(ctx, req.Session); err != nil {
			return planned{}, err
		}
		if req.Agent != "" && req.Agent != sess.Agent {
			return planned{}, fmt.Errorf("session %s belongs to agent %s, not %s", sess.ID, sess.Agent, req.Agent)
		}
		req.Agent = sess.Agent
		kind, previous, agentSession = store.Resume, sess.LastExecution, sess.AgentSessionID
		if previous == "" { // a branch not run yet: its conversation came with its tree
			kind = store.Run
		}
	}
	def, limits, err := r.prepare(req.Agent, req.Limits)
	if err != nil {
		return planned{}, err
	}
	if err := def.CheckTask(req); err != nil {
		return planned{}, fmt.Errorf("agent %s: %w", def.Name, err)
	}
	var adm *admission
	if req.Parent != "" {
		// Admitted before its session is made: a refusal leaves nothing.
		if adm, err = r.admit(req.Parent, def, req.Limits, limits); err != nil {
			return planned{}, err
		}
		limits = adm.limits
	}
	if sess.ID == "" {
		if sess, err = st.CreateSession(ctx, store.Session{Agent: def.Name}); err != nil {
			if adm != nil {
				adm.abandon()
			}
			return planned{}, err
		}
	}
	outputs := def.Outputs
	if len(req.Outputs) > 0 {
		outputs = req.Outputs
	}
	exec := store.Execution{Session: sess.ID, Agent: def.Name, Kind: kind, Previous: previous, Prompt: req.Prompt}
	return planned{def: def, limits: limits, exec: exec, outputs: outputs, agentSession: agentSession, req: req, adm: adm}, nil
}

// Retry runs a finished execution's task again, from the start, in the
// same session (its inputs are there already).
func (r *Runner) Retry(ctx context.Context, execution string) (Result, error) {
	p, err := r.planRetry(ctx, execution)
	if err != nil {
		return Result{}, err
	}
	return r.execute(ctx, p)
}

// planRetry works out the execution retrying a finished one.
func (r *Runner) planRetry(ctx context.Context, execution string) (planned, error) {
	old, err := r.cfg.Store.GetExecution(ctx, execution)
	if err != nil {
		return planned{}, err
	}
	if !old.Status.Terminal() {
		return planned{}, fmt.Errorf("execution %s is %s: retry it once it has ended", old.ID, old.Status)
	}
	lim := Limits{USD: old.Limits.USD, Turns: old.Limits.Turns, WallTime: Duration(old.Limits.WallTime), OnBudget: old.Limits.OnBudget}
	r.mu.Lock()
	if def := r.agents[old.Agent]; def != nil {
		lim.USD = RetryUSD(def, lim.USD)
	}
	r.mu.Unlock()
	def, limits, err := r.prepare(old.Agent, lim)
	if err != nil {
		return planned{}, err
	}
	exec := store.Execution{Session: old.Session, Agent: def.Name, Kind: store.Retry, Previous: old.ID, Prompt: old.Prompt}
	return planned{def: def, limits: limits, exec: exec, outputs: def.Outputs, req: TaskRequest{Agent: def.Name, Prompt: old.Prompt}}, nil
}

// RetryUSD is the USD limit a retry of an execution whose limit was usd
// runs with: the same, but no more than its agent's (a top-up raised it
// for that execution only; a retry starts again from the agent's).
func RetryUSD(def *Definition, usd float64) float64 {
	if def.Limits.USD > 0 && usd > def.Limits.USD {
		return def.Limits.USD
	}
	return usd
}

// prepare finds the agent and applies a task's limits to its own.
func (r *Runner) prepare(agent string, override Limits) (*Definition, Limits, error) {
	r.mu.Lock()
	def, ok := r.agents[agent]
	r.mu.Unlock()
	if !ok {
		return nil, Limits{}, fmt.Errorf("%w: no agent %q", ErrNotFound, agent)
	}
	limits, err := def.Limits.Tighten(override)
	if err != nil {
		return nil, Limits{}, fmt.Errorf("agent %s: %w", def.Name, err)
	}
	return def, limits, nil
}

// execute records the execution and runs it; a delegated one comes
// with its parent's admission (p.adm), which it takes up or gives back.
func (r *Runner) execute(ctx context.Context, p planned) (Result, error) {
	img, cli, err := r.record(ctx, &p)
	if err != nil {
		return Result{}, err
	}
	return r.start(ctx, p, img, cli)
}

// record resolves the agent's image and CLI and records p's execution
// (pending), setting p.exec to what was stored.
func (r *Runner) record(ctx context.Context, p *planned) (Image, agentCLI, error) {
	def, limits, adm := p.def, p.limits, p.adm
	var img Image
	var cli agentCLI
	if !p.queued {
		var err error
		if img, err = r.cfg.Images(def.Image); err != nil {
			if adm != nil {
				adm.abandon()
			}
			return Image{}, nil, fmt.Errorf("agent %s: image %s: %w", def.Name, def.Image, err)
		}
		if cli, err = cliFor(def, img); err != nil {
			if adm != nil {
				adm.abandon()
			}
			return Image{}, nil, err
		}
	}
	e := p.exec
	if adm != nil {
		e.Parent = adm.parent.exec.ID
	}
	if limits.OnBudget == "" {
		limits.OnBudget = r.cfg.OnBudget // kept with the execution, for a runner that takes it up
	}
	p.limits = limits
	e.Limits = store.Limits{USD: limits.USD, Turns: limits.Turns, WallTime: time.Duration(limits.WallTime), OnBudget: limits.OnBudget}
	if r.cfg.Credits && limits.USD <= 0 {
		if adm != nil {
			adm.abandon()
		}
		return Image{}, nil, fmt.Errorf("agent %s: credits are in use, so a task needs a budget: give one (or set limits.usd in the agent)", def.Name)
	}
	var err error
	if p.exec, err = r.cfg.Store.CreateExecution(ctx, e); err != nil {
		if adm != nil {
			adm.abandon()
		}
		return Image{}, nil, err
	}
	return img, cli, nil
}

// start runs p's recorded, pending execution to its end.
func (r *Runner) start(ctx context.Context, p planned, img Image, cli agentCLI) (res Result, err error) {
	def, limits, exec, adm := p.def, p.limits, p.exec, p.adm
	ru := &run{r: r, def: def, img: img, cli: cli, exec: exec, limits: limits, outputs: p.outputs, agentSession: p.agentSession,
		budget: newTreeBudget(limits), stopc: make(chan stopReason, 1)}
	ru.tree.init()
	if adm != nil {
		// The child's end is the parent's business: registered first, it
		// runs last, once the child's credits are settled.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		ru.tree.cancel = cancel
		if err := adm.adopt(ru); err != nil {
			ru.tree.cancelNote = "cancelled: " + err.Error()
			return ru.fail(err)
		}
		defer func() { ru.childEnded(res.Execution) }()
	}
	if r.cfg.Credits {
		if err := ru.reserveCredits(ctx); err != nil {
			return ru.fail(fmt.Errorf("reserve $%.2f of credits: %w (add some with 'hearth credits add')", limits.USD, err))
		}
		defer func() {
			if !ru.detached { // a detached run keeps its reservation
				ru.releaseCredits(context.Background())
			}
		}()
	}
	defer r.track(ctx, ru)()
	return ru.run(ctx, p.req)
}

// track makes ru a run the runner can stop (Cancel, Detach, budget
// events) and tells ctx's accepted hook; the func it returns forgets it.
func (r *Runner) track(ctx context.Context, ru *run) (untrack func()) {
	r.mu.Lock()
	r.runs[ru.exec.ID] = ru
	r.link(ru)
	r.mu.Unlock()
	if accepted, ok := ctx.Value(acceptedKey{}).(func(store.Execution)); ok {
		accepted(ru.exec)
	}
	return func() {
		if !ru.detached { // a detached agent goes on, holding its leases
			ru.endClaims()
		}
		r.mu.Lock()
		delete(r.runs, ru.exec.ID)
		r.mu.Unlock()
	}
}

// ErrNotFound: no such agent, session or execution.
var ErrNotFound = errors.New("not found")

// Event takes an event from the gateway or the egress proxy: it is
// stored in its execution's stream, and the gateway's refusal at a
// budget limit stops the execution.
func (r *Runner) Event(ev stream.Event) {
	r.mu.Lock()
	ru := r.runs[ev.Execution]
	r.mu.Unlock()
	if ru == nil {
		r.cfg.Store.Append(context.Background(), ev)
		return
	}
	ru.emit(ev)
	if ev.Type == stream.Budget {
		var p gateway.BudgetPayload
		if json.Unmarshal(ev.Payload, &p) == nil && p.Level == "exceeded" {
			ru.stop(stopBudget)
		}
	}
}

type stopReason int

const (
	stopBudget stopReason = iota + 1
	stopWallTime
	stopCancel
	stopDetach // leave the agent running: see Detach
	stopStore  // the store could not record the execution
)

// run is one execution in progress.
type run struct {
	r            *Runner
	def          *Definition
	img          Image
	exec         store.Execution
	limits       Limits
	outputs      []string
	agentSession string
	cli          agentCLI
	ctxArgs      []string    // the CLI's arguments for the agent's context (place)
	mcpServers   []MCPServer // the definition's and the task's, for a CLI other than Claude Code (place)
	budget       *treeBudget
	stopc        chan stopReason
	tree         tree   // delegation: its children and its parent
	detached     bool   // set by detach, in the run's own goroutine
	insideToken  string // the execution's token for the hearth MCP server, if any
	disconnect   func() // revokes the execution's tokens, once: set by connect

	clock wallClock // the wall-time limit, suspended while paused
	hold  holdState

	emitMu sync.Mutex
	err    error // the first store error

	storeMu  sync.Mutex
	storeErr error // the first write the store refused: the run stops

	claims claimState // its leases on paths (claims.go)
	snaps  callSnaps  // its call snapshots (callsnap.go)
}

// storeFailed stops the run because the store refused one of its writes;
// from now on its budget denies every model call.
func (ru *run) storeFailed(err error) {
	ru.storeMu.Lock()
	if ru.storeErr == nil {
		ru.storeErr = err
	}
	ru.storeMu.Unlock()
	ru.stop(stopStore)
}

func (ru *run) storeError() error {
	ru.storeMu.Lock()
	defer ru.storeMu.Unlock()
	return ru.storeErr
}

// storeGate is the run's budget, denying every call once the store has
// failed: a call it cannot record would go unmetered.
type storeGate struct {
	gateway.Budget
	ru *run
}

func (g storeGate) Check() gateway.Decision {
	if g.ru.storeError() != nil {
		return gateway.Decide(gateway.LimitUse{Limit: "store", Used: 1, Max: 1, Level: gateway.Deny,
			Reason: "The appliance cannot record this execution (its store refused a write), so it cannot meter more calls"})
	}
	return g.Budget.Check()
}

func (ru *run) emit(ev stream.Event) {
	ev.Session, ev.Execution = ru.exec.Session, ru.exec.ID
	ru.emitMu.Lock()
	defer ru.emitMu.Unlock()
	// Not waiting for each commit keeps a chatty agent fast; finish
	// flushes before it reads the stream back and writes the end.
	if _, err := ru.r.cfg.Store.AppendAsync(ev); err != nil && ru.err == nil {
		ru.err = err
	}
}

func (ru *run) status(status string, detail map[string]any) {
	p := map[string]any{"status": status}
	for k, v := range detail {
		p[k] = v
	}
	ru.emit(stream.New("", "", stream.Status, p))
}

func (ru *run) stop(why stopReason) {
	select {
	case ru.stopc <- why:
	default: // a stop is already on its way
	}
}

// Cancel stops a running execution as a budget stop does: TERM, then
// KILL after the grace period; it ends cancelled, its partial outputs
// kept, and Run returns. An execution this runner is not running (ended,
// unknown, or not yet accepted) is ErrNotFound. Idempotent.
func (r *Runner) Cancel(execution string) error {
	r.mu.Lock()
	ru := r.runs[execution]
	r.mu.Unlock()
	if ru == nil {
		return fmt.Errorf("%w: execution %s is not running", ErrNotFound, execution)
	}
	ru.stop(stopCancel)
	return nil
}

type acceptedKey struct{}

// WithAccepted returns a context that makes Run and Retry call fn with
// the execution once it is recorded, has its credits reserved and can be
// cancelled, before its machine boots: a caller that does not wait for
// the end learns the execution from it (as httptrace hooks a request).
// fn must not block.
func WithAccepted(ctx context.Context, fn func(store.Execution)) context.Context {
	return context.WithValue(ctx, acceptedKey{}, fn)
}
