package agents

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/vmm/guest"
)

// DefaultBudgetWait is how long a paused execution waits for a top-up.
const DefaultBudgetWait = 24 * time.Hour

// ErrNoDollarLimit: a top-up of an execution that has no USD limit.
var ErrNoDollarLimit = errors.New("the execution has no dollar limit to raise")

// holdState is a run's model call held at a dollar limit, if any.
type holdState struct {
	mu       sync.Mutex
	release  chan bool // set while a call is held: true for a top-up
	stopping bool      // the run is being stopped: hold nothing more
	timedOut bool      // a hold ended because no top-up came in time
	gc       *guest.Client
	pid      int // the agent's job: its process group is stopped while held
	topMu    sync.Mutex
}

// setAgentProc records the agent's job (its process group) and the
// guest that runs it, for holdCall.
func (ru *run) setAgentProc(gc *guest.Client, pid int) {
	ru.hold.mu.Lock()
	ru.hold.gc, ru.hold.pid = gc, pid
	ru.hold.mu.Unlock()
}

func (ru *run) agentProc() (*guest.Client, int) {
	ru.hold.mu.Lock()
	defer ru.hold.mu.Unlock()
	return ru.hold.gc, ru.hold.pid
}

// onBudget is what reaching the USD limit does for this run.
func (ru *run) onBudget() string {
	if ru.limits.OnBudget != "" {
		return ru.limits.OnBudget
	}
	return ru.r.cfg.OnBudget
}

// holdCall is the gateway's Hold for this run (see gateway.Execution):
// with on_budget = "pause" it marks the execution awaiting_budget,
// stops the agent's processes and its wall-time clock, and waits for a
// top-up (true), the budget wait to run out, the run to be stopped or
// the call to be let go (false). The agent and the clock go on either
// way.
func (ru *run) holdCall(ctx context.Context, d gateway.Decision) bool {
	h := &ru.hold
	h.mu.Lock()
	if ru.onBudget() != OnBudgetPause || h.stopping || h.gc == nil {
		h.mu.Unlock()
		return false
	}
	release := make(chan bool, 1)
	h.release = release
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.release = nil
		h.mu.Unlock()
	}()
	wait := ru.r.cfg.BudgetWait
	detail := map[string]any{"wait": wait.String()}
	for _, u := range d.Limits {
		if u.Level == gateway.Deny {
			detail["limit"], detail["used"], detail["max"] = u.Limit, u.Used, u.Max
			break
		}
	}
	ru.setStatus(store.AwaitingBudget, detail)
	ru.clock.pause()
	// The agent's processes are stopped (SIGSTOP to the CLI's process
	// group), not the whole machine: a frozen machine's guest agent stops
	// answering the host's keepalives, and the host drops its connection
	// (and with it the agent's job) after about 40 seconds.
	gc, pid := ru.agentProc()
	if gc != nil {
		if err := gc.Signal(context.Background(), pid, "STOP"); err != nil {
			ru.emit(stream.New("", "", stream.Error, map[string]string{
				"message": "the agent could not be stopped while it awaits a top-up (it waits for its model call, not stopped): " + err.Error()}))
		}
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	raised := false
	select {
	case raised = <-release:
	case <-timer.C:
		h.mu.Lock()
		h.timedOut = true
		h.mu.Unlock()
	case <-ctx.Done():
	}
	if gc != nil {
		if err := gc.Signal(context.Background(), pid, "CONT"); err != nil {
			ru.emit(stream.New("", "", stream.Error, map[string]string{"message": "the agent could not be continued: " + err.Error()}))
		}
	}
	ru.clock.resume()
	h.mu.Lock()
	stopping := h.stopping
	h.mu.Unlock()
	switch {
	case stopping: // the run ends: its end says how
	case raised:
		ru.setStatus(store.Running, map[string]any{"resumed": true})
	case ctx.Err() != nil:
		// Let go by a gateway that drains (the agent retries its call into
		// the next daemon), or the agent hung up: running again.
		ru.setStatus(store.Running, map[string]any{"resumed": true, "reason": "the held call was let go: " + context.Cause(ctx).Error()})
	}
	return raised
}

// setStatus moves the execution to status (running or awaiting_budget)
// and says so in the stream.
func (ru *run) setStatus(status store.Status, detail map[string]any) {
	_, err := ru.r.cfg.Store.UpdateExecution(context.Background(), ru.exec.ID, func(e *store.Execution) error {
		if e.Status.Terminal() {
			return nil
		}
		e.Status = status
		return nil
	})
	if err != nil {
		ru.emit(stream.New("", "", stream.Error, map[string]string{"message": fmt.Sprintf("record the status %s: %v", status, err)}))
	}
	ru.status(string(status), detail)
}

