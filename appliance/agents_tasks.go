package appliance

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"hearth/agents"
	"hearth/agents/store"
)

// The agent service's tasks: delegation, resume and retry, executions,
// sessions, outputs and credits. Reads work whenever the store is open;
// starting an execution needs the runner. Its handlers are in
// agents_api.go.

// maxInputs bounds the input files of one JSON task request, in all
// (documented in openapi.yaml): they travel as base64, held whole by
// client and daemon. Bigger ones are streamed (MaxInputFiles).
const maxInputs = 16 << 20

// maxPrompt bounds a task's prompt (documented in openapi.yaml): the
// whole prompt is stored with the execution and rendered into the agent's
// prompt file; a prompt of many megabytes is a mistake, and each one
// weighed on every list of executions.
const maxPrompt = 1 << 20

// promptPreview is how many characters of each prompt a list shows; GET
// of one execution gives the whole prompt.
const promptPreview = 200

// checkPrompt refuses an empty prompt, one over maxPrompt (413) and one
// with NUL bytes, which no agent CLI can be given.
func checkPrompt(p string) error {
	switch {
	case strings.TrimSpace(p) == "":
		return invalidf("the prompt is empty: say what the agent should do")
	case len(p) > maxPrompt:
		return tooLargef("the prompt is %d bytes, more than the %d (1 MiB) a task may have: put the material in an input file (--input) and refer to it", len(p), maxPrompt)
	case strings.ContainsRune(p, 0):
		return invalidf("the prompt has a NUL byte at offset %d: send text", strings.IndexByte(p, 0))
	}
	return nil
}

// cancelWait is how long a cancel request waits for the execution to end.
const cancelWait = 30 * time.Second

// cancelAgain is how often a cancel asks again the node that runs the
// execution (a notification missed while it reconnected is lost).
const cancelAgain = 500 * time.Millisecond

func (a *agentService) available() error {
	if a.runner == nil {
		return unavailablef("agents are unavailable: %v", a.unavailable)
	}
	return nil
}

// task is a start request after decoding: a new task, a resume (Session
// set) or a retry (Retry set).
type task struct {
	agents.TaskRequest
	Retry string
	// staging holds the task's streamed input files (InputFiles): removed
	// when the execution ends or is refused.
	staging string
}

// Start checks a task and launches it (see launch); the execution it
// returns has what was metered so far.
func (a *agentService) Start(ctx context.Context, t task) (store.Execution, <-chan outcome, error) {
	e, done, err := a.check(ctx, t)
	if err != nil && t.staging != "" {
		os.RemoveAll(t.staging)
	}
	return a.withLive(e), done, err
}

func (a *agentService) check(ctx context.Context, t task) (store.Execution, <-chan outcome, error) {
	a.startMu.Lock()
	defer a.startMu.Unlock()
	if err := a.available(); err != nil {
		return store.Execution{}, nil, err
	}
	if t.Retry != "" {
		return a.startRetry(ctx, t.Retry)
	}
	if err := checkPrompt(t.Prompt); err != nil {
		return store.Execution{}, nil, err
	}
	if t.Session != "" {
		sess, err := a.idleSession(ctx, t.Session)
		if err != nil {
			return store.Execution{}, nil, err
		}
		if t.Agent != "" && t.Agent != sess.Agent {
			return store.Execution{}, nil, invalidf("session %s belongs to agent %s, not %s", sess.ID, sess.Agent, t.Agent)
		}
		t.Agent = sess.Agent
	}
	def, err := a.definition(t.Agent)
	if err != nil {
		return store.Execution{}, nil, err
	}
	limits, err := def.Limits.Tighten(t.Limits)
	if err != nil {
		return store.Execution{}, nil, invalid(fmt.Errorf("agent %s: %w", def.Name, err))
	}
	if err := def.CheckTask(t.TaskRequest); err != nil {
		return store.Execution{}, nil, invalid(fmt.Errorf("agent %s: %w", def.Name, err))
	}
	if err := checkInputs(t.Inputs); err != nil {
		return store.Execution{}, nil, err
	}
	for name := range t.InputFiles {
		if t.Inputs[name] != nil {
			return store.Execution{}, nil, invalidf("input %q: given twice", name)
		}
	}
	if err := checkOutputs(t.Outputs); err != nil {
		return store.Execution{}, nil, err
	}
	if t.Parent != "" {
		// A child's budget is carved out of its parent's: the runner
		// checks it against what the parent has left, not the balance.
		if _, err := a.images.resolve(def.Image); err != nil {
			return store.Execution{}, nil, fmt.Errorf("agent %s: %w", def.Name, err)
		}
	} else if err := a.ready(ctx, def, limits.USD); err != nil {
		return store.Execution{}, nil, err
	}
	req := t.TaskRequest
	if a.cluster != nil && req.Parent == "" && len(req.InputFiles) == 0 {
		return a.dispatch(ctx, def.Image, req.Session, func(ctx context.Context) (store.Execution, agents.Queued, error) {
			return a.runner.Record(ctx, req)
		})
	}
	return a.launch(func(ctx context.Context) (agents.Result, error) {
		if t.staging != "" {
			defer os.RemoveAll(t.staging)
		}
		return a.runner.Run(ctx, req)
	})
}

