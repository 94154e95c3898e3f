package agents

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"

	"hearth/agents/adapter"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/vmm"
)

// A daemon that stops can leave its agents running (the appliance's
// agents.on_shutdown = "leave"): Detach stops following each running
// execution without touching its agent, and records where it stopped in
// a "detached" status event; the next daemon's runner takes each one up
// again with Reattach, once its machine has been recovered. The agent
// runs as a job in its machine, so it does not notice the host going
// away, except that the model gateway, the egress proxy and the
// workspace view do not answer until the next daemon is up.

// ErrDetached is what Run, Retry and Reattach return for an execution
// that was still running when the runner detached from it: it goes on in
// its machine, and the store says "running".
var ErrDetached = errors.New("detached: the agent goes on running in its machine")

// detachedStatus is the status event of a detach.
const detachedStatus = "detached"

// detachedPayload is where a detached execution's output was left, and
// what the next runner needs to go on.
type detachedPayload struct {
	Status string `json:"status"`
	agentJob
	Outputs []string `json:"outputs"` // the output patterns
	// CLI is the agent CLI whose output is followed ("" from before
	// Hearth ran other CLIs than Claude Code).
	CLI string `json:"cli,omitempty"`
}

// Detach stops following every running execution, leaving its agent
// running in its machine; each Run returns ErrDetached once its place is
// recorded. Only an execution of a machine that outlives the runner
// (every driver's do) can be taken up again.
func (r *Runner) Detach() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ru := range r.runs {
		ru.stop(stopDetach)
	}
}

// detach records where the agent's output was left.
func (ru *run) detach(job agentJob, sum adapter.Summary) (Result, error) {
	ru.detached = true
	ctx := context.Background()
	if sum.AgentSessionID != "" {
		ru.r.cfg.Store.SetAgentSessionID(ctx, ru.exec.Session, sum.AgentSessionID)
	}
	ru.emit(stream.New("", "", stream.Status, detachedPayload{Status: detachedStatus, agentJob: job, Outputs: ru.outputs, CLI: ru.cli.name()}))
	if err := ru.r.cfg.Store.Flush(ctx); err != nil && ru.err == nil {
		ru.err = err
	}
	exec, err := ru.r.cfg.Store.GetExecution(ctx, ru.exec.ID)
	if err != nil {
		return Result{}, err
	}
	if ru.err != nil {
		return Result{Execution: exec}, fmt.Errorf("%w; recording it: %v", ErrDetached, ru.err)
	}
	return Result{Execution: exec}, ErrDetached
}

// Detached reports whether the execution was left running by a runner
// that detached from it (its newest status event says so), so that
// Reattach can take it up.
func (r *Runner) Detached(ctx context.Context, execution string) (bool, error) {
	_, ok, err := r.detachedAt(ctx, execution)
	return ok, err
}

func (r *Runner) detachedAt(ctx context.Context, execution string) (detachedPayload, bool, error) {
	evs, err := allEvents(ctx, r.cfg.Store, execution)
	if err != nil {
		return detachedPayload{}, false, err
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type != stream.Status {
			continue
		}
		var p detachedPayload
		if json.Unmarshal(evs[i].Payload, &p) != nil || p.Status != detachedStatus {
			return detachedPayload{}, false, nil // a later status: it went on, or ended
		}
		return p, true, nil
	}
	return detachedPayload{}, false, nil
}

