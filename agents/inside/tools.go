package inside

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The tools. Their arguments and results are Go types: the SDK derives
// their JSON schemas and checks every call's arguments against them
// before a handler runs. A handler's error becomes a tool error (IsError
// and its text), which the model reads and can act on.

type limitsArgs struct {
	USD      float64 `json:"usd,omitempty" jsonschema:"dollars of model spend; at most the agent's limit and what you have left"`
	Turns    int     `json:"turns,omitempty" jsonschema:"model answers; at most the agent's limit"`
	WallTime string  `json:"wall_time,omitempty" jsonschema:"wall-clock time as a Go duration like 10m; at most the agent's limit"`
	OnBudget string  `json:"on_budget,omitempty" jsonschema:"what the child reaching its dollar limit does: stop (it ends budget_exceeded) or pause (it waits, awaiting_budget, for a top-up by the user); default the agent's"`
}

type delegateArgs struct {
	Agent   string      `json:"agent" jsonschema:"the agent to run the task, one list_agents names"`
	Prompt  string      `json:"prompt" jsonschema:"the task, complete: the child sees nothing else of your conversation"`
	Inputs  []string    `json:"inputs,omitempty" jsonschema:"files to copy into the child's inputs/ (by base name), as paths relative to /workspace/agents: any file of your own session but .home, or one under another session's outputs/"`
	Outputs []string    `json:"outputs,omitempty" jsonschema:"globs under outputs/ naming what the child produces, replacing the agent's own"`
	Limits  *limitsArgs `json:"limits,omitempty" jsonschema:"tighter limits for the child; they may only tighten the agent's, and its dollars come out of your own budget"`
	Wait    bool        `json:"wait,omitempty" jsonschema:"answer when the child has ended, with its result (at most until your own wall time runs out); default: at once, then use wait_execution"`
	// What the child gets besides its agent's own, checked as a task's
	// through the API.
	MCPServers []MCPServer   `json:"mcp_servers,omitempty" jsonschema:"MCP servers added to the child agent's own"`
	Skills     []string      `json:"skills,omitempty" jsonschema:"skill directories (each with a SKILL.md) added to the child agent's, from session files: session:SESSION/path, like session:session-1a2b3c/skills/review"`
	Context    []contextArgs `json:"context,omitempty" jsonschema:"context files (their text) placed for the child, like a CLAUDE.md"`
}

type contextArgs struct {
	ContextText
	File string `json:"file,omitempty" jsonschema:"not from inside: give text (a file of the agents directory is given by agent definitions only)"`
}

type executionArgs struct {
	Execution string `json:"execution" jsonschema:"an execution id, like exec-1a2b3c4d: your own or one of your descendants'"`
}

type waitArgs struct {
	Execution string `json:"execution" jsonschema:"an execution id, like exec-1a2b3c4d: your own child or descendant"`
	Timeout   string `json:"timeout,omitempty" jsonschema:"how long to wait at most, as a Go duration like 5m; default 10m, never past your own wall time"`
}

type waitFilesArgs struct {
	Session string `json:"session" jsonschema:"the session to watch, like session-a8f3e2 (yours or one list_sessions lists)"`
	Pattern string `json:"pattern" jsonschema:"a glob relative to the session, like outputs/*.md"`
	Changes bool   `json:"changes,omitempty" jsonschema:"wait for a matching file to be created or change, rather than for one to exist"`
	Timeout string `json:"timeout,omitempty" jsonschema:"how long to wait at most, as a Go duration like 2m; default 10m, at most 1h, never past your own wall time"`
}

type claimArgs struct {
	Path string `json:"path" jsonschema:"the path to claim, relative to /workspace/agents, like SESSION/outputs/chapter-3.md"`
	TTL  string `json:"ttl,omitempty" jsonschema:"how long the lease lasts unless renewed or released, as a Go duration like 10m; default 10m"`
}

type releaseArgs struct {
	Path string `json:"path" jsonschema:"a path you claimed"`
}

