// Package vmm defines the Machine and Driver interfaces that give each
// agent session its own isolated computer. Drivers live in subpackages:
// vmm/jail (Linux namespaces, the tier every host can run); the VM tiers
// (vmm/qemu, vmm/chv) come later. vmm/guest is the protocol to the agent
// inside every machine. Importers: the appliance, and agents (this
// package's interfaces only, never a driver).
package vmm