func (a *agentService) startRetry(ctx context.Context, id string) (store.Execution, <-chan outcome, error) {
	old, err := a.execution(ctx, id)
	if err != nil {
		return store.Execution{}, nil, err
	}
	if !old.Status.Terminal() {
		return store.Execution{}, nil, conflictf("execution %s is %s: retry it once it has ended (or cancel it)", id, old.Status)
	}
	if _, err := a.idleSession(ctx, old.Session); err != nil {
		return store.Execution{}, nil, err
	}
	def, err := a.definition(old.Agent)
	if err != nil {
		return store.Execution{}, nil, err
	}
	if err := a.ready(ctx, def, agents.RetryUSD(def, old.Limits.USD)); err != nil {
		return store.Execution{}, nil, err
	}
	if a.cluster != nil {
		return a.dispatch(ctx, def.Image, old.Session, func(ctx context.Context) (store.Execution, agents.Queued, error) {
			return a.runner.RecordRetry(ctx, id)
		})
	}
	return a.launch(func(ctx context.Context) (agents.Result, error) { return a.runner.Retry(ctx, id) })
}

// idleSession returns the session, which must exist and have no
// execution running: two agents in one session would overwrite each
// other's conversation.
func (a *agentService) idleSession(ctx context.Context, id string) (store.Session, error) {
	sess, err := a.store.GetSession(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return sess, notFoundf("no session %s: list them with 'hearth agents sessions'", id)
	}
	if err != nil {
		return sess, err
	}
	busy, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Session: id, Status: []store.Status{store.Pending, store.Running, store.AwaitingBudget}, Limit: 1})
	if err != nil {
		return sess, err
	}
	if len(busy) > 0 {
		return sess, conflictf("session %s is busy with execution %s: wait for it or cancel it ('hearth agents cancel %s')", id, busy[0].ID, busy[0].ID)
	}
	return sess, nil
}

// execution returns the execution id, or a not_found error that says
// how to find the right one.
func (a *agentService) execution(ctx context.Context, id string) (store.Execution, error) {
	e, err := a.store.GetExecution(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return e, notFoundf("no execution %s: list them with 'hearth agents list'", id)
	}
	return e, err
}

func (a *agentService) definition(name string) (*agents.Definition, error) {
	if def := a.def(name); def != nil {
		return def, nil
	}
	if len(a.names()) == 0 {
		return nil, notFoundf("no agent %q: none is defined; put one TOML file per agent in %s and run 'hearth agents reload'", name, a.cfg.AgentsDir())
	}
	return nil, notFoundf("no agent %q: the agents are %s ('hearth agents definitions')", name, strings.Join(a.names(), ", "))
}

// ready checks what the runner would only find out after recording the
// execution: the agent's image is built, and with credits in use the
// task has a budget the balance covers.
func (a *agentService) ready(ctx context.Context, def *agents.Definition, usd float64) error {
	// A cluster queues the task for a node that has the image (or
	// refuses it when none has).
	if _, err := a.images.resolve(def.Image); err != nil && a.cluster == nil {
		return fmt.Errorf("agent %s: %w", def.Name, err)
	}
	if !a.cfg.Credits.Enabled {
		return nil
	}
	if usd <= 0 {
		return invalidf("agent %s: credits are in use, so a task needs a budget: give one (--budget) or set limits.usd in the agent", def.Name)
	}
	avail, _, _, err := a.store.Balance(ctx)
	if err != nil {
		return err
	}
	if avail < usd {
		return noCreditsf("a budget of $%.2f needs that much credit, and $%.2f is available: add some with 'hearth credits add USD' or give a smaller budget", usd, avail)
	}
	return nil
}

