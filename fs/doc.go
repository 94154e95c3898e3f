// Package fs serves the shared workspace tree /workspace/agents.
//
// Every agent session owns one directory, <session>/{inputs,outputs,.home},
// and reads every other session's directory. A Store keeps the whole tree:
// metadata lives in memory as persistent (immutable, structurally shared)
// maps, so a snapshot of a session or of the whole tree is a pointer copy
// whose cost does not grow with the number of files; a write-ahead journal
// plus periodic checkpoints make it durable; file data lives in blob files
// under the state directory and is copied (or reflinked, where the backing
// filesystem can) only when a file shared with a snapshot is opened for
// writing.
//
// An operation is applied in memory and committed to the journal with one
// write before it returns; if the journal cannot take it (a full disk) it
// is undone and fails with ENOSPC, so nothing acknowledged is lost and a
// refused operation leaves no trace. Space kept in reserve lets deletions
// commit on a full disk, and Health (and an OpHealth event) says when the
// workspace is read-only for lack of space; it recovers by itself.
//
// A View mounts the tree with go-fuse for one machine: its own session is
// writable, every other session is read-only and their private .home is
// hidden. The host view sees and writes everything, and only root may
// enter it unless asked otherwise. A machine's view can shift owners onto
// the machine's own range of host ids (IDShift). Each session may have a
// quota of bytes (file data and extended attributes, at most 64 KiB of
// those per file) and of files. Data of files opened
// through a view goes through the kernel's FUSE passthrough where the
// kernel allows it, so bulk I/O runs at the backing filesystem's speed.
//
// A view of a machine that outlives the process serving it is retired
// rather than unmounted (View.Retire, StartKeeper): its connection stays
// up, answered ESTALE by a keeper process, so that a process caught in
// a path walk walks again into the view mounted there next.
//
// A process that serves views must not start a process whose start
// touches one of them: a working directory, root or executable in a view.
// Go's child, between its fork and its exec, shares the parent's memory
// and holds up its garbage collector; a FUSE request it makes then waits
// forever for a server stopped in that collection. (A view checks
// permissions itself, so entering a directory always asks the server.)
// The child enters the view after its exec instead (cd in a shell).
//
// Importers: the appliance, and tests. Machine drivers receive a mounted
// view's path, never this package.
package fs
