package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"hearth/agents"
	"hearth/agents/store"
	"hearth/appliance/api"
)

// The agent routes: definitions, delegation, executions, sessions,
// outputs and credits. Reads work whenever the store is open; starting
// an execution needs the runner.

// maxInputs bounds the input files of one JSON task request, in all
// (documented in openapi.yaml): they travel as base64, held whole by
// client and daemon. Bigger ones are streamed (MaxInputFiles).
const maxInputs = 16 << 20

// maxTaskBody bounds a delegate or resume request: maxInputs as base64
// (21.3 MiB), a prompt of up to maxPrompt, JSON-escaped, and the rest.
const maxTaskBody = 32 << 20

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

// start checks a task and launches it; see launch.
func (a *agentService) start(ctx context.Context, t task) (store.Execution, <-chan outcome, error) {
	e, done, err := a.check(ctx, t)
	if err != nil && t.staging != "" {
		os.RemoveAll(t.staging)
	}
	return e, done, err
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
	if err := a.ready(ctx, def, limits.USD); err != nil {
		return store.Execution{}, nil, err
	}
	req := t.TaskRequest
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
	if err := a.ready(ctx, def, old.Limits.USD); err != nil {
		return store.Execution{}, nil, err
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
	busy, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Session: id, Status: []store.Status{store.Pending, store.Running}, Limit: 1})
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
	if _, err := a.images.resolve(def.Image); err != nil {
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
	running, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Status: []store.Status{store.Pending, store.Running}})
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

// limits reads the API's limits.
func limits(l api.Limits) (agents.Limits, error) {
	out := agents.Limits{USD: l.Usd, Turns: l.Turns}
	if err := store.CheckUSD(l.Usd); err != nil {
		return out, invalidf("limits.usd: %v (0 or none for the agent's limit)", err)
	}
	if l.WallTime != "" {
		d, err := time.ParseDuration(l.WallTime)
		if err != nil {
			return out, invalidf("limits.wall_time %q: write a duration like 90s, 10m or 1h", l.WallTime)
		}
		out.WallTime = agents.Duration(d)
	}
	if out.USD < 0 || out.Turns < 0 || out.WallTime < 0 {
		return out, invalidf("limits must not be negative")
	}
	return out, nil
}

func limitsView(usd float64, turns int, wall time.Duration) api.Limits {
	l := api.Limits{Usd: usd, Turns: turns}
	if wall > 0 {
		l.WallTime = wall.String()
	}
	return l
}

// view describes an execution for the API; while it runs here, with what
// the gateway metered so far.
func (a *agentService) view(e store.Execution) api.Execution {
	if lr, ok := a.live(e.ID); ok && !e.Status.Terminal() {
		e.Turns, e.USD, e.Tokens = lr.turns, lr.usd, lr.tokens
	}
	out := api.Execution{
		Id: e.ID, Session: e.Session, Agent: e.Agent, Kind: api.ExecutionKind(e.Kind), Parent: e.Parent,
		Prompt: e.Prompt, PromptTruncated: e.PromptTruncated, Status: api.ExecutionStatus(e.Status), Created: e.Created,
		Limits: limitsView(e.Limits.USD, e.Limits.Turns, e.Limits.WallTime), Turns: e.Turns, Usd: e.USD,
		Tokens: api.Tokens{Input: e.Tokens.Input, Output: e.Tokens.Output, CacheRead: e.Tokens.CacheRead, CacheCreation: e.Tokens.CacheCreation},
		Result: e.Result, Error: e.Error, Outputs: e.Outputs,
	}
	if !e.Started.IsZero() {
		out.Started = &e.Started
	}
	if !e.Ended.IsZero() {
		out.Ended = &e.Ended
	}
	return out
}

// started answers a start: at once (202) or, with wait, when the
// execution has ended (201). A client that hangs up while waiting leaves
// the execution running.
func (s *server) started(w http.ResponseWriter, r *http.Request, wait bool, t task) {
	a := s.d.agents
	e, done, err := a.start(r.Context(), t)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	if !wait {
		reply(w, http.StatusAccepted, a.view(e))
		return
	}
	select {
	case <-done:
	case <-r.Context().Done():
		return
	}
	e, err = a.store.GetExecution(context.Background(), e.ID)
	result(w, http.StatusCreated, a.view(e), err)
}