// ImageInUse refuses to remove an image an execution runs on: its
// machine's root is an overlay over the image's directory.
func (a *agentService) ImageInUse(ctx context.Context, name string) error {
	running, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Status: []store.Status{store.Pending, store.Running, store.AwaitingBudget}})
	if err != nil {
		return err
	}
	for _, e := range running {
		if def := a.def(e.Agent); def != nil && def.Image == name {
			return conflictf("image %s is used by execution %s of agent %s: wait for it or cancel it", name, e.ID, e.Agent)
		}
	}
	return nil
}

func checkInputs(inputs map[string][]byte) error {
	total := 0
	for _, data := range inputs {
		total += len(data)
	}
	if total > maxInputs {
		return tooLargef("the input files are %d bytes in all, more than the %d (16 MiB) a JSON request may carry: stream them as multipart/form-data (as 'hearth agents run --input' does)", total, maxInputs)
	}
	for name := range inputs {
		if name == "" || name == "." || name == ".." || path.Base(name) != name || strings.ContainsAny(name, "\\\x00") {
			return invalidf("input %q: give a plain file name, without directories", name)
		}
	}
	return nil
}

func checkOutputs(patterns []string) error {
	for _, o := range patterns {
		if _, err := path.Match(o, ""); err != nil || path.Clean(o) != o || !strings.HasPrefix(o, "outputs/") {
			return invalidf("output pattern %q: must be a glob under outputs/, like outputs/*.md", o)
		}
	}
	return nil
}

// TopUp raises a running or paused execution's USD limit by usd (see
// agents.Runner.TopUp); a paused one goes on.
func (a *agentService) TopUp(ctx context.Context, id string, usd float64) (store.Execution, error) {
	if err := store.CheckUSD(usd); err != nil || !(usd > 0) {
		return store.Execution{}, invalidf("top-up: give a positive number of dollars (like 5 or 2.50), not %v", usd)
	}
	e, err := a.execution(ctx, id)
	if err == nil && e.Status.Terminal() {
		err = conflictf("execution %s has already ended (%s): a top-up raises the limit of a running or paused execution", id, e.Status)
	}
	if err == nil {
		err = a.available()
	}
	if err != nil {
		return e, err
	}
	e, err = a.runner.TopUp(ctx, id, usd)
	switch {
	case errors.Is(err, agents.ErrNoDollarLimit):
		return e, invalidf("execution %s has no dollar limit, so there is nothing to top up", id)
	case errors.Is(err, agents.ErrNotFound) && a.cluster != nil && e.Node != a.cluster.node.ID:
		return e, conflictf("execution %s runs on node %s: top it up through that node's API ('hearth cluster nodes' gives its address)", id, e.Node)
	case errors.Is(err, agents.ErrNotFound):
		return e, conflictf("execution %s is not running here (it may be pending or just ended): try again once it runs", id)
	case err != nil:
		return e, err
	}
	return a.withLive(e), nil
}