type listClaimsArgs struct {
	Prefix string `json:"prefix,omitempty" jsonschema:"only claims of paths starting with this; default all"`
}

type agentList struct {
	Agents []Agent `json:"agents"`
}

type sessionList struct {
	Sessions []Session `json:"sessions"`
}

type fileList struct {
	Files    []string `json:"files" jsonschema:"the matching files, relative to the session"`
	TimedOut bool     `json:"timed_out" jsonschema:"the timeout passed first"`
}

type claimList struct {
	Claims []Claim `json:"claims"`
}

type released struct {
	Released string `json:"released"`
}

// defaultWait bounds a wait without a timeout; maxWait any wait.
const (
	defaultWait = 10 * time.Minute
	maxWait     = 24 * time.Hour
	defaultTTL  = 10 * time.Minute
	maxFileWait = time.Hour
)

func (s *Server) addTools(ms *mcpsdk.Server) {
	ro := &mcpsdk.ToolAnnotations{ReadOnlyHint: true}
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "delegate_task", Description: "Hand a task to another agent, which runs it in its own isolated machine and session, " +
		"with a budget carved out of yours. Returns the child's execution and session at once (start several to work in parallel), " +
		"or with wait=true when it has ended, with its result and outputs. Read its outputs under /workspace/agents/<session>/outputs/."}, s.delegate)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "get_execution", Description: "An execution's status, cost (usd; total_usd with its descendants), tokens, result text, " +
		"output paths and error: your own or one of your descendants'.", Annotations: ro}, s.getExecution)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "wait_execution", Description: "Wait until a child (or other descendant) execution has ended, at most timeout, " +
		"and return it as get_execution does; ended=false means it is still running.", Annotations: ro}, s.waitExecution)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "list_agents", Description: "The agents you may delegate to, with their descriptions, models and limits.", Annotations: ro}, s.listAgents)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "list_sessions", Description: "The sessions whose files you may read under /workspace/agents/<id>/, newest first, " +
		"with their agent and the status of their last execution.", Annotations: ro}, s.listSessions)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "wait_for_files", Description: "Block until files matching a glob exist in a session (or, with changes, until one is created or changes), " +
		"at most timeout. Use it to wait for another agent's work instead of polling.", Annotations: ro}, s.waitForFiles)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "claim_path", Description: "Take an advisory lease on a path so that other agents know you are working on it; " +
		"fails if another agent holds it. Claiming a path you hold renews it. Release it when done."}, s.claimPath)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "release_path", Description: "Let go of a lease you took with claim_path."}, s.releasePath)
	mcpsdk.AddTool(ms, &mcpsdk.Tool{Name: "list_claims", Description: "The leases agents hold now: path, holder, expiry.", Annotations: ro}, s.listClaims)
}

// caller is the execution a tool call comes from (admitted by
// ServeHTTP, and still registered), and the call's context, which ends
// with ctx or with the registration. It refuses a call beyond the
// execution's MaxInFlight; done ends the call's count.
func (s *Server) caller(ctx context.Context, req *mcpsdk.CallToolRequest) (context.Context, Caller, func(), error) {
	if req == nil || req.Extra == nil {
		return ctx, Caller{}, func() {}, errors.New("no caller: this server answers agents in Hearth's machines only")
	}
	token, _ := bearer(req.Extra.Header)
	s.mu.RLock()
	r, ok := s.execs[token]
	s.mu.RUnlock()
	if !ok {
		return ctx, Caller{}, func() {}, errors.New("your execution has ended: its tools are closed")
	}
	if r.inFlight.Add(1) > MaxInFlight {
		r.inFlight.Add(-1)
		return ctx, Caller{}, func() {}, fmt.Errorf("%d of your tool calls are in flight already, the most at once: "+
			"wait for one to end (a wait ends at its timeout) before you call another", MaxInFlight)
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.done, cancel)
	return ctx, Caller{Execution: r.ID, Session: r.Session, Deadline: r.Deadline}, func() { stop(); cancel(); r.inFlight.Add(-1) }, nil
}

