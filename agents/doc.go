// Package agents will hold agent definitions, sessions and executions, the
// metering model gateway, budgets and the execution stream. Nothing is
// implemented yet: the agents issue builds it. Importers: appliance.
package agents