// cancelRun tells the runner to stop the execution and waits until it has
// ended or ctx is done; it reports whether it ended. An execution still
// being accepted is told as soon as it can be.
func (a *agentService) cancelRun(ctx context.Context, id string) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var asked time.Time // when another node was last asked to cancel it
	for {
		lr, running := a.liveDone(id)
		if running && a.runner.Cancel(id) == nil {
			select {
			case <-lr:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if e, err := a.store.GetExecution(ctx, id); err == nil && e.Status.Terminal() {
			return true
		} else if err == nil && !running && a.cluster != nil && time.Since(asked) > cancelAgain {
			asked = time.Now()
			a.cluster.cancelElsewhere(ctx, e)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
}

func (a *agentService) liveDone(id string) (<-chan struct{}, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if lr := a.runs[id]; lr != nil {
		return lr.done, true
	}
	return nil, false
}

// openOutput opens the regular file p (relative, under outputs/) of the
// session directory dir, confined to dir.
func openOutput(root *os.Root, p string) (*os.File, os.FileInfo, error) {
	defer root.Close()
	if fi, err := root.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return nil, nil, invalidf("%s is a symbolic link: download what it points to", p)
	}
	f, err := root.Open(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil, notFoundf("no file %s in the session: list them with 'hearth agents outputs'", p)
	case err != nil:
		return nil, nil, invalidf("%s: %v", p, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = invalidf("%s is not a regular file", p)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// creditEntries is how many ledger entries the credits route shows.
const creditEntries = 20

// withLive gives an execution that runs here what the gateway metered
// so far.
func (a *agentService) withLive(e store.Execution) store.Execution {
	if lr, ok := a.live(e.ID); ok && !e.Status.Terminal() {
		// Its totals hold what it stored of its own (nothing until it
		// ends) and its ended descendants': its own live figures replace
		// the stored ones there too.
		t, o, l := &e.TotalTokens, e.Tokens, lr.tokens
		e.TotalUSD = max(e.TotalUSD-e.USD+lr.usd, 0)
		t.Input, t.Output = t.Input-o.Input+l.Input, t.Output-o.Output+l.Output
		t.CacheRead, t.CacheCreation = t.CacheRead-o.CacheRead+l.CacheRead, t.CacheCreation-o.CacheCreation+l.CacheCreation
		e.Turns, e.USD, e.Tokens = lr.turns, lr.usd, lr.tokens
	}
	return e
}

// ExecutionTree returns execution id as Execution does, with the
// executions it delegated to (its children), oldest first.
func (a *agentService) ExecutionTree(ctx context.Context, id string) (store.Execution, []store.Execution, error) {
	e, err := a.Execution(ctx, id)
	if err != nil {
		return e, nil, err
	}
	kids, err := a.store.Children(ctx, id)
	for i := range kids {
		kids[i] = a.withLive(kids[i])
	}
	return e, kids, err
}

// Execution returns execution id as it is now, or a not-found error that
// says how to find the right one.
func (a *agentService) Execution(ctx context.Context, id string) (store.Execution, error) {
	e, err := a.execution(ctx, id)
	return a.withLive(e), err
}

// Executions lists the executions f selects, each prompt cut to a preview.
func (a *agentService) Executions(ctx context.Context, f store.ExecutionFilter) ([]store.Execution, error) {
	if f.Limit < 0 {
		return nil, invalidf("limit must not be negative")
	}
	for _, st := range f.Status {
		if !st.Valid() {
			return nil, invalidf("status %q: use pending, running, completed, failed, budget_exceeded, timed_out, cancelled or interrupted", st)
		}
	}
	f.PromptPreview = promptPreview
	list, err := a.store.ListExecutions(ctx, f)
	for i := range list {
		list[i] = a.withLive(list[i])
	}
	return list, err
}

// Wait returns execution id once done is closed, or ctx's error.
func (a *agentService) Wait(ctx context.Context, id string, done <-chan outcome) (store.Execution, error) {
	select {
	case <-done:
	case <-ctx.Done():
		return store.Execution{}, ctx.Err()
	}
	e, err := a.store.GetExecution(context.Background(), id)
	return a.withLive(e), err
}

// Cancel stops execution id and waits up to cancelWait (or ctx) for it to
// end; ended says whether it did.
func (a *agentService) Cancel(ctx context.Context, id string) (e store.Execution, ended bool, err error) {
	e, err = a.execution(ctx, id)
	if err == nil && e.Status.Terminal() {
		err = conflictf("execution %s has already ended (%s)", id, e.Status)
	}
	if err == nil {
		err = a.available()
	}
	if err != nil {
		return e, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, cancelWait)
	defer cancel()
	ended = a.cancelRun(ctx, id)
	e, err = a.store.GetExecution(context.Background(), id)
	return a.withLive(e), ended, err
}

// Definitions returns the agents' definitions, by name.
func (a *agentService) Definitions() []agents.Definition {
	var out []agents.Definition
	for _, name := range a.names() {
		if d := a.def(name); d != nil { // nil: removed by a reload since names() ran
			out = append(out, *d)
		}
	}
	return out
}

// Definition returns agent name's definition, or a not-found error that
// names the agents there are.
func (a *agentService) Definition(name string) (agents.Definition, error) {
	def, err := a.definition(name)
	if err != nil {
		return agents.Definition{}, err
	}
	return *def, nil
}

// Sessions lists the agent sessions f selects.
func (a *agentService) Sessions(ctx context.Context, f store.SessionFilter) ([]store.Session, error) {
	if f.Limit < 0 {
		return nil, invalidf("limit must not be negative")
	}
	return a.store.ListSessions(ctx, f)
}

// OutputInfo is one regular file under an execution's outputs/.
type OutputInfo struct {
	Path     string // relative to the session, outputs/...
	Size     int64
	Modified time.Time
	Matched  bool // one of the execution's output patterns matched it
}

// Outputs lists the regular files under the outputs/ of execution id's
// session, read through the daemon's host view (sessionRoot).
func (a *agentService) Outputs(ctx context.Context, id string) ([]OutputInfo, error) {
	e, err := a.execution(ctx, id)
	if err != nil {
		return nil, err
	}
	out := []OutputInfo{}
	root, err := a.sessionRoot(e.Session)
	if err != nil {
		return out, nil // no session directory yet: no outputs
	}
	defer root.Close()
	err = iofs.WalkDir(root.FS(), "outputs", func(rel string, de iofs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil // a file gone meanwhile, a directory, a link
		}
		fi, err := de.Info()
		if err != nil {
			return nil
		}
		out = append(out, OutputInfo{Path: rel, Size: fi.Size(), Modified: fi.ModTime().UTC(), Matched: slices.Contains(e.Outputs, rel)})
		return nil
	})
	return out, err
}

// OpenOutput opens file name (under outputs/, with or without the
// prefix) of execution id's session, confined to the session's directory
// (os.Root): no path, and no symbolic link an agent made, reaches outside.
func (a *agentService) OpenOutput(ctx context.Context, id, name string) (*os.File, os.FileInfo, error) {
	e, err := a.execution(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	rel := strings.TrimPrefix(name, "outputs/")
	if !filepath.IsLocal(rel) || strings.ContainsRune(rel, '\\') {
		return nil, nil, invalidf("output %q: name a file under outputs/, like report.md", name)
	}
	root, err := a.sessionRoot(e.Session)
	if err != nil {
		return nil, nil, err
	}
	return openOutput(root, path.Join("outputs", rel))
}

// sessionRoot opens the session's directory to read its outputs: in the
// daemon's host view, or on a compute node (workspace.remote) a
// read-only mount of the session served by the workspace node.
func (a *agentService) sessionRoot(session string) (*os.Root, error) {
	var root *os.Root
	var err error
	if _, remote := a.work.(remoteWorkspace); remote {
		root, err = a.work.OpenSession(session)
	} else {
		root, err = os.OpenRoot(filepath.Join(a.cfg.Workspace.Mount, session))
	}
	if err != nil {
		return nil, notFoundf("the session's directory is gone: %v", err)
	}
	return root, nil
}

// CreditsInfo is the state of the credits: the balance and the latest
// ledger entries, newest first.
type CreditsInfo struct {
	Enabled                    bool
	Available, Reserved, Spent float64
	Entries                    []store.CreditEntry
}

// Credits returns the balance and the last creditEntries entries.
func (a *agentService) Credits(ctx context.Context) (CreditsInfo, error) {
	avail, reserved, spent, err := a.store.Balance(ctx)
	if err != nil {
		return CreditsInfo{}, err
	}
	entries, err := a.store.CreditEntries(ctx, "")
	if err != nil {
		return CreditsInfo{}, err
	}
	out := CreditsInfo{Enabled: a.cfg.Credits.Enabled, Available: avail, Reserved: reserved, Spent: spent, Entries: []store.CreditEntry{}}
	for i := len(entries) - 1; i >= 0 && len(out.Entries) < creditEntries; i-- {
		out.Entries = append(out.Entries, entries[i])
	}
	return out, nil
}

// AddCredits adds usd dollars (positive) to the balance.
func (a *agentService) AddCredits(ctx context.Context, usd float64, note string) error {
	if err := store.CheckUSD(usd); err != nil || usd == 0 {
		if err == nil {
			err = errors.New("0 adds nothing: give a positive number of dollars")
		}
		return invalidf("usd: %v", err)
	}
	if err := a.store.AddCredits(ctx, usd, note); err != nil {
		return err
	}
	a.log.Info("credits added", "usd", usd, "note", note)
	return nil
}

// UploadsDir is where a task's streamed input files are staged, one
// directory per task, until its execution ends.
func (a *agentService) UploadsDir() string { return filepath.Join(a.cfg.StateDir, "uploads") }

// clearUploads removes what a daemon that died left staged: every run
// copies its inputs before its agent starts, so none is still needed.
func clearUploads(stateDir string, logger *slog.Logger) {
	if err := os.RemoveAll(filepath.Join(stateDir, "uploads")); err != nil {
		logger.Warn("agents: clear staged uploads", "err", err)
	}
}
