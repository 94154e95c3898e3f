// Package agents runs agent tasks: agent definitions (TOML), sessions and
// executions, budgets in three layers, and the execution stream, with the
// metering model gateway (agents/gateway), the output adapters
// (agents/adapter) and the store (agents/store) beneath it. It reaches
// machines only through the vmm interfaces. Importers: appliance.
package agents
