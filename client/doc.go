// Package client is Hearth's API client: it talks to a running daemon over
// its unix socket (or its TCP API with a token) and knows the daemon only
// through the API, the types generated from appliance/api/openapi.yaml.
// It imports appliance/api and nothing else of Hearth: never the
// workspace (fs), the agent store (agents/store) or the machines (vmm), so
// what it decodes is exactly what openapi.yaml says the daemon sends
// (cmd/hearth's TestImportRules holds it to that).
//
// The CLI (cmd/hearth), the MCP server (appliance/mcp, which the daemon
// mounts at /mcp over a client of its own socket), the doctor's look at a
// running daemon and the SDKs' tests use it. Every call is bounded by
// Client.Timeout, streams by their context; error answers become
// *APIError, a daemon that does not answer ErrDaemonDown.
package client
