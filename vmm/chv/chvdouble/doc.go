// Package chvdouble is a test double standing in for the cloud-hypervisor
// binary, which cannot run on the machines Hearth is developed and tested
// on (no hardware KVM for stock kernels; Cloud Hypervisor is not packaged
// for Debian). It is not a hypervisor and boots no kernel.
//
// What it checks strictly, as upstream does: its REST API is the one
// generated from vmm/chv/api/openapi.yaml (a subset of upstream's
// document), served over HTTP/1.1 on the --api-socket unix socket; every
// request is validated against that document (a bad body is refused with
// 400; a property left out that has a default gets it, as upstream's
// deserialiser does); the VM state machine is upstream's (create, boot,
// pause, resume, snapshot, restore, shutdown, delete), with the statuses
// upstream really sends (404 for vm.info, vm.boot and device calls when
// no VM exists, 500 for any other call in the wrong state, 409 for a
// duplicate device id), every error body a JSON array of strings; at
// boot, the payload files and disks must exist, a virtio-fs device needs
// shared memory and a listening vhost-user socket, and the vsock socket
// path must be free (upstream binds it and never unlinks it); a removed
// device leaves the VM only once the guest ejects it, which a paused guest
// cannot do; restore needs a fresh VMM.
//
// Where upstream cannot work, the double refuses loudly instead: a
// snapshot of a VM with a virtio-fs device attached is refused with 500
// (upstream writes it, but the restored guest hangs or fails: upstream
// issues #4994 and #6931; virtiofsd keeps no migratable state).
//
// What stands in for the guest: on vm.boot (or vm.restore) the double
// starts the guest agent binary named by $CHV_DOUBLE_GUEST (hearth-guest)
// as an ordinary host process, with no isolation at all: it runs with the
// host's root filesystem, as the user hearth.uid/hearth.gid from the
// kernel command line, listening on a unix socket beside the vsock socket.
// The double's vsock socket speaks upstream's host-side handshake
// (CONNECT <port>\n, answered OK <n>\n) and then joins the stream to that
// agent when <port> is the one hearth.channel=vsock-listen:<port> names.
// The double (the command) is the guest's subreaper, so what the guest
// orphans stays in its process tree, as a VM's init would adopt it, and
// is reaped when it ends. Pause stops that tree (SIGSTOP), resume
// continues it, and a power-off kills it. A
// snapshot writes config.json, state.json and a sparse memory-ranges the
// size of the VM's memory; a restore starts a fresh agent process, so
// memory (running processes) is not brought back. The guest never sees
// the disks or the kernel: those are only checked. It sees the workspace
// as a real guest does (package vmm/share's guest contract): when the
// kernel command line names a virtio-fs tag (hearth.fs) whose device is
// connected at boot, the agent starts in a mount namespace of its own, a
// slave of the host's, where /workspace is a tmpfs, the directory the
// device's virtiofsd exports (read from its command line) is mounted at
// /workspace/.share, and /workspace/agents links into it. (The host needs
// a /workspace directory as the mount point; the double makes an empty
// one if there is none.) As in a real guest, the workspace dies when its
// device is ejected (vm.remove-device): the agent's mount is detached.
// A device plugged in again (vm.add-fs), or after an agent started by
// vm.restore, is not mounted until the agent is asked to remount the
// workspace (package vmm/guest): hearth-guest, started with
// --workspace-device, binds the new device's directory then, as it mounts
// the virtio-fs tag again in a real guest.
// When the agent exits by itself the double exits, as upstream does when
// its guest powers off.
//
// Only tests of vmm/chv and the chv-double command import it.
package chvdouble
