package agents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"hearth/agents/adapter"
	"hearth/agents/channel"
	"hearth/agents/egress"
	"hearth/agents/gateway"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/vmm"
	"hearth/vmm/guest"
)

// run takes the execution from pending to its end: the session and its
// inputs, a machine with the session's view, the agent CLI inside it
// talking to the gateway (and, if it may reach any domain, the egress
// proxy) through forwarded ports, its output turned into events, and at
// the end the outputs, the totals and the status.
func (ru *run) run(ctx context.Context, req TaskRequest) (Result, error) {
	cfg := ru.r.cfg
	sess := ru.exec.Session
	off := cfg.Driver.Capabilities().HostIDOffset
	uid, gid := ru.img.UID+off, ru.img.GID+off
	q := Quota{Bytes: int64(ru.def.Limits.WorkspaceBytes), Files: ru.def.Limits.WorkspaceFiles}
	if err := cfg.Workspace.EnsureSession(sess, uid, gid, q); err != nil {
		return ru.fail(err)
	}
	var inputs []string
	for name, data := range req.Inputs {
		if name == "" || path.Base(name) != name || name == "." || name == ".." {
			return ru.fail(fmt.Errorf("input %q: give a plain file name", name))
		}
		if err := cfg.Workspace.WriteFile(sess, "inputs/"+name, bytes.NewReader(data), uid, gid); err != nil {
			return ru.fail(fmt.Errorf("input %s: %w", name, err))
		}
		inputs = append(inputs, "inputs/"+name)
	}
	for name, file := range req.InputFiles {
		if name == "" || path.Base(name) != name || name == "." || name == ".." || req.Inputs[name] != nil {
			return ru.fail(fmt.Errorf("input %q: give a plain file name, once", name))
		}
		if err := copyInput(cfg.Workspace, sess, name, file, uid, gid); err != nil {
			return ru.fail(err)
		}
		inputs = append(inputs, "inputs/"+name)
	}
	sort.Strings(inputs)
	prompt, err := ru.def.Render(Task{Prompt: req.Prompt, Inputs: inputs, Session: sess, Outputs: ru.outputs})
	if err != nil {
		return ru.fail(err)
	}
	if err := cfg.Workspace.WriteFile(sess, promptFile, strings.NewReader(prompt), uid, gid); err != nil {
		return ru.fail(fmt.Errorf("write the prompt: %w", err))
	}
	if ru.ctxArgs, err = ru.place(req, uid, gid); err != nil {
		return ru.fail(err)
	}
	ru.snapshot("start") // the session as the agent finds it
	files, stopFiles, err := cfg.Workspace.FileEvents(sess)
	if err != nil {
		return ru.fail(err)
	}
	defer stopFiles()
	go ru.fileEvents(files)
	m, cleanup, err := ru.boot(ctx)
	if err != nil {
		return ru.fail(err)
	}
	defer cleanup()
	gc := m.Guest()
	listen, proxy, token, err := ru.connect(ctx, gc)
	if err != nil {
		return ru.fail(err)
	}
	defer ru.disconnect()
	return ru.agent(ctx, gc, token, listen, proxy)
}

// copyInput streams the host file into the session's inputs/.
func copyInput(ws Workspace, sess, name, file string, uid, gid uint32) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("input %s: %w", name, err)
	}
	defer f.Close()
	if err := ws.WriteFile(sess, "inputs/"+name, f, uid, gid); err != nil {
		return fmt.Errorf("input %s: %w", name, err)
	}
	return nil
}

// promptFile is where the rendered prompt waits for the agent CLI,
// relative to the session: in its private home, overwritten by each
// execution (a session runs one at a time). The CLI reads it on stdin
// ("claude -p" with no prompt argument), not from argv, whose size the
// kernel bounds (128 KiB an argument): a long prompt failed with
// "argument list too long".
const promptFile = ".home/.hearth-prompt"