func (s *server) DelegateTask(w http.ResponseWriter, r *http.Request) {
	var req api.DelegateRequest
	files, staging, ok := s.decodeTask(w, r, &req)
	if !ok {
		return
	}
	lim, err := limits(req.Limits)
	if err == nil && req.Agent == "" && req.Session == "" {
		err = invalidf("name the agent to delegate to (agent)")
	}
	if err != nil {
		os.RemoveAll(staging)
		fail(w, apiError(err))
		return
	}
	s.started(w, r, req.Wait, task{TaskRequest: agents.TaskRequest{Agent: req.Agent, Prompt: req.Prompt, Inputs: req.Inputs,
		InputFiles: files, Outputs: req.Outputs, Limits: lim, Session: req.Session}, staging: staging})
}

func (s *server) ResumeSession(w http.ResponseWriter, r *http.Request, id string) {
	var req api.ResumeRequest
	files, staging, ok := s.decodeTask(w, r, &req)
	if !ok {
		return
	}
	lim, err := limits(req.Limits)
	if err != nil {
		os.RemoveAll(staging)
		fail(w, apiError(err))
		return
	}
	s.started(w, r, req.Wait, task{TaskRequest: agents.TaskRequest{Prompt: req.Prompt, Inputs: req.Inputs, InputFiles: files,
		Limits: lim, Session: id}, staging: staging})
}

func (s *server) RetryExecution(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	var req api.RetryRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	s.started(w, r, req.Wait, task{Retry: id})
}

func (s *server) GetExecution(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	e, err := s.d.agents.execution(r.Context(), id)
	result(w, http.StatusOK, s.d.agents.view(e), err)
}

func (s *server) ListExecutions(w http.ResponseWriter, r *http.Request, params api.ListExecutionsParams) {
	f := store.ExecutionFilter{Agent: params.Agent, Session: params.Session, Before: params.Before, Limit: params.Limit,
		PromptPreview: promptPreview}
	if params.Limit < 0 {
		fail(w, apiError(invalidf("limit must not be negative")))
		return
	}
	for _, st := range params.Status {
		for _, one := range strings.Split(st, ",") {
			if !store.Status(one).Valid() {
				fail(w, apiError(invalidf("status %q: use pending, running, completed, failed, budget_exceeded, timed_out, cancelled or interrupted", one)))
				return
			}
			f.Status = append(f.Status, store.Status(one))
		}
	}
	list, err := s.d.agents.store.ListExecutions(r.Context(), f)
	out := make([]api.Execution, 0, len(list))
	for _, e := range list {
		out = append(out, s.d.agents.view(e))
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) CancelExecution(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	a := s.d.agents
	e, err := a.execution(r.Context(), id)
	if err == nil && e.Status.Terminal() {
		err = conflictf("execution %s has already ended (%s)", id, e.Status)
	}
	if err == nil {
		err = a.available()
	}
	if err != nil {
		fail(w, apiError(err))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), cancelWait)
	defer cancel()
	ended := a.cancelRun(ctx, id)
	e, err = a.store.GetExecution(context.Background(), id)
	status := http.StatusOK
	if !ended {
		status = http.StatusAccepted
	}
	result(w, status, a.view(e), err)
}

// cancelRun tells the runner to stop the execution and waits until it has
// ended or ctx is done; it reports whether it ended. An execution still
// being accepted is told as soon as it can be.
func (a *agentService) cancelRun(ctx context.Context, id string) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
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

func (s *server) ListAgents(w http.ResponseWriter, r *http.Request) {
	a := s.d.agents
	out := []api.AgentDefinition{}
	for _, name := range a.names() {
		d := a.def(name)
		if d == nil {
			continue // removed by a reload since names() ran
		}
		out = append(out, api.AgentDefinition{Name: d.Name, Description: d.Description, Image: d.Image, Model: d.Model,
			Outputs: d.Outputs, Network: d.Network, Schedule: d.Schedule,
			Limits: limitsView(d.Limits.USD, d.Limits.Turns, time.Duration(d.Limits.WallTime))})
	}
	reply(w, http.StatusOK, out)
}

