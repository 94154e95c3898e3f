// Package appliance wires Hearth together: it reads the TOML config, opens
// the workspace store and the agents' store, mounts the host view, makes
// the machine driver that sandboxes and agent executions share, serves
// the metering model gateway and the local API on unix sockets, runs agent
// executions, and owns every lifetime. It is the only package that knows
// all the others, and only cmd/ may import it.
package appliance