// connect admits the execution to the gateway (and the egress proxy, if
// its agent may reach any domain) and forwards them into the machine. It
// returns the gateway's address inside the machine, the proxy URL ("" for
// none) and the agent's gateway token; ru.disconnect revokes the
// execution's tokens.
func (ru *run) connect(ctx context.Context, gc *guest.Client) (listen, proxy, token string, err error) {
	cfg := ru.r.cfg
	var budget gateway.Budget = ru.budget
	if cfg.Credits {
		budget = ledgerBudget{budget, cfg.Store, ru.exec.ID}
	}
	budget = storeGate{budget, ru}
	// The token is admitted only through this machine's channel: one
	// that leaks from its outputs cannot be spent from another machine.
	token = cfg.Gateway.Register(gateway.Execution{Session: ru.exec.Session, ID: ru.exec.ID, Budget: budget,
		Token: ru.r.token("gateway", ru.exec.ID), Channel: ru.exec.ID, Hold: ru.holdCall, Answered: ru.callAnswered})
	gc.Serve("gateway", channel.Dial(cfg.GatewayDial, ru.exec.ID))
	listen = "127.0.0.1:" + strconv.Itoa(cfg.GatewayPort)
	if _, err := gc.Forward(ctx, listen, "gateway"); err != nil {
		cfg.Gateway.Unregister(token)
		return "", "", "", fmt.Errorf("forward the model gateway into the machine: %w", err)
	}
	proxy, revokeEgress, err := ru.egress(ctx, gc)
	if err != nil {
		cfg.Gateway.Unregister(token)
		return "", "", "", err
	}
	revokeInside, err := ru.inside(ctx, gc)
	if err != nil {
		cfg.Gateway.Unregister(token)
		revokeEgress()
		return "", "", "", err
	}
	ru.disconnect = sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), revokeWait)
		defer cancel()
		if err := cfg.Gateway.Revoke(ctx, token); err != nil {
			ru.emit(stream.New("", "", stream.Error, map[string]string{"message": err.Error() + "; their events may follow the execution's end"}))
		}
		revokeEgress()
		revokeInside()
	})
	return listen, proxy, token, nil
}

// revokeWait bounds how long an ending execution waits for its model
// calls in flight (whose agent is gone) to be metered.
const revokeWait = 10 * time.Second

// fileEvents turns the session's file events into the execution's.
func (ru *run) fileEvents(files <-chan FileEvent) {
	for fe := range files {
		// The agent's private home (its CLI's state) is not news.
		if fe.Path != ".home" && !strings.HasPrefix(fe.Path, ".home/") {
			ru.emit(stream.New("", "", stream.File, fe))
		}
	}
}

// egress gives the machine the egress proxy if the agent may reach any
// domain. It returns the proxy's URL inside the machine, with the
// execution's token as its password ("" without a proxy), and how to
// revoke the token.
func (ru *run) egress(ctx context.Context, gc *guest.Client) (proxy string, revoke func(), err error) {
	cfg := ru.r.cfg
	if cfg.Egress == nil || len(ru.def.Network) == 0 {
		return "", func() {}, nil
	}
	token := cfg.Egress.Register(egress.Execution{Session: ru.exec.Session, ID: ru.exec.ID, Allow: ru.def.Network,
		Token: ru.r.token("egress", ru.exec.ID), Channel: ru.exec.ID})
	gc.Serve("egress", channel.Dial(cfg.EgressDial, ru.exec.ID))
	listen := "127.0.0.1:" + strconv.Itoa(cfg.EgressPort)
	if _, err := gc.Forward(ctx, listen, "egress"); err != nil {
		cfg.Egress.Unregister(token)
		return "", nil, fmt.Errorf("forward the egress proxy into the machine: %w", err)
	}
	return "http://exec:" + token + "@" + listen, func() { cfg.Egress.Unregister(token) }, nil
}

// proxyEnv points the usual proxy variables at proxy, in both cases
// (curl reads only the lower-case http_proxy), keeping the model gateway
// and anything else on the machine's loopback direct.
func proxyEnv(env map[string]string, proxy string) {
	for _, k := range []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"} {
		env[k] = proxy
	}
	env["NO_PROXY"], env["no_proxy"] = "127.0.0.1,localhost", "127.0.0.1,localhost"
}

// boot boots the execution's machine with the session's view; cleanup
// destroys it and unmounts the view.
func (ru *run) boot(ctx context.Context) (vmm.Machine, func(), error) {
	cfg := ru.r.cfg
	view, unmount, err := cfg.Workspace.MountView(ru.exec.Session, ru.exec.ID)
	if err != nil {
		return nil, nil, err
	}
	m, err := cfg.Driver.Create(ctx, vmm.Spec{ID: ru.exec.ID, RootFS: ru.img.RootFS, Workspace: view,
		UID: ru.img.UID, GID: ru.img.GID, Memory: cfg.Memory, Pids: 4096, Disk: cfg.Disk})
	if err != nil {
		unmount()
		return nil, nil, fmt.Errorf("boot the agent's machine: %w", err)
	}
	return m, func() {
		if !ru.detached { // a detached agent goes on in its machine
			m.Destroy(context.Background())
		}
		unmount()
	}, nil
}