// wake lets go of a held call (refused) and holds none from now on: the
// run is being stopped, and a paused machine would not see the signal.
func (ru *run) wake() {
	h := &ru.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopping = true
	if h.release != nil {
		select {
		case h.release <- false:
		default:
		}
	}
}

// waitedOut says whether a hold ended because no top-up came in time.
func (ru *run) waitedOut() bool {
	ru.hold.mu.Lock()
	defer ru.hold.mu.Unlock()
	return ru.hold.timedOut
}

// TopUp raises a running execution's USD limit by usd: reserved from the
// credit balance first when credits are in use (ErrInsufficientCredits
// if it has not that much), recorded in the execution's limits and
// stream (a budget event with level "topped_up"), and, if the execution
// awaits budget, its held model call goes on with the new limit. An
// execution this runner is not running is ErrNotFound; one without a USD
// limit, ErrNoDollarLimit.
func (r *Runner) TopUp(ctx context.Context, execution string, usd float64) (store.Execution, error) {
	if err := store.CheckUSD(usd); err != nil || !(usd > 0) || math.IsInf(usd, 0) {
		return store.Execution{}, fmt.Errorf("%w: top-up of $%v: give a positive number of dollars", store.ErrInvalid, usd)
	}
	r.mu.Lock()
	ru := r.runs[execution]
	r.mu.Unlock()
	if ru == nil {
		return store.Execution{}, fmt.Errorf("%w: execution %s is not running (only a running or paused execution can be topped up)", ErrNotFound, execution)
	}
	ru.hold.topMu.Lock()
	defer ru.hold.topMu.Unlock()
	if ru.budget.limit() <= 0 {
		return store.Execution{}, fmt.Errorf("%w: %s", ErrNoDollarLimit, execution)
	}
	if err := r.fund(ctx, ru, usd); err != nil {
		return store.Execution{}, err
	}
	limit := ru.budget.Raise(usd)
	exec, err := r.cfg.Store.UpdateExecution(ctx, execution, func(e *store.Execution) error {
		e.Limits.USD = limit
		return nil
	})
	if err != nil {
		return exec, fmt.Errorf("record the top-up: %w", err)
	}
	spent, _ := ru.budget.Spent()
	ru.emit(stream.New("", "", stream.Budget, gateway.BudgetPayload{Limit: "usd", Used: spent, Max: limit, Level: "topped_up"}))
	ru.hold.mu.Lock()
	if ru.hold.release != nil {
		select {
		case ru.hold.release <- true:
		default:
		}
	}
	ru.hold.mu.Unlock()
	return exec, nil
}

// fund finds usd more for ru's limit: a delegated execution's comes out
// of what its parent has left (and of the parent's credit reservation),
// as its first limit did, so a top-up never lets a tree spend more than
// its root's limit; a root's comes from the credit balance when credits
// are in use.
func (r *Runner) fund(ctx context.Context, ru *run, usd float64) error {
	pr, _ := ru.parentRun()
	if pr == nil {
		if r.cfg.Credits {
			if err := r.cfg.Store.Reserve(ctx, ru.exec.ID, usd); err != nil {
				return fmt.Errorf("top-up of $%.2f: %w (add some with 'hearth credits add')", usd, err)
			}
		}
		return nil
	}
	if pr.budget.limit() > 0 {
		if left, ok := pr.budget.hold(usd); !ok {
			return fmt.Errorf("%w: top-up of $%.2f: execution %s was delegated by %s, which has $%.2f left: top up the parent first", ErrRefused, usd, ru.exec.ID, pr.exec.ID, left)
		}
	}
	if r.cfg.Credits {
		if err := r.cfg.Store.Carve(ctx, pr.exec.ID, ru.exec.ID, usd); err != nil {
			pr.budget.settle(usd, 0)
			return fmt.Errorf("top-up of $%.2f from its parent %s: %w", usd, pr.exec.ID, err)
		}
	}
	ru.tree.mu.Lock()
	ru.tree.held += usd
	ru.tree.mu.Unlock()
	return nil
}

// wallClock is the wall-time limit's timer, which stops while the
// execution awaits a top-up.
type wallClock struct {
	mu      sync.Mutex
	t       *time.Timer
	left    time.Duration
	started time.Time
	fire    func()
	paused  bool
}

func (c *wallClock) start(left time.Duration, fire func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left, c.fire, c.started = left, fire, time.Now()
	c.t = time.AfterFunc(left, fire)
}

func (c *wallClock) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t != nil {
		c.t.Stop()
		c.t = nil
	}
}

func (c *wallClock) pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t == nil || c.paused {
		return
	}
	if c.t.Stop() {
		c.left = max(0, c.left-time.Since(c.started))
		c.paused = true
	}
}

func (c *wallClock) resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t == nil || !c.paused {
		return
	}
	c.paused = false
	c.started = time.Now()
	c.t = time.AfterFunc(c.left, c.fire)
}
