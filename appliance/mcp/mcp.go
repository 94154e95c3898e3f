// Package mcp serves Hearth over the Model Context Protocol, so that an
// MCP client (an IDE, another agent) can delegate tasks to Hearth's
// agents: tools to delegate a task, follow, top up and cancel its execution, list
// agent sessions and read their outputs, and every session's outputs as
// resources (hearth://sessions/{session}/outputs/{path}); and so that an
// agent loop outside Hearth can use its sandboxes as a tool backend
// (sandbox_create, sandbox_exec and the other sandbox_* tools).
//
// The server reaches the daemon only through its API, as a client
// (hearth/client), so it is the same whether `hearth mcp` serves it over
// stdio or the daemon serves it at /mcp over streamable HTTP (through a
// client of its own socket). Only the appliance (to mount /mcp) and
// cmd/hearth import it; of Hearth it imports the client and the generated
// API types, never the appliance itself (that would be an import cycle).
package mcp

import (
	"net/http"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/client"
)

// version is the server's version in the MCP handshake.
const version = "1"

// New returns an MCP server for the daemon c talks to, with its tools and
// resources; run it with Server.Run over a transport, or serve it over
// HTTP with Handler.
func New(c *client.Client) *mcpsdk.Server {
	s := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "hearth", Title: "Hearth", Version: version}, &mcpsdk.ServerOptions{
		Instructions: instructions,
		// No logging capability: the server sends no log messages.
		Capabilities: &mcpsdk.ServerCapabilities{},
	})
	h := &handlers{d: c}
	h.addTools(s)
	h.addSandboxTools(s)
	h.addResources(s)
	return s
}

const instructions = `Hearth runs AI agents, each task in its own isolated machine and session.
Call list_agents to see who can do what, delegate_task to give one a task (wait=true to get the result, or poll get_execution),
then read what it wrote with read_output or the hearth://sessions/{session}/outputs/{path} resources.
To run commands yourself, sandbox_create boots an isolated Linux sandbox (no network): sandbox_exec runs a command in it,
sandbox_read_file, sandbox_write_file, sandbox_list_files and sandbox_search work on its files, sandbox_start_process runs a server in the background,
sandbox_checkpoint and sandbox_restore save and restore its files, sandbox_destroy ends it, and sandbox_list lists yours.`

// Handler serves New(c) over streamable HTTP, statelessly: each request
// stands alone, so nothing is kept between requests and a daemon
// restart loses no MCP session. Requests a browser makes from another
// site are refused (the dashboard's cookie must not open it to them).
func Handler(c *client.Client) http.Handler {
	s := New(c)
	h := mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return s }, &mcpsdk.StreamableHTTPOptions{
		Stateless: true,
	})
	return http.NewCrossOriginProtection().Handler(h)
}

// handlers holds the tool and resource handlers over one daemon. Errors
// are the API's: their text is what the server reports to the MCP client.
type handlers struct{ d *client.Client }
