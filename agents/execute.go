package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"hearth/agents/adapter"
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
	if err := cfg.Workspace.EnsureSession(sess, uid, gid); err != nil {
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
	sort.Strings(inputs)
	prompt, err := ru.def.Render(Task{Prompt: req.Prompt, Inputs: inputs, Session: sess, Outputs: ru.outputs})
	if err != nil {
		return ru.fail(err)
	}
	files, stopFiles := cfg.Workspace.FileEvents(sess)
	defer stopFiles()
	go func() {
		for fe := range files {
			// The agent's private home (its CLI's state) is not news.
			if fe.Path != ".home" && !strings.HasPrefix(fe.Path, ".home/") {
				ru.emit(stream.New("", "", stream.File, fe))
			}
		}
	}()
	m, cleanup, err := ru.machine(ctx)
	if err != nil {
		return ru.fail(err)
	}
	defer cleanup()
	var budget gateway.Budget = ru.budget
	if cfg.Credits {
		budget = ledgerBudget{ru.budget, cfg.Store, ru.exec.ID}
	}
	token := cfg.Gateway.Register(gateway.Execution{Session: sess, ID: ru.exec.ID, Budget: budget})
	defer cfg.Gateway.Unregister(token)
	gc := m.Guest()
	gc.Serve("gateway", cfg.GatewayDial)
	listen := "127.0.0.1:" + strconv.Itoa(cfg.GatewayPort)
	if _, err := gc.Forward(ctx, listen, "gateway"); err != nil {
		return ru.fail(fmt.Errorf("forward the model gateway into the machine: %w", err))
	}
	proxy, revoke, err := ru.egress(ctx, gc)
	if err != nil {
		return ru.fail(err)
	}
	defer revoke()
	return ru.agent(ctx, gc, prompt, token, listen, proxy)
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
	token := cfg.Egress.Register(egress.Execution{Session: ru.exec.Session, ID: ru.exec.ID, Allow: ru.def.Network})
	gc.Serve("egress", cfg.EgressDial)
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

// machine boots the execution's machine with the session's view; cleanup
// destroys it and unmounts the view.
func (ru *run) machine(ctx context.Context) (vmm.Machine, func(), error) {
	cfg := ru.r.cfg
	view, unmount, err := cfg.Workspace.MountView(ru.exec.Session, ru.exec.ID)
	if err != nil {
		return nil, nil, err
	}
	m, err := cfg.Driver.Create(ctx, vmm.Spec{ID: ru.exec.ID, RootFS: ru.img.RootFS, Workspace: view,
		UID: ru.img.UID, GID: ru.img.GID, Memory: cfg.Memory, Pids: 4096})
	if err != nil {
		unmount()
		return nil, nil, fmt.Errorf("boot the agent's machine: %w", err)
	}
	return m, func() {
		m.Destroy(context.Background())
		unmount()
	}, nil
}

// agent runs the agent CLI until it ends or is stopped.
func (ru *run) agent(ctx context.Context, gc *guest.Client, prompt, token, listen, proxy string) (Result, error) {
	cfg := ru.r.cfg
	work := "/workspace/agents/" + ru.exec.Session
	argv := []string{"claude", "-p", prompt, "--output-format", "stream-json", "--verbose",
		"--dangerously-skip-permissions", "--model", ru.def.Model}
	if ru.agentSession != "" {
		argv = append(argv, "--resume", ru.agentSession)
	}
	env := map[string]string{
		"ANTHROPIC_BASE_URL": "http://" + listen, "ANTHROPIC_API_KEY": token,
		"HOME": work + "/.home", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
	}
	if proxy != "" {
		proxyEnv(env, proxy)
	}
	for k, v := range ru.def.Env {
		env[k] = v
	}
	if _, err := cfg.Store.UpdateExecution(ctx, ru.exec.ID, func(e *store.Execution) error { e.Status = store.Running; return nil }); err != nil {
		return ru.fail(err)
	}
	ru.status("running", map[string]any{"agent": ru.def.Name, "model": ru.def.Model})
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	proc, err := gc.Start(ctx, guest.ExecRequest{Argv: argv, Env: env, Dir: work}, nil, outW, errW)
	if err != nil {
		return ru.fail(fmt.Errorf("start the agent: %w", err))
	}
	exited := make(chan guest.ExitStatus, 1)
	go func() {
		st, err := proc.Wait()
		if err != nil && st.Error == "" {
			st.Error = err.Error()
		}
		outW.Close()
		errW.Close()
		exited <- st
	}()
	parsed := make(chan adapter.Summary, 1)
	go func() {
		sum, _ := (&adapter.ClaudeCode{}).Run(adapter.IDs{Session: ru.exec.Session, Execution: ru.exec.ID}, outR, errR, ru.emit)
		parsed <- sum
	}()
	if wall := time.Duration(ru.limits.WallTime); wall > 0 {
		t := time.AfterFunc(wall, func() { ru.stop(stopWallTime) })
		defer t.Stop()
	}
	var why stopReason
	var st guest.ExitStatus
	select {
	case st = <-exited:
	case why = <-ru.stopc:
		st = ru.terminate(gc, proc.PID, exited)
	case <-ctx.Done():
		why = stopCancel
		st = ru.terminate(gc, proc.PID, exited)
	}
	sum := <-parsed
	return ru.finish(why, st, sum)
}

// terminate stops the agent gracefully: TERM, then KILL after the grace
// period. Its partial outputs stay in the workspace.
func (ru *run) terminate(gc *guest.Client, pid int, exited chan guest.ExitStatus) guest.ExitStatus {
	ctx := context.Background()
	gc.Signal(ctx, pid, "TERM")
	select {
	case st := <-exited:
		return st
	case <-time.After(ru.r.cfg.Grace):
	}
	gc.Signal(ctx, pid, "KILL")
	return <-exited
}

// finish records how the execution ended.
func (ru *run) finish(why stopReason, st guest.ExitStatus, sum adapter.Summary) (Result, error) {
	cfg := ru.r.cfg
	ctx := context.Background()
	status, errText := store.Completed, ""
	switch {
	case why == stopBudget:
		status, errText = store.BudgetExceeded, "a budget limit was reached; the agent was stopped"
	case why == stopWallTime:
		status, errText = store.TimedOut, fmt.Sprintf("the wall-time limit of %v was reached; the agent was stopped", time.Duration(ru.limits.WallTime))
	case why == stopCancel:
		status, errText = store.Cancelled, "cancelled"
	case st.Error != "":
		status, errText = store.Failed, "the agent could not run: "+st.Error
	case st.Code != 0:
		status, errText = store.Failed, fmt.Sprintf("the agent exited with status %d%s", st.Code, signalNote(st))
	case sum.Status != adapter.Completed:
		status, errText = store.Failed, fmt.Sprintf("the agent ended without a successful result (%s)", orNone(string(sum.Status)))
	}
	if status == store.Failed && sum.Result != "" {
		errText += ": " + sum.Result
	}
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
	if err := cfg.Store.Flush(ctx); err != nil && ru.err == nil {
		ru.err = err
	}
	if cfg.Credits {
		// Before the end is announced, so the balance a caller then reads
		// is final; the machine is torn down after.
		cfg.Store.Release(ctx, ru.exec.ID)
	}
	usd, turns := ru.budget.Spent()
	tokens := ru.tokens()
	exec, err := cfg.Store.UpdateExecution(ctx, ru.exec.ID, func(e *store.Execution) error {
		e.Status, e.Error, e.Result, e.Outputs = status, errText, sum.Result, outputs
		e.USD, e.Turns, e.Tokens = usd, turns, tokens
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	ru.status(string(status), map[string]any{"error": errText, "turns": turns, "usd": usd, "outputs": outputs})
	if err := cfg.Store.Flush(ctx); err != nil && ru.err == nil {
		ru.err = err
	}
	return Result{Execution: exec, Outputs: outputs}, ru.err
}

// fail ends an execution that could not start its agent.
func (ru *run) fail(cause error) (Result, error) {
	exec, err := ru.r.cfg.Store.UpdateExecution(context.Background(), ru.exec.ID, func(e *store.Execution) error {
		e.Status, e.Error = store.Failed, cause.Error()
		return nil
	})
	ru.status(string(store.Failed), map[string]any{"error": cause.Error()})
	ru.r.cfg.Store.Flush(context.Background())
	if err != nil {
		return Result{}, fmt.Errorf("%w (and recording it: %v)", cause, err)
	}
	return Result{Execution: exec}, cause
}

// tokens adds up the model calls' tokens, from the gateway's events.
func (ru *run) tokens() store.Tokens {
	evs, _ := ru.r.cfg.Store.Events(context.Background(), ru.exec.ID, 0, 0)
	var t store.Tokens
	for _, ev := range evs {
		if ev.Type != stream.ModelCall {
			continue
		}
		var p gateway.ModelCallPayload
		if json.Unmarshal(ev.Payload, &p) == nil {
			t.Input += p.InputTokens
			t.Output += p.OutputTokens
			t.CacheRead += p.CacheReadTokens
			t.CacheCreation += p.CacheCreationTokens
		}
	}
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
	*gateway.Limits
	store *store.Store
	exec  string
}

func (b ledgerBudget) Charge(usd float64, turns int) {
	b.Limits.Charge(usd, turns)
	if usd > 0 {
		b.store.Spend(context.Background(), b.exec, usd)
	}
}
