// Package agents runs agent tasks: agent definitions (TOML, with each
// agent's own MCP servers, skills and context files), the agent CLIs that
// run them (Claude Code, Codex, OpenCode, Gemini CLI or a command of the
// definition's: clis.go), sessions and executions, budgets in three
// layers, the execution stream, and coordination through files (advisory
// leases on paths, waiting for files: claims.go), with the metering model
// gateway (agents/gateway), the output adapters (agents/adapter) and the
// store (agents/store) beneath it. It reaches machines only through the
// vmm interfaces. Importers: appliance.
package agents
