package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/client"
)

// The tools. Their arguments and results are Go types: the SDK derives
// their JSON schemas and checks every call's arguments against them
// before a handler runs. A handler's error becomes a tool error (IsError
// and the message), which the model calling the tool can read and act on.

// limits is what one execution may use; absent or 0 means the agent's own.
type limits struct {
	USD      float64 `json:"usd,omitempty" jsonschema:"dollars of model spend, at most the agent's limit"`
	Turns    int     `json:"turns,omitempty" jsonschema:"model calls (each call to the model counts, a retried one too if it was answered), at most the agent's limit"`
	WallTime string  `json:"wall_time,omitempty" jsonschema:"wall-clock time as a Go duration like 10m, at most the agent's limit"`
	OnBudget string  `json:"on_budget,omitempty" jsonschema:"what reaching the dollar limit does: stop (it ends budget_exceeded) or pause (it awaits a top-up: see topup_execution)"`
}

type topUpArgs struct {
	ID  string  `json:"id" jsonschema:"an execution id, like exec-1a2b3c4d"`
	USD float64 `json:"usd" jsonschema:"dollars to add to its limit"`
}

type delegateArgs struct {
	Agent   string            `json:"agent" jsonschema:"the agent to run the task, one list_agents names"`
	Prompt  string            `json:"prompt" jsonschema:"the task"`
	Inputs  map[string]string `json:"inputs,omitempty" jsonschema:"text files put in the session's inputs/ before the agent starts, by plain file name"`
	Outputs []string          `json:"outputs,omitempty" jsonschema:"globs under outputs/ naming what the task produces, replacing the agent's"`
	Limits  *limits           `json:"limits,omitempty" jsonschema:"tighter limits for this task; they may only tighten the agent's"`
	Session string            `json:"session,omitempty" jsonschema:"an agent session to continue (the agent keeps its conversation); default a new one"`
	Wait    bool              `json:"wait,omitempty" jsonschema:"answer when the execution has ended (with its result) rather than as soon as it started"`
	// What the task adds to its agent's own, checked as the API checks
	// a task's.
	MCPServers []mcpServer   `json:"mcp_servers,omitempty" jsonschema:"MCP servers added to the agent's own for this task"`
	Skills     []string      `json:"skills,omitempty" jsonschema:"skill directories (each with a SKILL.md) added to the agent's: relative to the agents directory (skills/review), or session:SESSION/path in a session's files"`
	Context    []contextFile `json:"context,omitempty" jsonschema:"context files placed for the agent, like a CLAUDE.md"`
}

// mcpServer is an MCP server a task adds.
type mcpServer struct {
	Name    string            `json:"name" jsonschema:"the server's name: 1-64 of a-z 0-9 _ -, not hearth nor one of the agent's own"`
	Command []string          `json:"command,omitempty" jsonschema:"a stdio server's argv, run in the agent's machine: a program in its image or its session"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"a stdio server's environment"`
	URL     string            `json:"url,omitempty" jsonschema:"an HTTP MCP server's URL, whose host must be in the agent's network list"`
	Headers map[string]string `json:"headers,omitempty" jsonschema:"sent with each request to url; the agent can read them"`
}

// contextFile is a context file a task adds: a file of the agents
// directory or its text.
type contextFile struct {
	File string `json:"file,omitempty" jsonschema:"a file relative to the agents directory (this or text)"`
	Text string `json:"text,omitempty" jsonschema:"the content itself (this or file)"`
	To   string `json:"to,omitempty" jsonschema:"where it goes: relative to the working directory (default CLAUDE.md), or ~/... in the home"`
}

type idArgs struct {
	ID string `json:"id" jsonschema:"an execution id, like exec-1a2b3c4d"`
}

type listSessionsArgs struct {
	Agent string `json:"agent,omitempty" jsonschema:"only this agent's sessions"`
	Limit int    `json:"limit,omitempty" jsonschema:"at most this many, newest first; default 100"`
}

type readOutputArgs struct {
	Session   string `json:"session,omitempty" jsonschema:"the agent session whose outputs to read (this or execution)"`
	Execution string `json:"execution,omitempty" jsonschema:"an execution whose session's outputs to read (this or session)"`
	Path      string `json:"path" jsonschema:"a file under outputs/, like outputs/report.md or report.md"`
	MaxBytes  int64  `json:"max_bytes,omitempty" jsonschema:"return at most this many bytes (default and most 1048576); a longer file is cut and marked truncated"`
}

