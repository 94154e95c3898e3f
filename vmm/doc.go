// Package vmm defines the Machine and Driver interfaces that give each
// agent session its own isolated computer. Drivers live in subpackages,
// strongest first: vmm/chv (a Cloud Hypervisor microVM, driven through
// its REST API), vmm/qemu (a QEMU microvm, with KVM or, where allowed,
// software emulation) and vmm/jail (Linux namespaces, the tier every host
// can run). vmm/guest is the protocol to the agent inside every machine;
// vmm/vmmtest is the conformance suite every driver passes. Importers:
// the appliance, and agents (this package's interfaces only, never a
// driver).
package vmm
