package agents

import (
	"context"
	"errors"
	"fmt"

	"hearth/agents/store"
)

// Queued executions: one runner records an execution (pending) and a
// cluster's queue hands it to whichever node has room, whose runner runs
// it with RunRecorded. Run and Retry are Record and RunRecorded in one
// step, on one runner, except that their run never leaves memory.

// ErrNotPending: the execution to run is not pending (it runs, ran or
// was given up already), or is not one a queue may carry.
var ErrNotPending = errors.New("execution is not a pending, queued one")

// Queued is what running a recorded execution needs besides what the
// store keeps of it: the task's files and additions. It travels with the
// queued job, so it holds bytes, never local paths.
type Queued struct {
	Inputs       map[string][]byte `json:"inputs,omitempty"`
	Outputs      []string          `json:"outputs,omitempty"`
	MCPServers   []MCPServer       `json:"mcp_servers,omitempty"`
	Skills       []string          `json:"skills,omitempty"`
	Context      []ContextFile     `json:"context,omitempty"`
	AgentSession string            `json:"agent_session,omitempty"`
}

// Record checks a task as Run does and records its execution, pending,
// without running it. A delegated task (Parent) is refused: its budget
// is carved out of its parent's, which lives in the parent's runner.
// Streamed input files (InputFiles) are local paths: refused too.
func (r *Runner) Record(ctx context.Context, req TaskRequest) (store.Execution, Queued, error) {
	if req.Parent != "" || len(req.InputFiles) > 0 {
		return store.Execution{}, Queued{}, fmt.Errorf("%w: a delegated task or one with streamed input files runs where it was asked for", ErrNotPending)
	}
	p, err := r.plan(ctx, req)
	if err != nil {
		return store.Execution{}, Queued{}, err
	}
	return r.recordOnly(ctx, p)
}

// RecordRetry records, pending, the retry of a finished execution.
func (r *Runner) RecordRetry(ctx context.Context, execution string) (store.Execution, Queued, error) {
	p, err := r.planRetry(ctx, execution)
	if err != nil {
		return store.Execution{}, Queued{}, err
	}
	return r.recordOnly(ctx, p)
}

func (r *Runner) recordOnly(ctx context.Context, p planned) (store.Execution, Queued, error) {
	p.queued = true
	if _, _, err := r.record(ctx, &p); err != nil {
		return store.Execution{}, Queued{}, err
	}
	q := Queued{Inputs: p.req.Inputs, Outputs: p.req.Outputs, MCPServers: p.req.MCPServers, Skills: p.req.Skills,
		Context: p.req.Context, AgentSession: p.agentSession}
	return p.exec, q, nil
}

// RunRecorded takes over (store.Adopt) a pending execution recorded by
// Record, on this runner's node or another, and runs it to its end. An
// execution that is not pending, or was delegated, is ErrNotPending and
// left as it is; q is checked as a task's additions are.
func (r *Runner) RunRecorded(ctx context.Context, id string, q Queued) (Result, error) {
	st := r.cfg.Store
	e, err := st.GetExecution(ctx, id)
	if err != nil {
		return Result{}, fmt.Errorf("run queued execution %s: %w", id, err)
	}
	if e.Status != store.Pending || e.Parent != "" {
		return Result{}, fmt.Errorf("run queued execution %s: %w: it is %s", id, ErrNotPending, e.Status)
	}
	p, err := r.planRecorded(e, q)
	if err != nil {
		return Result{}, fmt.Errorf("run queued execution %s: %w", id, err)
	}
	img, err := r.cfg.Images(p.def.Image)
	if err != nil {
		return Result{}, fmt.Errorf("agent %s: image %s: %w", p.def.Name, p.def.Image, err)
	}
	cli, err := cliFor(p.def, img)
	if err != nil {
		return Result{}, err
	}
	if p.exec, err = st.Adopt(ctx, id); err != nil {
		return Result{}, fmt.Errorf("run queued execution %s: %w", id, err)
	}
	return r.start(ctx, p, img, cli)
}

// planRecorded rebuilds a recorded execution's plan: its agent, prompt,
// session and limits from the store, the rest from q.
func (r *Runner) planRecorded(e store.Execution, q Queued) (planned, error) {
	r.mu.Lock()
	def := r.agents[e.Agent]
	r.mu.Unlock()
	if def == nil {
		return planned{}, fmt.Errorf("%w: no agent %q", ErrNotFound, e.Agent)
	}
	limits := def.Limits
	limits.USD, limits.Turns, limits.WallTime, limits.OnBudget = e.Limits.USD, e.Limits.Turns, Duration(e.Limits.WallTime), e.Limits.OnBudget
	req := TaskRequest{Agent: e.Agent, Prompt: e.Prompt, Inputs: q.Inputs, Outputs: q.Outputs,
		MCPServers: q.MCPServers, Skills: q.Skills, Context: q.Context}
	if e.Kind == store.Resume {
		req.Session = e.Session
	}
	if err := def.CheckTask(req); err != nil {
		return planned{}, fmt.Errorf("agent %s: %w", def.Name, err)
	}
	outputs := def.Outputs
	if len(q.Outputs) > 0 {
		outputs = q.Outputs
	}
	return planned{def: def, limits: limits, exec: e, outputs: outputs, agentSession: q.AgentSession, req: req}, nil
}
