package appliance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"hearth/agents"
	"hearth/fs"
	"hearth/fs/remote"
	"hearth/vmm"
)

// remoteWorkspace is the runner's agents.Workspace on a node that does
// not hold the store (workspace.remote): store operations run on the
// workspace node through its control channel (remote.Client), each
// machine's view is an sshfs mount of the view that node serves, at the
// place a local view would be, and file events come over the same SSH
// (remote.Follow).
type remoteWorkspace struct {
	client *remote.Client
	cfg    WorkspaceConfig // the sessions' default quota
	views  string          // where the executions' views are mounted
	open   string          // where OpenSession mounts a session read-only
	driver vmm.Driver
}

// workspace is what the agent service uses of the workspace: the
// runner's agents.Workspace and what rewind, branch and delegation need
// of the store; the daemon's own store (agentWorkspace) or the workspace
// node's (remoteWorkspace).
type workspace interface {
	agents.Workspace
	ReadFile(session, path string, limit int64) ([]byte, error)
	Restore(session, name string) error
	Branch(session, snapshot, newID string) error
	Move(session, from, to string) error
	cleanStaleViews()
}

var (
	_ workspace = remoteWorkspace{}
	_ workspace = agentWorkspace{}
)

// mountTimeout bounds mounting one view from the workspace node.
const mountTimeout = time.Minute

// followRetry is how long FileEvents waits before following again after
// the connection to the workspace node dropped.
const followRetry = time.Second

// followReady bounds how long FileEvents waits for the workspace node to
// follow the store's events.
const followReady = 10 * time.Second

func newRemoteWorkspace(cfg Config, client *remote.Client, driver vmm.Driver) remoteWorkspace {
	return remoteWorkspace{client: client, cfg: cfg.Workspace, driver: driver,
		views: filepath.Join(cfg.StateDir, "views", "_executions"), open: filepath.Join(cfg.StateDir, "views", "_open")}
}

func (w remoteWorkspace) EnsureSession(session string, uid, gid uint32, q agents.Quota) error {
	return w.client.EnsureSession(session, fs.Owner{UID: uid, GID: gid}, w.cfg.quota(q.Bytes, q.Files))
}

func (w remoteWorkspace) WriteFile(session, path string, r io.Reader, uid, gid uint32) error {
	return w.client.WriteFile(session, path, r, fs.Owner{UID: uid, GID: gid})
}

func (w remoteWorkspace) MkdirAll(session, path string, uid, gid uint32) error {
	return w.client.MkdirAll(session, path, fs.Owner{UID: uid, GID: gid})
}

func (w remoteWorkspace) RemoveAll(session, path string) error {
	return w.client.RemoveAll(session, path)
}

func (w remoteWorkspace) Chmod(session, path string, mode os.FileMode) error {
	return w.client.Chmod(session, path, mode)
}

// OpenSession mounts the session's view read-only from the workspace
// node; the mount goes when the root is closed.
func (w remoteWorkspace) OpenSession(session string) (*os.Root, error) {
	if err := fs.ValidateID("session", session); err != nil {
		return nil, err
	}
	var b [6]byte
	rand.Read(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), mountTimeout)
	defer cancel()
	return w.client.OpenSession(ctx, session, filepath.Join(w.open, session+"-"+hex.EncodeToString(b[:])))
}

func (w remoteWorkspace) Snapshot(session, name string) error {
	return w.client.Snapshot(session, name)
}

func (w remoteWorkspace) Snapshots(session string) ([]agents.SnapshotRef, error) {
	list, err := w.client.Snapshots(session)
	return snapshotRefs(list), err
}

func (w remoteWorkspace) SnapshotHolds(session string) ([]agents.SnapshotRef, error) {
	list, err := w.client.SnapshotHolds(session)
	return snapshotRefs(list), err
}

