package appliance

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"hearth/agents"
	"hearth/agents/inside"
	"hearth/agents/store"
	"hearth/fs"
)

// insidePlatform is the hearth MCP server's Platform (package
// agents/inside): what an agent in a machine does through its tools, as
// that execution, over the agent service and its runner. It is served on
// <state_dir>/hearth-mcp.sock through the machines' channels, like the
// gateway.
type insidePlatform struct{ a *agentService }

var _ inside.Platform = insidePlatform{}

// maxInsideInputs bounds what one delegation copies into its child's
// inputs/, in all: the files are read whole, like a JSON task's inputs.
const maxInsideInputs = maxInputs

// insidePoll is how often a wait looks at an execution this daemon does
// not run (one a previous daemon left, which ends through its recovery).
const insidePoll = 500 * time.Millisecond

func (p insidePlatform) Delegate(ctx context.Context, c inside.Caller, d inside.Delegation) (inside.Status, error) {
	a := p.a
	inputs := map[string][]byte{}
	var total int64
	for _, in := range d.Inputs {
		// The store's tree is read, never a mount: a symbolic link
		// anywhere on the path is refused, not followed.
		data, err := a.work.ReadFile(in.Session, in.Path, maxInsideInputs-total+1)
		switch {
		case errors.Is(err, fs.ErrSymlinkInPath):
			return inside.Status{}, fmt.Errorf("input %s/%s: a symbolic link is on its path or is the file: give the file itself", in.Session, in.Path)
		case errors.Is(err, fs.ErrNotFound):
			return inside.Status{}, fmt.Errorf("input %s/%s: no such file", in.Session, in.Path)
		case errors.Is(err, fs.ErrIsDir):
			return inside.Status{}, fmt.Errorf("input %s/%s is a directory: name its files", in.Session, in.Path)
		case err != nil:
			return inside.Status{}, fmt.Errorf("input %s/%s: %v", in.Session, in.Path, err)
		}
		if total += int64(len(data)); total > maxInsideInputs {
			return inside.Status{}, fmt.Errorf("the inputs are more than %d bytes in all: hand on fewer or smaller files, or let the child read them under /workspace/agents/", maxInsideInputs)
		}
		inputs[in.Name] = data
	}
	if err := agents.CheckOnBudget(d.Limits.OnBudget); err != nil {
		return inside.Status{}, fmt.Errorf("limits.%v", err)
	}
	t := task{TaskRequest: agents.TaskRequest{Agent: d.Agent, Prompt: d.Prompt, Inputs: inputs, Outputs: d.Outputs,
		Limits: agents.Limits{USD: d.Limits.USD, Turns: d.Limits.Turns, WallTime: agents.Duration(d.Limits.WallTime), OnBudget: d.Limits.OnBudget},
		Parent: c.Execution}}
	// Checked against the child's definition by Start, as the API's are.
	for _, m := range d.MCPServers {
		t.MCPServers = append(t.MCPServers, agents.MCPServer{Name: m.Name, Command: m.Command, Env: m.Env, URL: m.URL, Headers: m.Headers})
	}
	t.Skills = d.Skills
	for i, cf := range d.Context {
		if cf.Text == "" { // the agents directory's files are not the caller's to read
			return inside.Status{}, fmt.Errorf("context[%d]: give the file's text", i)
		}
		t.Context = append(t.Context, agents.ContextFile{Text: cf.Text, To: cf.To})
	}
	e, _, err := a.Start(ctx, t)
	if err != nil {
		return inside.Status{}, err
	}
	return insideStatus(e), nil
}

func (p insidePlatform) Execution(ctx context.Context, c inside.Caller, id string) (inside.Status, error) {
	e, err := p.scoped(ctx, c, id)
	if err != nil {
		return inside.Status{}, err
	}
	return p.withChildren(ctx, insideStatus(e))
}

// maxListedChildren bounds the children a status lists.
const maxListedChildren = 100

// withChildren lists st's children, oldest first.
func (p insidePlatform) withChildren(ctx context.Context, st inside.Status) (inside.Status, error) {
	kids, err := p.a.store.ListExecutions(ctx, store.ExecutionFilter{Parent: st.Execution, Limit: maxListedChildren})
	if err != nil {
		return inside.Status{}, err
	}
	for i := len(kids) - 1; i >= 0; i-- {
		st.Children = append(st.Children, kids[i].ID)
	}
	return st, nil
}