// bounded is ctx ending after d or at the caller's deadline, whichever
// comes first.
func bounded(ctx context.Context, c Caller, d time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(d)
	if !c.Deadline.IsZero() && c.Deadline.Before(deadline) {
		deadline = c.Deadline
	}
	return context.WithDeadline(ctx, deadline)
}

// duration parses a tool's duration argument: empty is def.
func duration(name, v string, def, most time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > most {
		return 0, fmt.Errorf("%s %q: give a positive Go duration like 90s or 10m, at most %v", name, v, most)
	}
	return d, nil
}

func (s *Server) delegate(ctx context.Context, req *mcpsdk.CallToolRequest, in delegateArgs) (*mcpsdk.CallToolResult, Status, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, Status{}, err
	}
	d, err := checkDelegation(c, in)
	if err != nil {
		return nil, Status{}, err
	}
	st, err := s.p.Delegate(ctx, c, d)
	if err != nil {
		return nil, Status{}, fmt.Errorf("delegate to %s: %w", in.Agent, err)
	}
	if !in.Wait {
		return nil, st, nil
	}
	wctx, cancel := bounded(ctx, c, maxWait)
	defer cancel()
	got, err := s.p.Wait(wctx, c, st.Execution)
	if err != nil {
		return nil, st, fmt.Errorf("child %s (session %s) started, but waiting for it failed: %w; follow it with wait_execution", st.Execution, st.Session, err)
	}
	return nil, got, nil
}

// checkDelegation checks delegate_task's arguments.
func checkDelegation(c Caller, in delegateArgs) (Delegation, error) {
	if strings.TrimSpace(in.Agent) == "" || strings.TrimSpace(in.Prompt) == "" {
		return Delegation{}, errors.New("delegate_task needs an agent (list_agents names them) and a prompt")
	}
	inputs, err := ParseInputs(c.Session, in.Inputs)
	if err != nil {
		return Delegation{}, err
	}
	if err := CheckOutputs(in.Outputs); err != nil {
		return Delegation{}, err
	}
	for _, sk := range in.Skills {
		if err := CheckSkill(c.Session, sk); err != nil {
			return Delegation{}, err
		}
	}
	d := Delegation{Agent: in.Agent, Prompt: in.Prompt, Inputs: inputs, Outputs: in.Outputs,
		MCPServers: in.MCPServers, Skills: in.Skills}
	for i, cf := range in.Context {
		if cf.File != "" {
			return Delegation{}, fmt.Errorf("context[%d]: file %q: the agents directory is not yours to read; give the file's text instead", i, cf.File)
		}
		if cf.Text == "" {
			return Delegation{}, fmt.Errorf("context[%d]: give the file's text", i)
		}
		d.Context = append(d.Context, cf.ContextText)
	}
	if in.Limits != nil {
		l := in.Limits
		if l.USD < 0 || l.Turns < 0 {
			return Delegation{}, errors.New("limits: usd and turns must not be negative; leave one out for the agent's own")
		}
		wall, err := duration("limits.wall_time", l.WallTime, 0, maxWait)
		if err != nil {
			return Delegation{}, err
		}
		d.Limits = Limits{USD: l.USD, Turns: l.Turns, WallTime: wall, OnBudget: l.OnBudget}
	}
	return d, nil
}

func (s *Server) getExecution(ctx context.Context, req *mcpsdk.CallToolRequest, in executionArgs) (*mcpsdk.CallToolResult, Status, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, Status{}, err
	}
	st, err := s.p.Execution(ctx, c, in.Execution)
	return nil, st, notFound(in.Execution, err)
}

func (s *Server) waitExecution(ctx context.Context, req *mcpsdk.CallToolRequest, in waitArgs) (*mcpsdk.CallToolResult, Status, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, Status{}, err
	}
	d, err := duration("timeout", in.Timeout, defaultWait, maxWait)
	if err != nil {
		return nil, Status{}, err
	}
	wctx, cancel := bounded(ctx, c, d)
	defer cancel()
	st, err := s.p.Wait(wctx, c, in.Execution)
	return nil, st, notFound(in.Execution, err)
}

