// Package appliance wires Hearth together: it reads the TOML config, opens
// the workspace store, mounts the host view, serves the local API on a unix
// socket, and owns every lifetime. It is the only package that knows all
// the others, and only cmd/ may import it.
package appliance