// execution is what the tools say of one execution.
type execution struct {
	ID      string `json:"id"`
	Agent   string `json:"agent"`
	Session string `json:"session"`
	Status  string `json:"status" jsonschema:"pending, running, awaiting_budget (paused at its dollar limit: topup_execution lets it go on), completed, failed, budget_exceeded, timed_out, cancelled or interrupted"`
	Ended   bool   `json:"ended" jsonschema:"whether it has ended: its status will not change again"`
	Result  string `json:"result,omitempty" jsonschema:"the agent's final answer"`
	Error   string `json:"error,omitempty" jsonschema:"why it did not complete"`
	// Outputs are relative to the session, like outputs/report.md.
	Outputs      []string `json:"outputs,omitempty" jsonschema:"the files its output patterns matched when it ended; read them with read_output"`
	Turns        int      `json:"turns" jsonschema:"model calls made so far (what limits.turns counts)"`
	InputTokens  int64    `json:"input_tokens"`
	OutputTokens int64    `json:"output_tokens"`
	USD          float64  `json:"usd" jsonschema:"dollars of model spend so far"`
	Limits       limits   `json:"limits" jsonschema:"what it may use; 0 or absent means no limit"`
	Created      string   `json:"created"`
	EndedAt      string   `json:"ended_at,omitempty"`
	// The delegation tree: who delegated it, and to whom it delegated.
	Parent   string   `json:"parent,omitempty" jsonschema:"the execution that delegated this one; absent for one a person started"`
	Depth    int      `json:"depth" jsonschema:"delegations from the root: 0 for one a person started"`
	Children []string `json:"children,omitempty" jsonschema:"the executions it delegated to, oldest first (get_execution shows each)"`
	TotalUSD float64  `json:"total_usd" jsonschema:"usd plus what every execution it delegated to (and theirs) spent"`
}

type agent struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Model       string `json:"model"`
	Limits      limits `json:"limits"`
}

type agentList struct {
	Agents []agent `json:"agents"`
}

type sessionList struct {
	Sessions []session `json:"sessions"`
}

type session struct {
	ID            string `json:"id"`
	Agent         string `json:"agent"`
	Created       string `json:"created"`
	LastExecution string `json:"last_execution,omitempty"`
}

type output struct {
	Path      string `json:"path" jsonschema:"relative to the session"`
	Size      int64  `json:"size" jsonschema:"the whole file's size in bytes"`
	Truncated bool   `json:"truncated" jsonschema:"only the first max_bytes are here"`
	Encoding  string `json:"encoding" jsonschema:"text, or base64 when the bytes are not UTF-8"`
	Content   string `json:"content"`
	raw       []byte // the bytes read
}

func (h *handlers) addTools(s *mcpsdk.Server) {
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "list_agents", Description: "List the agents tasks can be delegated to, with their models and limits."}, h.listAgents)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "delegate_task", Description: "Delegate a task to an agent, which runs it in its own isolated machine and session. " +
		"With wait the answer comes when it has ended, with its result; without, at once with the execution id to poll with get_execution."}, h.delegate)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "get_execution", Description: "An execution's status, result, cost, limits and outputs; while it runs, what it used so far.",
		Annotations: &mcpsdk.ToolAnnotations{ReadOnlyHint: true}}, h.getExecution)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "list_sessions", Description: "List agent sessions, newest first.",
		Annotations: &mcpsdk.ToolAnnotations{ReadOnlyHint: true}}, h.listSessions)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "read_output", Description: "Read a file from a session's outputs/ (at most 1 MiB).",
		Annotations: &mcpsdk.ToolAnnotations{ReadOnlyHint: true}}, h.readOutput)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "cancel_execution", Description: "Stop a running execution; it ends cancelled and keeps its partial outputs."}, h.cancel)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "topup_execution", Description: "Raise a running execution's dollar limit by usd (reserved from the credits when they are on); " +
		"one awaiting_budget goes on at once, its held model call answered."}, h.topUp)
	h.addRewindTools(s)
}

func (h *handlers) listAgents(ctx context.Context, _ *mcpsdk.CallToolRequest, _ struct{}) (*mcpsdk.CallToolResult, agentList, error) {
	var out agentList
	defs, err := h.d.Agents(ctx)
	if err != nil {
		return nil, out, err
	}
	out.Agents = []agent{}
	for _, d := range defs {
		out.Agents = append(out.Agents, agent{Name: d.Name, Description: d.Description, Model: d.Model, Limits: fromLimits(d.Limits)})
	}
	return nil, out, nil
}

