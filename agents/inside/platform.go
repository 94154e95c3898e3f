package inside

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is what a Platform returns for an execution or session the
// caller may not see: to the caller, one of another tree is the same as
// one that does not exist.
var ErrNotFound = errors.New("not found")

// Caller is the execution a tool call acts as.
type Caller struct {
	Execution string
	Session   string
	// Deadline is when the caller's own wall time runs out; zero: no
	// limit.
	Deadline time.Time
}

// Platform is what the tools do, as their caller. The appliance
// implements it over its agent service and the runner. An error's text
// becomes the tool error the agent reads, so it says why and what to do.
type Platform interface {
	// Delegate starts a child execution of the caller.
	Delegate(ctx context.Context, caller Caller, d Delegation) (Status, error)
	// Execution is an execution as it is now: the caller's own or one of
	// its descendants', else ErrNotFound.
	Execution(ctx context.Context, caller Caller, id string) (Status, error)
	// Wait returns the execution (as Execution scopes it) once it has
	// ended, or as it is when ctx ends (without an error: Ended says).
	Wait(ctx context.Context, caller Caller, id string) (Status, error)
	// Agents are the agents the caller may delegate to.
	Agents(ctx context.Context, caller Caller) ([]Agent, error)
	// Sessions are the sessions the caller may read, newest first.
	Sessions(ctx context.Context, caller Caller) ([]Session, error)
	// WaitForFiles waits until files matching pattern (relative to the
	// session) exist, or with changes until one changes, at most
	// timeout; it returns the matching files (none at a timeout).
	WaitForFiles(ctx context.Context, caller Caller, session, pattern string, changes bool, timeout time.Duration) ([]string, error)
	// ClaimPath takes an advisory lease on path for ttl.
	ClaimPath(ctx context.Context, caller Caller, path string, ttl time.Duration) (Claim, error)
	// ReleasePath lets go of the caller's lease on path.
	ReleasePath(ctx context.Context, caller Caller, path string) error
	// Claims are the leases on paths under prefix ("" all).
	Claims(ctx context.Context, caller Caller, prefix string) ([]Claim, error)
}

// Delegation is a checked delegate_task request.
type Delegation struct {
	Agent  string
	Prompt string
	// Inputs are copied into the child's inputs/, each by its Name.
	Inputs  []Input
	Outputs []string
	Limits  Limits
	// MCPServers, Skills and Context add to the child agent's own, as a
	// task through the API does; the Platform checks them as it checks
	// the API's. Skills come from sessions only (session:SESSION/path)
	// and context files are text: the agents directory on the host is
	// not the caller's to read.
	MCPServers []MCPServer
	Skills     []string
	Context    []ContextText
}

// MCPServer is an MCP server a delegation adds: Command (a stdio server
// run in the child's machine) or URL (an HTTP server, reached through
// the egress proxy, so the child agent's network list governs it).
type MCPServer struct {
	Name    string            `json:"name" jsonschema:"the server's name: 1-64 of a-z 0-9 _ -, not hearth nor one of the agent's own"`
	Command []string          `json:"command,omitempty" jsonschema:"a stdio server's argv, run in the child's machine: a program in its image or its session"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"a stdio server's environment"`
	URL     string            `json:"url,omitempty" jsonschema:"an HTTP MCP server's URL, whose host must be in the child agent's network list"`
	Headers map[string]string `json:"headers,omitempty" jsonschema:"sent with each request to url; the child agent can read them"`
}

// ContextText is a context file a delegation adds: Text placed at To.
type ContextText struct {
	Text string `json:"text,omitempty" jsonschema:"the file's content"`
	To   string `json:"to,omitempty" jsonschema:"where it goes: relative to the child's working directory (default CLAUDE.md), or ~/... in its home"`
}

// Input is a file to hand to a child: Path (relative to Session, never
// under .home, and under outputs/ when Session is not the caller's) put
// in the child's inputs/ as Name. The Platform reads it without
// following a symbolic link anywhere on the way.
type Input struct {
	Session string
	Path    string
	Name    string
}

// Limits bound a child; zero fields: the agent's own.
type Limits struct {
	USD      float64
	Turns    int
	WallTime time.Duration
	OnBudget string // "stop", "pause", or "" for the agent's own
}

// Tokens counts model tokens.
type Tokens struct {
	Input         int64 `json:"input"`
	Output        int64 `json:"output"`
	CacheRead     int64 `json:"cache_read"`
	CacheCreation int64 `json:"cache_creation"`
}

// Status is an execution as a tool reports it.
type Status struct {
	Execution string `json:"execution"`
	Session   string `json:"session"`
	Agent     string `json:"agent"`
	Parent    string `json:"parent,omitempty" jsonschema:"the execution that delegated it; none for a root"`
	Depth     int    `json:"depth" jsonschema:"delegations from the root: 0 for a root"`
	// Children are the executions it delegated to, oldest first.
	Children []string `json:"children,omitempty" jsonschema:"the executions it delegated to, oldest first"`
	Status   string   `json:"status" jsonschema:"pending, running, completed, failed, budget_exceeded, timed_out, cancelled or interrupted"`
	Ended    bool     `json:"ended" jsonschema:"whether it has ended: its status will not change again"`
	USD      float64  `json:"usd" jsonschema:"dollars this execution's own model calls cost so far"`
	TotalUSD float64  `json:"total_usd" jsonschema:"usd plus what its descendants cost"`
	Turns    int      `json:"turns"`
	Tokens   Tokens   `json:"tokens"`
	Result   string   `json:"result,omitempty" jsonschema:"the agent's final answer"`
	Error    string   `json:"error,omitempty" jsonschema:"why it did not complete"`
	// Outputs are relative to /workspace/agents: SESSION/outputs/....
	Outputs []string `json:"outputs,omitempty" jsonschema:"its output files, relative to /workspace/agents (read them there)"`
}

// Agent is an agent the caller may delegate to.
type Agent struct {
	Name        string     `json:"name"`
	Description string     `json:"description,omitempty"`
	Model       string     `json:"model"`
	Limits      LimitsJSON `json:"limits" jsonschema:"the most a task of this agent may use; 0 or absent: no limit"`
}

// LimitsJSON is limits as the tools write them.
type LimitsJSON struct {
	USD      float64 `json:"usd,omitempty" jsonschema:"dollars of model spend"`
	Turns    int     `json:"turns,omitempty" jsonschema:"model answers"`
	WallTime string  `json:"wall_time,omitempty" jsonschema:"wall-clock time as a Go duration like 10m"`
}

// Session is a session the caller may read.
type Session struct {
	ID         string    `json:"id"`
	Agent      string    `json:"agent"`
	LastStatus string    `json:"last_status,omitempty" jsonschema:"the status of its last execution"`
	Created    time.Time `json:"created"`
}

// Claim is an advisory lease on a path.
type Claim struct {
	Path     string    `json:"path"`
	Holder   string    `json:"holder" jsonschema:"the execution holding it"`
	Session  string    `json:"session" jsonschema:"the holder's session"`
	Acquired time.Time `json:"acquired"`
	Expires  time.Time `json:"expires"`
}