// notFound words ErrNotFound for the caller.
func notFound(id string, err error) error {
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("execution %q not found: give your own execution or one you delegated (delegate_task returned its id)", id)
	}
	return err
}

func (s *Server) listAgents(ctx context.Context, req *mcpsdk.CallToolRequest, _ struct{}) (*mcpsdk.CallToolResult, agentList, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, agentList{}, err
	}
	list, err := s.p.Agents(ctx, c)
	if list == nil {
		list = []Agent{}
	}
	return nil, agentList{Agents: list}, err
}

func (s *Server) listSessions(ctx context.Context, req *mcpsdk.CallToolRequest, _ struct{}) (*mcpsdk.CallToolResult, sessionList, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, sessionList{}, err
	}
	list, err := s.p.Sessions(ctx, c)
	if list == nil {
		list = []Session{}
	}
	return nil, sessionList{Sessions: list}, err
}

func (s *Server) waitForFiles(ctx context.Context, req *mcpsdk.CallToolRequest, in waitFilesArgs) (*mcpsdk.CallToolResult, fileList, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, fileList{}, err
	}
	if err := CheckSession(in.Session); err != nil {
		return nil, fileList{}, err
	}
	if err := CheckPattern(in.Pattern); err != nil {
		return nil, fileList{}, err
	}
	d, err := duration("timeout", in.Timeout, defaultWait, maxFileWait)
	if err != nil {
		return nil, fileList{}, err
	}
	if !c.Deadline.IsZero() {
		d = min(d, time.Until(c.Deadline).Truncate(time.Millisecond))
	}
	if d <= 0 {
		return nil, fileList{Files: []string{}, TimedOut: true}, nil // the caller's wall time is up
	}
	files, err := s.p.WaitForFiles(ctx, c, in.Session, in.Pattern, in.Changes, d)
	if err != nil {
		return nil, fileList{}, err
	}
	if files == nil {
		files = []string{}
	}
	return nil, fileList{Files: files, TimedOut: len(files) == 0}, nil
}

func (s *Server) claimPath(ctx context.Context, req *mcpsdk.CallToolRequest, in claimArgs) (*mcpsdk.CallToolResult, Claim, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, Claim{}, err
	}
	if err := CheckClaimPath(in.Path); err != nil {
		return nil, Claim{}, err
	}
	ttl, err := duration("ttl", in.TTL, defaultTTL, maxWait)
	if err != nil {
		return nil, Claim{}, err
	}
	cl, err := s.p.ClaimPath(ctx, c, in.Path, ttl)
	return nil, cl, err
}

func (s *Server) releasePath(ctx context.Context, req *mcpsdk.CallToolRequest, in releaseArgs) (*mcpsdk.CallToolResult, released, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, released{}, err
	}
	if err := CheckClaimPath(in.Path); err != nil {
		return nil, released{}, err
	}
	if err := s.p.ReleasePath(ctx, c, in.Path); err != nil {
		return nil, released{}, err
	}
	return nil, released{Released: in.Path}, nil
}

func (s *Server) listClaims(ctx context.Context, req *mcpsdk.CallToolRequest, in listClaimsArgs) (*mcpsdk.CallToolResult, claimList, error) {
	ctx, c, done, err := s.caller(ctx, req)
	defer done()
	if err != nil {
		return nil, claimList{}, err
	}
	if strings.ContainsAny(in.Prefix, "\x00") || strings.HasPrefix(in.Prefix, "/") {
		return nil, claimList{}, fmt.Errorf("prefix %q: give the start of a path relative to /workspace/agents, or none", in.Prefix)
	}
	list, err := s.p.Claims(ctx, c, in.Prefix)
	if list == nil {
		list = []Claim{}
	}
	return nil, claimList{Claims: list}, err
}