func (s *server) ListAgentSessions(w http.ResponseWriter, r *http.Request, params api.ListAgentSessionsParams) {
	if params.Limit < 0 {
		fail(w, apiError(invalidf("limit must not be negative")))
		return
	}
	list, err := s.d.agents.store.ListSessions(r.Context(), store.SessionFilter{Agent: params.Agent, Before: params.Before, Limit: params.Limit})
	out := make([]api.AgentSession, 0, len(list))
	for _, sess := range list {
		out = append(out, api.AgentSession{Id: sess.ID, Agent: sess.Agent, Created: sess.Created, LastExecution: sess.LastExecution})
	}
	result(w, http.StatusOK, out, err)
}

// The outputs routes read the session through the daemon's host view,
// rooted at the session's directory (os.Root): no path, and no symbolic
// link an agent made, reaches outside it.

func (s *server) ListOutputs(w http.ResponseWriter, r *http.Request, id api.ExecutionID) {
	a := s.d.agents
	e, err := a.execution(r.Context(), id)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	dir := filepath.Join(a.cfg.Workspace.Mount, e.Session)
	out := []api.OutputFile{}
	err = filepath.WalkDir(filepath.Join(dir, "outputs"), func(p string, de os.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil // a file gone meanwhile, a directory, a link
		}
		fi, err := de.Info()
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		out = append(out, api.OutputFile{Path: rel, Size: fi.Size(), Modified: fi.ModTime().UTC(), Matched: slices.Contains(e.Outputs, rel)})
		return nil
	})
	result(w, http.StatusOK, out, err)
}

func (s *server) DownloadOutput(w http.ResponseWriter, r *http.Request, id api.ExecutionID, name string) {
	a := s.d.agents
	e, err := a.execution(r.Context(), id)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	rel := strings.TrimPrefix(name, "outputs/")
	if !filepath.IsLocal(rel) || strings.ContainsRune(rel, '\\') {
		fail(w, apiError(invalidf("output %q: name a file under outputs/, like report.md", name)))
		return
	}
	f, fi, err := openOutput(filepath.Join(a.cfg.Workspace.Mount, e.Session), path.Join("outputs", rel))
	if err != nil {
		fail(w, apiError(err))
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(fi.Size()))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
}

// openOutput opens the regular file p (relative, under outputs/) of the
// session directory dir, confined to dir.
func openOutput(dir, p string) (*os.File, os.FileInfo, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, notFoundf("the session's directory is gone: %v", err)
	}
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

func (s *server) GetCredits(w http.ResponseWriter, r *http.Request) {
	out, err := s.d.agents.credits(r.Context())
	result(w, http.StatusOK, out, err)
}

func (s *server) AddCredits(w http.ResponseWriter, r *http.Request) {
	var req api.AddCreditsRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	a := s.d.agents
	if err := store.CheckUSD(req.Usd); err != nil || req.Usd == 0 {
		if err == nil {
			err = errors.New("0 adds nothing: give a positive number of dollars")
		}
		fail(w, apiError(invalidf("usd: %v", err)))
		return
	}
	if err := a.store.AddCredits(r.Context(), req.Usd, req.Note); err != nil {
		fail(w, apiError(err))
		return
	}
	a.log.Printf("credits: added $%.2f (%s)", req.Usd, req.Note)
	out, err := a.credits(r.Context())
	result(w, http.StatusOK, out, err)
}

// creditEntries is how many ledger entries the credits route shows.
const creditEntries = 20

func (a *agentService) credits(ctx context.Context) (api.Credits, error) {
	avail, reserved, spent, err := a.store.Balance(ctx)
	if err != nil {
		return api.Credits{}, err
	}
	entries, err := a.store.CreditEntries(ctx, "")
	if err != nil {
		return api.Credits{}, err
	}
	out := api.Credits{Enabled: a.cfg.Credits.Enabled, Available: avail, Reserved: reserved, Spent: spent, Entries: []api.CreditEntry{}}
	for i := len(entries) - 1; i >= 0 && len(out.Entries) < creditEntries; i-- {
		c := entries[i]
		out.Entries = append(out.Entries, api.CreditEntry{Id: c.ID, Time: c.Time, Kind: api.CreditEntryKind(c.Kind),
			Execution: c.Execution, Usd: c.USD, Note: c.Note})
	}
	return out, nil
}