// Reattach takes up an execution a runner detached from, in machine m
// (recovered by the driver): it gives the machine a fresh workspace view,
// admits the agent's own tokens again, forwards the gateway and the proxy
// into the machine, and follows the agent's output from where it was
// left, under the budget spent so far, to its end. The agent keeps the
// definition of its name as it is now, and its execution's own limits
// (on_budget included, as it was recorded). ctx is the execution's: its end
// stops the agent. The accepted hook of ctx (WithAccepted) is called once
// the runner can cancel it.
func (r *Runner) Reattach(ctx context.Context, execution string, m vmm.Machine) (res Result, err error) {
	st := r.cfg.Store
	exec, err := st.GetExecution(ctx, execution)
	if err != nil {
		return Result{}, err
	}
	at, ok, err := r.detachedAt(ctx, execution)
	if err != nil {
		return Result{}, err
	}
	if !ok || exec.Status != store.Running {
		return Result{}, fmt.Errorf("execution %s is %s and was not detached: nothing to take up", exec.ID, exec.Status)
	}
	r.mu.Lock()
	def := r.agents[exec.Agent]
	r.mu.Unlock()
	ru := &run{r: r, def: def, exec: exec, outputs: at.Outputs, stopc: make(chan stopReason, 1),
		limits: Limits{USD: exec.Limits.USD, Turns: exec.Limits.Turns, WallTime: Duration(exec.Limits.WallTime), OnBudget: exec.Limits.OnBudget},
		budget: newTreeBudget(Limits{USD: exec.Limits.USD, Turns: exec.Limits.Turns})}
	ru.tree.init()
	if def == nil {
		return ru.fail(fmt.Errorf("agent %s is no longer defined, so its execution cannot be taken up", exec.Agent))
	}
	if at.CLI == "" {
		at.CLI = CLIClaudeCode
	}
	if ru.cli, err = cliNamed(at.CLI, def); err != nil {
		return ru.fail(err)
	}
	usd, turns, err := spentSoFar(ctx, st, execution)
	if err != nil {
		return ru.fail(err)
	}
	ru.budget.Charge(usd, turns) // the ledger was charged as it happened
	if err := ru.seedTree(ctx); err != nil {
		return ru.fail(err)
	}
	// Registered first, run last: once its credits went back.
	defer func() { ru.childEnded(res.Execution) }() // if track linked it to its parent
	if r.cfg.Credits {
		defer func() {
			if !ru.detached {
				ru.releaseCredits(context.Background()) // to its parent's reservation if linked
			}
		}()
	}
	defer r.track(ctx, ru)()
	return ru.reattach(ctx, m, at.agentJob)
}

func (ru *run) reattach(ctx context.Context, m vmm.Machine, job agentJob) (Result, error) {
	cfg := ru.r.cfg
	attacher, ok := m.(vmm.WorkspaceAttacher)
	if !ok {
		m.Destroy(context.Background())
		return ru.fail(fmt.Errorf("the %s machine cannot take a new workspace view, so its agent cannot go on", cfg.Driver.Name()))
	}
	view, unmount, err := cfg.Workspace.MountView(ru.exec.Session, ru.exec.ID)
	if err != nil {
		m.Destroy(context.Background())
		return ru.fail(err)
	}
	defer func() {
		if !ru.detached {
			m.Destroy(context.Background())
		}
		unmount()
	}()
	if err := attacher.AttachWorkspace(ctx, view); err != nil {
		return ru.fail(fmt.Errorf("give the machine its workspace view again: %w", err))
	}
	files, stopFiles, err := cfg.Workspace.FileEvents(ru.exec.Session)
	if err != nil {
		return ru.fail(err)
	}
	defer stopFiles()
	go ru.fileEvents(files)
	ru.resumeCallCount(ctx)
	gc := m.Guest()
	if _, _, _, err := ru.connect(ctx, gc); err != nil {
		return ru.fail(err)
	}
	defer ru.disconnect()
	ru.status("running", map[string]any{"agent": ru.def.Name, "model": ru.def.Model, "reattached": true})
	return ru.follow(ctx, gc, job)
}

// spentSoFar adds up what the gateway metered for an execution: its
// dollars and turns (calls with a message id, each counted once).
func spentSoFar(ctx context.Context, st *store.Store, execution string) (usd float64, turns int, err error) {
	evs, err := allEvents(ctx, st, execution)
	if err != nil {
		return 0, 0, err
	}
	usd, turns, _ = CallTotals(evs)
	return usd, turns, nil
}

// allEvents reads every stored event of an execution, page by page.
func allEvents(ctx context.Context, st *store.Store, execution string) ([]stream.Event, error) {
	var out []stream.Event
	var after int64
	for {
		page, err := st.Events(ctx, execution, after, 10000)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < 10000 {
			return out, nil
		}
		after = page[len(page)-1].Seq
	}
}

// token is the token of kind ("gateway", "egress") for an execution:
// derived from the runner's secret, so that a runner of the next daemon
// admits the token an agent it takes up already holds; "" (a random one)
// without a secret.
func (r *Runner) token(kind, execution string) string {
	if len(r.cfg.Secret) == 0 {
		return ""
	}
	mac := hmac.New(sha256.New, r.cfg.Secret)
	mac.Write([]byte(kind + "\x00" + execution))
	return "hearth-" + base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(mac.Sum(nil)[:20])
}
