// Package remote serves the workspace to other hosts over SFTP and mounts
// it there with sshfs.
//
// The kernels Hearth runs on have FUSE but no 9P or NFS client, so a node
// that does not hold the store mounts a machine's view with Debian's
// sshfs. The serving node (Server) speaks SSH with per-node keys: the SSH
// user names the session whose view a connection is, and the SFTP
// requests run against that session's view of the store (package fs)
// mounted on the serving node, so the view rules are the ones every local
// machine gets (own session writable, other sessions read-only, their
// .home hidden), enforced where the store is. Paths are resolved inside
// the view with os.Root, so neither ".." nor a symlink leaves it.
// Snapshots stay store operations on the serving node; file events reach
// other nodes over the same SSH connection (Follow).
//
// A node that runs agents against the served workspace (a compute node)
// also needs the store's own operations: it connects as ControlUser, which
// no session can be, and Client sends them over the control channel
// (proto.go: length-prefixed JSON frames, bounded, every path checked on
// the serving node; control.go serves them). View users never get that
// channel, and control connections get no SFTP.
//
// Importers: the appliance and cmd/hearth (hearth workspace serve), tests.
package remote
