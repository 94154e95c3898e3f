// Package vmm will define the Machine and Driver interfaces that give each
// agent session its own isolated computer, with drivers in subpackages
// (vmm/jail, vmm/qemu, vmm/chv). Nothing is implemented yet: the sandboxes
// and microVM issues build it. Importers: appliance and agents (interfaces
// only, never a driver).
package vmm