// agent runs the agent CLI until it ends or is stopped.
func (ru *run) agent(ctx context.Context, gc *guest.Client, token, listen, proxy string) (Result, error) {
	cfg := ru.r.cfg
	work := WorkDir(ru.exec.Session)
	c := cliStart{gateway: "http://" + listen, token: token, work: work, home: work + "/.home",
		resume: ru.agentSession, mcp: slices.Clone(ru.mcpServers)}
	if ru.onBudget() == OnBudgetPause {
		c.wait = cfg.BudgetWait
	}
	if s, ok := ru.insideServer(); ok {
		c.mcp = append([]MCPServer{s}, c.mcp...)
	}
	argv, env, err := ru.cli.start(ru, c)
	if err != nil {
		return ru.fail(err)
	}
	if proxy != "" {
		proxyEnv(env, proxy)
	}
	for k, v := range ru.def.Env {
		env[k] = v
	}
	env["HEARTH_PROMPT"] = work + "/" + promptFile
	if _, err := cfg.Store.UpdateExecution(ctx, ru.exec.ID, func(e *store.Execution) error { e.Status = store.Running; return nil }); err != nil {
		return ru.fail(err)
	}
	ru.status("running", map[string]any{"agent": ru.def.Name, "model": ru.def.Model})
	// A job, not an exec: it outlives the host's connection, so a daemon
	// that stops with agents.on_shutdown = "leave" can leave it running
	// and the next one can follow its output on from where this one was.
	job, err := gc.StartJob(ctx, guest.ExecRequest{Argv: argv, Env: env, Dir: work})
	if err == nil && job.State != guest.JobRunning {
		err = errors.New(job.Exit.Error)
	}
	if err != nil {
		return ru.fail(fmt.Errorf("start the agent: %w", err))
	}
	return ru.follow(ctx, gc, agentJob{ID: job.ID, PID: job.PID})
}

// agentJob is the agent's job in its machine and how far its output has
// been turned into events.
type agentJob struct {
	ID     string `json:"job"`
	PID    int    `json:"pid"`
	Stdout int64  `json:"stdout_offset"`
	Stderr int64  `json:"stderr_offset"`
}

// follow turns the agent's output into events, from the offsets in job,
// until it ends, is stopped, or the runner detaches from it.
func (ru *run) follow(ctx context.Context, gc *guest.Client, job agentJob) (Result, error) {
	ru.setAgentProc(gc, job.PID)
	fctx, unfollow := context.WithCancel(context.Background())
	defer unfollow()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	outGate, errGate := &lineGate{w: outW}, &lineGate{w: errW}
	followed := make(chan error, 2)
	for _, f := range []struct {
		stream string
		from   int64
		gate   *lineGate
	}{{"stdout", job.Stdout, outGate}, {"stderr", job.Stderr, errGate}} {
		go func() {
			_, err := gc.FollowJob(fctx, job.ID, f.stream, f.from, f.gate)
			followed <- err
		}()
	}
	// abandon lets go of an agent whose machine stopped answering: the
	// followers are told to stop, and its output ends where it is, so
	// that parsing it ends too.
	abandon := func() {
		unfollow()
		outW.Close()
		errW.Close()
	}
	exited := make(chan guest.ExitStatus, 1)
	go func() {
		var ferr error
		for range 2 {
			if err := <-followed; err != nil && ferr == nil {
				ferr = err
			}
		}
		if fctx.Err() != nil { // detached: the agent goes on
			outW.Close()
			errW.Close()
			close(exited)
			return
		}
		outGate.flush()
		errGate.flush()
		outW.Close()
		errW.Close()
		jctx, cancel := context.WithTimeout(context.Background(), ru.r.cfg.KillWait)
		st, err := gc.Job(jctx, job.ID)
		cancel()
		switch {
		case err != nil:
			st.Exit = guest.ExitStatus{Code: -1, Error: "the agent's machine stopped answering: " + err.Error()}
		case ferr != nil && st.State == guest.JobRunning:
			st.Exit = guest.ExitStatus{Code: -1, Error: "following the agent's output: " + ferr.Error()}
		}
		exited <- st.Exit
	}()
	parsed := make(chan adapter.Summary, 1)
	go func() {
		sum, _ := ru.cli.adapter().Run(adapter.IDs{Session: ru.exec.Session, Execution: ru.exec.ID}, outR, errR, ru.emit)
		parsed <- sum
	}()
	if wall := time.Duration(ru.limits.WallTime); wall > 0 {
		left := wall
		if !ru.exec.Started.IsZero() {
			left = wall - time.Since(ru.exec.Started)
		}
		ru.clock.start(max(left, 0), func() { ru.stop(stopWallTime) })
		defer ru.clock.stop()
		ru.startFollowing(time.Now().Add(max(left, 0)))
	} else {
		ru.startFollowing(time.Time{})
	}
	var why stopReason
	var st guest.ExitStatus
	select {
	case st = <-exited:
	case why = <-ru.stopc:
		if why == stopDetach {
			unfollow()
			<-exited
			// Let go of the machine: its agent serves one host at a time,
			// and the next runner connects to it.
			gc.Close()
			job.Stdout += outGate.passed
			job.Stderr += errGate.passed
			return ru.detach(job, <-parsed)
		}
		ru.wake()
		st = ru.terminate(gc, job.PID, exited, abandon)
	case <-ctx.Done():
		ru.wake()
		why = stopCancel
		st = ru.terminate(gc, job.PID, exited, abandon)
	}
	sum := <-parsed
	return ru.finish(why, st, sum)
}