func (p insidePlatform) Wait(ctx context.Context, c inside.Caller, id string) (inside.Status, error) {
	e, err := p.scoped(ctx, c, id)
	for err == nil && !e.Status.Terminal() {
		// An execution this daemon runs says when it ends; one it does
		// not (a previous daemon's, ending through recovery) is polled.
		done, _ := p.a.liveDone(id) // nil when not: never ready
		var poll <-chan time.Time
		if done == nil {
			poll = time.After(insidePoll)
		}
		select {
		case <-done:
		case <-poll:
		case <-ctx.Done():
			e, err = p.a.Execution(context.WithoutCancel(ctx), id)
			if err != nil {
				return inside.Status{}, err
			}
			return p.withChildren(context.WithoutCancel(ctx), insideStatus(e)) // as it is: Ended says it goes on
		}
		e, err = p.a.Execution(context.WithoutCancel(ctx), id)
	}
	if err != nil {
		return inside.Status{}, err
	}
	return p.withChildren(ctx, insideStatus(e))
}

// scoped is execution id if it is the caller or one of its descendants,
// else inside.ErrNotFound: another tree's executions do not exist for it.
func (p insidePlatform) scoped(ctx context.Context, c inside.Caller, id string) (store.Execution, error) {
	e, err := p.a.Execution(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, ErrNotFound) {
			return store.Execution{}, inside.ErrNotFound
		}
		return store.Execution{}, err
	}
	for cur, hops := e, 0; ; hops++ {
		if cur.ID == c.Execution {
			return e, nil
		}
		up := cur.Parent
		if up == "" || hops > maxTreeHops {
			return store.Execution{}, inside.ErrNotFound
		}
		if cur, err = p.a.store.GetExecution(ctx, up); err != nil {
			return store.Execution{}, inside.ErrNotFound
		}
	}
}

// maxTreeHops bounds the walk up a tree (depth is bounded far below).
const maxTreeHops = 64

func (p insidePlatform) Agents(ctx context.Context, c inside.Caller) ([]inside.Agent, error) {
	var out []inside.Agent
	for _, d := range p.a.Definitions() {
		l := inside.LimitsJSON{USD: d.Limits.USD, Turns: d.Limits.Turns}
		if d.Limits.WallTime > 0 {
			l.WallTime = time.Duration(d.Limits.WallTime).String()
		}
		out = append(out, inside.Agent{Name: d.Name, Description: d.Description, Model: d.Model, Limits: l})
	}
	return out, nil
}

// insideSessions bounds list_sessions.
const insideSessions = 100

func (p insidePlatform) Sessions(ctx context.Context, c inside.Caller) ([]inside.Session, error) {
	list, err := p.a.Sessions(ctx, store.SessionFilter{Limit: insideSessions})
	if err != nil {
		return nil, err
	}
	var out []inside.Session
	for _, s := range list {
		is := inside.Session{ID: s.ID, Agent: s.Agent, Created: s.Created}
		if s.LastExecution != "" {
			if e, err := p.a.store.GetExecution(ctx, s.LastExecution); err == nil {
				is.LastStatus = string(e.Status)
			}
		}
		out = append(out, is)
	}
	return out, nil
}

// insideStatus is what the tools say of an execution; its outputs are
// relative to /workspace/agents.
func insideStatus(e store.Execution) inside.Status {
	st := inside.Status{Execution: e.ID, Session: e.Session, Agent: e.Agent, Parent: e.Parent, Depth: e.Depth,
		Status: string(e.Status), Ended: e.Status.Terminal(),
		USD: e.USD, TotalUSD: e.TotalUSD, Turns: e.Turns, Result: e.Result, Error: e.Error,
		Tokens: inside.Tokens{Input: e.Tokens.Input, Output: e.Tokens.Output, CacheRead: e.Tokens.CacheRead, CacheCreation: e.Tokens.CacheCreation}}
	for _, o := range e.Outputs {
		st.Outputs = append(st.Outputs, path.Join(e.Session, o))
	}
	return st
}