func (h *handlers) delegate(ctx context.Context, _ *mcpsdk.CallToolRequest, in delegateArgs) (*mcpsdk.CallToolResult, execution, error) {
	if strings.TrimSpace(in.Agent) == "" || strings.TrimSpace(in.Prompt) == "" {
		return nil, execution{}, errors.New("delegate_task needs an agent (list_agents names them) and a prompt")
	}
	req := client.DelegateRequest{Agent: in.Agent, Prompt: in.Prompt, Outputs: in.Outputs, Session: in.Session, Wait: in.Wait, Skills: in.Skills}
	for _, m := range in.MCPServers {
		req.McpServers = append(req.McpServers, client.MCPServer{Name: m.Name, Command: m.Command, Env: m.Env, Url: m.URL, Headers: m.Headers})
	}
	for _, c := range in.Context {
		req.Context = append(req.Context, client.ContextFile{File: c.File, Text: c.Text, To: c.To})
	}
	if in.Limits != nil {
		req.Limits = client.Limits{Usd: in.Limits.USD, Turns: in.Limits.Turns, WallTime: in.Limits.WallTime, OnBudget: client.LimitsOnBudget(in.Limits.OnBudget)}
	}
	if len(in.Inputs) > 0 {
		req.Inputs = make(map[string][]byte, len(in.Inputs))
		for name, text := range in.Inputs {
			req.Inputs[name] = []byte(text)
		}
	}
	e, err := h.d.Delegate(ctx, req)
	if err != nil {
		return nil, execution{}, fmt.Errorf("delegate to %s: %w", in.Agent, err)
	}
	return nil, fromExecution(e), nil
}

func (h *handlers) getExecution(ctx context.Context, _ *mcpsdk.CallToolRequest, in idArgs) (*mcpsdk.CallToolResult, execution, error) {
	e, err := h.d.Execution(ctx, in.ID)
	if err != nil {
		return nil, execution{}, err
	}
	return nil, fromExecution(e), nil
}

func (h *handlers) cancel(ctx context.Context, _ *mcpsdk.CallToolRequest, in idArgs) (*mcpsdk.CallToolResult, execution, error) {
	e, err := h.d.Cancel(ctx, in.ID)
	if err != nil {
		return nil, execution{}, err
	}
	return nil, fromExecution(e), nil
}

func (h *handlers) topUp(ctx context.Context, _ *mcpsdk.CallToolRequest, in topUpArgs) (*mcpsdk.CallToolResult, execution, error) {
	if !(in.USD > 0) {
		return nil, execution{}, fmt.Errorf("usd %v: give a positive number of dollars to add", in.USD)
	}
	e, err := h.d.TopUp(ctx, in.ID, in.USD)
	if err != nil {
		return nil, execution{}, err
	}
	return nil, fromExecution(e), nil
}

func (h *handlers) listSessions(ctx context.Context, _ *mcpsdk.CallToolRequest, in listSessionsArgs) (*mcpsdk.CallToolResult, sessionList, error) {
	var out sessionList
	if in.Limit < 0 {
		return nil, out, fmt.Errorf("limit %d: give a positive number, or none for 100", in.Limit)
	}
	list, err := h.d.AgentSessions(ctx, client.AgentSessionFilter{Agent: in.Agent, Limit: in.Limit})
	if err != nil {
		return nil, out, err
	}
	out.Sessions = []session{}
	for _, s := range list {
		out.Sessions = append(out.Sessions, session{ID: s.Id, Agent: s.Agent, Created: stamp(s.Created), LastExecution: s.LastExecution})
	}
	return nil, out, nil
}

func (h *handlers) readOutput(ctx context.Context, _ *mcpsdk.CallToolRequest, in readOutputArgs) (*mcpsdk.CallToolResult, output, error) {
	limit := int64(maxRead)
	switch {
	case in.MaxBytes < 0 || in.MaxBytes > maxRead:
		return nil, output{}, fmt.Errorf("max_bytes %d: give 1 to %d", in.MaxBytes, maxRead)
	case in.MaxBytes > 0:
		limit = in.MaxBytes
	}
	if (in.Session == "") == (in.Execution == "") {
		return nil, output{}, errors.New("read_output needs a session or an execution, one of them")
	}
	id := in.Execution
	if id == "" {
		var err error
		if id, err = h.sessionExecution(ctx, in.Session); err != nil {
			return nil, output{}, err
		}
	}
	out, err := h.read(ctx, id, in.Path, limit)
	return nil, out, err
}

func fromExecution(e client.Execution) execution {
	out := execution{
		ID: e.Id, Agent: e.Agent, Session: e.Session, Status: string(e.Status), Ended: e.Ended != nil,
		Result: e.Result, Error: e.Error, Outputs: e.Outputs, Turns: e.Turns,
		InputTokens: e.Tokens.Input, OutputTokens: e.Tokens.Output, USD: e.Usd,
		Limits: fromLimits(e.Limits), Created: stamp(e.Created),
		Parent: e.Parent, Depth: e.Depth, Children: e.Children, TotalUSD: e.TotalUsd,
	}
	if e.Ended != nil {
		out.EndedAt = stamp(*e.Ended)
	}
	return out
}

func fromLimits(l client.Limits) limits {
	return limits{USD: l.Usd, Turns: l.Turns, WallTime: l.WallTime, OnBudget: string(l.OnBudget)}
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
