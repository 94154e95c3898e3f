// Package inside is the MCP server every agent reaches from inside its
// machine, named "hearth" in the agent CLI's MCP configuration: its tools
// let the agent delegate tasks to other agents (delegate_task), follow
// them (get_execution, wait_execution), see what it may delegate to and
// read (list_agents, list_sessions), and coordinate with other agents
// through the shared tree (wait_for_files, claim_path, release_path,
// list_claims).
//
// It is served over streamable HTTP on the host, reached through the
// machine's host channel like the model gateway: nothing listens on a
// network. As with the gateway, the runner registers each execution
// (Register) with its token and channel, and a request is admitted only
// with the bearer token of a registered execution arriving on that
// execution's channel (package channel); anything else is a 401 that
// says nothing about why. Every tool acts as the execution that called
// it, through a Platform, which the appliance implements over its agent
// service and runner; so this package imports neither package agents
// nor the appliance. Importers: agents (to register executions) and
// appliance (to serve it and implement Platform).
package inside
