// Package mcp serves Hearth over the Model Context Protocol, so that an
// MCP client (an IDE, another agent) can delegate tasks to Hearth's
// agents: tools to delegate a task, follow and cancel its execution, list
// agent sessions and read their outputs, and every session's outputs as
// resources (hearth://sessions/{session}/outputs/{path}).
//
// The server reaches the daemon only through its API, as a Daemon (which
// the appliance's Client is), so it is the same whether `hearth mcp`
// serves it over stdio or the daemon serves it at /mcp over streamable
// HTTP. Only the appliance (to mount /mcp) and cmd/hearth import it; it
// imports the generated API package for the types its Daemon interface
// names, and never the appliance itself (that would be an import cycle).
package mcp

import (
	"context"
	"io"
	"net/http"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/appliance/api"
)

// Daemon is what the server needs of the daemon's API; *appliance.Client
// implements it. Errors are the API's: their text is what the server
// reports to the MCP client.
type Daemon interface {
	// Agents lists the agent definitions.
	Agents(ctx context.Context) ([]api.AgentDefinition, error)
	// Delegate starts a task; with req.Wait it returns once the execution
	// has ended.
	Delegate(ctx context.Context, req api.DelegateRequest) (api.Execution, error)
	// Execution describes one execution.
	Execution(ctx context.Context, id string) (api.Execution, error)
	// Executions lists executions, newest first.
	Executions(ctx context.Context, f api.ListExecutionsParams) ([]api.Execution, error)
	// Cancel stops a running execution; one that has ended is an error.
	Cancel(ctx context.Context, id string) (api.Execution, error)
	// AgentSessions lists agent sessions, newest first.
	AgentSessions(ctx context.Context, f api.ListAgentSessionsParams) ([]api.AgentSession, error)
	// Outputs lists the files under the execution's session's outputs/.
	Outputs(ctx context.Context, id string) ([]api.OutputFile, error)
	// DownloadOutput copies one file under outputs/ to w, returning w's
	// error if w fails.
	DownloadOutput(ctx context.Context, id, path string, w io.Writer) (int64, error)
}

// version is the server's version in the MCP handshake.
const version = "1"

// New returns an MCP server for the daemon d, with its tools and
// resources; run it with Server.Run over a transport, or serve it over
// HTTP with Handler.
func New(d Daemon) *mcpsdk.Server {
	s := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "hearth", Title: "Hearth", Version: version}, &mcpsdk.ServerOptions{
		Instructions: instructions,
		// No logging capability: the server sends no log messages.
		Capabilities: &mcpsdk.ServerCapabilities{},
	})
	h := &handlers{d: d}
	h.addTools(s)
	h.addResources(s)
	return s
}

const instructions = `Hearth runs AI agents, each task in its own isolated machine and session.
Call list_agents to see who can do what, delegate_task to give one a task (wait=true to get the result, or poll get_execution),
then read what it wrote with read_output or the hearth://sessions/{session}/outputs/{path} resources.`

// Handler serves New(d) over streamable HTTP, statelessly: each request
// stands alone, so nothing is kept between requests and a daemon
// restart loses no MCP session. Requests a browser makes from another
// site are refused (the dashboard's cookie must not open it to them).
func Handler(d Daemon) http.Handler {
	s := New(d)
	h := mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return s }, &mcpsdk.StreamableHTTPOptions{
		Stateless: true,
	})
	return http.NewCrossOriginProtection().Handler(h)
}

// handlers holds the tool and resource handlers over one daemon.
type handlers struct{ d Daemon }