// lineGate passes on whole lines only, so that output cut off at a
// detach is taken up again at a line's start; flush passes the rest.
type lineGate struct {
	w       io.Writer
	pending []byte
	passed  int64 // bytes passed on
}

func (g *lineGate) Write(p []byte) (int, error) {
	g.pending = append(g.pending, p...)
	if i := bytes.LastIndexByte(g.pending, '\n'); i >= 0 {
		n, err := g.w.Write(g.pending[:i+1])
		g.passed += int64(n)
		g.pending = append(g.pending[:0], g.pending[i+1:]...)
		if err != nil {
			return len(p), err
		}
	}
	return len(p), nil
}

func (g *lineGate) flush() {
	if len(g.pending) > 0 {
		n, _ := g.w.Write(g.pending)
		g.passed += int64(n)
		g.pending = nil
	}
}

// terminate stops the agent gracefully: TERM, then KILL after the grace
// period. Its partial outputs stay in the workspace. An agent still not
// ended KillWait after KILL is in a machine that stopped answering: it is
// given up on (abandon stops following its output) and the machine is
// destroyed with the run, so that no wait here is unbounded.
func (ru *run) terminate(gc *guest.Client, pid int, exited chan guest.ExitStatus, abandon func()) guest.ExitStatus {
	killWait := ru.r.cfg.KillWait
	signal := func(sig string) {
		ctx, cancel := context.WithTimeout(context.Background(), killWait)
		defer cancel()
		gc.Signal(ctx, pid, sig)
	}
	signal("TERM")
	select {
	case st := <-exited:
		return st
	case <-time.After(ru.r.cfg.Grace):
	}
	signal("KILL")
	select {
	case st := <-exited:
		return st
	case <-time.After(killWait):
	}
	abandon()
	return guest.ExitStatus{Code: -1, Signal: "KILL", Error: fmt.Sprintf(
		"the agent had not ended %v after SIGKILL: its machine stopped answering, and is destroyed", killWait)}
}