func snapshotRefs(list []remote.Snapshot) []agents.SnapshotRef {
	out := make([]agents.SnapshotRef, len(list))
	for i, s := range list {
		out[i] = agents.SnapshotRef{Name: s.Name, Created: s.Created, Holds: s.Holds}
	}
	return out
}

func (w remoteWorkspace) DeleteSnapshot(session, name string) error {
	return w.client.DeleteSnapshot(session, name)
}

// MountView mounts the machine's view from the workspace node with
// sshfs, owners shifted onto the machine's ids as a local view would.
// sshfs reconnects by itself when the workspace node restarts.
func (w remoteWorkspace) MountView(session, machine string) (string, func() error, error) {
	dir := filepath.Join(w.views, machine)
	ids, err := viewIDs(w.driver, machine)
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), mountTimeout)
	defer cancel()
	m, err := remote.MountView(ctx, w.client.Node(session, ids), dir)
	if err != nil {
		return "", nil, err
	}
	return m.Dir(), func() error {
		err := m.Unmount()
		os.Remove(dir)
		return err
	}, nil
}

func (w remoteWorkspace) Restore(session, name string) error {
	return w.client.Restore(session, name)
}

func (w remoteWorkspace) Branch(session, snapshot, newID string) error {
	return w.client.Branch(session, snapshot, newID)
}

func (w remoteWorkspace) Move(session, from, to string) error {
	return w.client.Move(session, from, to)
}

// Glob matches in the session's tree on the workspace node (never
// through a mount: see agentWorkspace.Glob).
func (w remoteWorkspace) Glob(session, pattern string) ([]string, error) {
	m, err := w.client.Glob(session, pattern)
	if errors.Is(err, fs.ErrNotFound) {
		return nil, nil
	}
	return m, err
}

// ReadFile reads a file of the session's live tree on the workspace node.
func (w remoteWorkspace) ReadFile(session, path string, limit int64) ([]byte, error) {
	return w.client.ReadFile(session, path, limit)
}

// FileEvents follows the workspace node's events for the session,
// following again when the connection drops, until stop. It returns once
// the node follows the store's events, so no change after it is missed,
// or fails if the node cannot be followed within followReady.
func (w remoteWorkspace) FileEvents(session string) (<-chan agents.FileEvent, func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan agents.FileEvent, 1024)
	ready := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		first := true
		for ctx.Err() == nil {
			err := remote.Follow(ctx, w.client.Node(session, fs.IDShift{}), func() {
				if first {
					first = false
					ready <- nil
				}
			}, func(e fs.Event) {
				if e.Session != session || e.Op == fs.OpClosed || e.Op == fs.OpError {
					return
				}
				select {
				case out <- agents.FileEvent{Op: string(e.Op), Path: e.Path}:
				case <-ctx.Done():
				}
			})
			if first { // never followed: the caller hears why
				ready <- err
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(followRetry):
			}
		}
	}()
	stop := func() { cancel(); <-done }
	timer := time.NewTimer(followReady)
	defer timer.Stop()
	select {
	case err := <-ready:
		if err != nil {
			stop()
			return nil, nil, unavailablef("follow the file events of session %s on the workspace node: %v", session, err)
		}
		return out, stop, nil
	case <-timer.C:
		stop()
		return nil, nil, unavailablef("follow the file events of session %s: the workspace node did not answer within %v", session, followReady)
	}
}

// cleanStaleViews unmounts what a daemon that died left mounted.
func (w remoteWorkspace) cleanStaleViews() {
	for _, top := range []string{w.views, w.open} {
		ents, _ := os.ReadDir(top)
		for _, e := range ents {
			dir := filepath.Join(top, e.Name())
			fs.CleanStaleMount(dir)
			os.Remove(dir)
		}
	}
}

// errWorkspaceElsewhere is what an operation that needs the store itself
// answers on a node whose workspace another node holds.
func errWorkspaceElsewhere(addr, what string) error {
	return unavailablef("%s: the workspace is held by the node at %s (workspace.remote): ask that node's API", what, addr)
}