// finish records how the execution ended.
func (ru *run) finish(why stopReason, st guest.ExitStatus, sum adapter.Summary) (Result, error) {
	cfg := ru.r.cfg
	ctx := context.Background()
	if ru.disconnect != nil {
		// The agent is gone: its last calls are metered and their events
		// written before the totals and the end.
		ru.disconnect()
	}
	status, errText := store.Completed, ""
	storeErr := ru.storeError()
	switch {
	case storeErr != nil:
		status, errText = store.Failed, "the store could not record the execution, so it was stopped and its model calls refused: "+storeErr.Error()
	case why == stopBudget && ru.waitedOut():
		status, errText = store.BudgetExceeded, fmt.Sprintf("a budget limit was reached and no top-up came in %v; the agent was stopped", cfg.BudgetWait)
	case why == stopBudget:
		status, errText = store.BudgetExceeded, "a budget limit was reached; the agent was stopped"
	case why == stopWallTime:
		status, errText = store.TimedOut, fmt.Sprintf("the wall-time limit of %v was reached; the agent was stopped", time.Duration(ru.limits.WallTime))
	case why == stopCancel:
		status, errText = store.Cancelled, "cancelled"
		if note := ru.parentCancelNote(); note != "" {
			errText = note
		}
	case st.Error != "":
		status, errText = store.Failed, "the agent could not run: "+st.Error
	case st.Code != 0:
		status, errText = store.Failed, fmt.Sprintf("the agent exited with status %d%s", st.Code, signalNote(st))
	case sum.Status == adapter.Unknown && ru.cli.name() == CLICommand:
		// A command says nothing of its outcome but its exit code, 0.
	case sum.Status != adapter.Completed:
		status, errText = store.Failed, fmt.Sprintf("the agent ended without a successful result (%s)", orNone(string(sum.Status)))
	}
	if status == store.Failed && sum.Result != "" {
		errText += ": " + sum.Result
	}
	if why != 0 && st.Error != "" { // how the stop itself went
		errText += " (" + st.Error + ")"
	}
	// Its children end first: their spend is then in its totals.
	ru.endChildren("ended " + string(status))
	var outputs []string
	for _, pattern := range ru.outputs {
		matched, err := cfg.Workspace.Glob(ru.exec.Session, pattern)
		if err == nil {
			outputs = append(outputs, matched...)
		}
	}
	slices.Sort(outputs)
	outputs = slices.Compact(outputs)
	if sum.AgentSessionID != "" {
		cfg.Store.SetAgentSessionID(ctx, ru.exec.Session, sum.AgentSessionID)
	}
	ru.endClaims()
	ru.snapshot("end")
	if err := cfg.Store.Flush(ctx); err != nil && ru.err == nil {
		ru.err = err
	}
	if cfg.Credits {
		// Before the end is announced, so the balance a caller then reads
		// is final; the machine is torn down after.
		ru.releaseCredits(ctx)
	}
	usd, turns := ru.budget.Spent()
	tokens := ru.tokens()
	exec, err := cfg.Store.UpdateExecution(ctx, ru.exec.ID, func(e *store.Execution) error {
		e.Status, e.Error, e.Result, e.Outputs = status, errText, sum.Result, outputs
		e.USD, e.Turns, e.Tokens = usd, turns, tokens
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrWriteFailed) {
		return Result{}, err
	}
	// With ErrWriteFailed, exec is the record the store keeps and writes
	// once it can; readers see it already.
	ru.status(string(status), map[string]any{"error": errText, "turns": turns, "usd": usd, "outputs": outputs})
	if err != nil {
		return Result{Execution: exec, Outputs: outputs, Stream: sum}, err
	}
	if err := cfg.Store.Flush(ctx); err != nil && ru.err == nil {
		ru.err = err
	}
	return Result{Execution: exec, Outputs: outputs, Stream: sum}, ru.err
}

// fail ends an execution that could not start its agent (cancelled, if
// its parent's end stopped it).
func (ru *run) fail(cause error) (Result, error) {
	ru.endChildren("failed")
	ru.endClaims()
	ru.endSnapshot()
	status, errText := store.Failed, cause.Error()
	if note := ru.parentCancelNote(); note != "" {
		status, errText = store.Cancelled, note+" ("+errText+")"
	}
	exec, err := ru.r.cfg.Store.UpdateExecution(context.Background(), ru.exec.ID, func(e *store.Execution) error {
		e.Status, e.Error = status, errText
		return nil
	})
	ru.status(string(status), map[string]any{"error": errText})
	ru.r.cfg.Store.Flush(context.Background())
	if err != nil {
		// With ErrWriteFailed, exec is kept and written once it can be.
		return Result{Execution: exec}, fmt.Errorf("%w (and recording it: %v)", cause, err)
	}
	return Result{Execution: exec}, cause
}

// tokens adds up the model calls' tokens, from the gateway's events.
func (ru *run) tokens() store.Tokens {
	evs, _ := allEvents(context.Background(), ru.r.cfg.Store, ru.exec.ID)
	_, _, t := CallTotals(evs)
	return t
}

func signalNote(st guest.ExitStatus) string {
	if st.Signal != "" {
		return " (signal " + st.Signal + ")"
	}
	return ""
}

func orNone(s string) string {
	if s == "" {
		return "no result"
	}
	return s
}

// ledgerBudget charges what the gateway meters to the execution's credit
// reservation too. The reservation equals the USD limit, so the limit's
// checks keep spend within it.
type ledgerBudget struct {
	gateway.Budget
	store *store.Store
	exec  string
}

func (b ledgerBudget) Charge(usd float64, turns int) {
	b.Budget.Charge(usd, turns)
	if usd > 0 {
		b.store.Spend(context.Background(), b.exec, usd)
	}
}
