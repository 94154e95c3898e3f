package appliance

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"hearth/agents"
	"hearth/fs"
	"hearth/vmm"
)

// agentWorkspace is the runner's agents.Workspace over the daemon's
// workspace store: sessions and inputs through the store's Go API, one
// FUSE view per execution under <state_dir>/views/_executions (sandbox
// ids cannot start with '_', so the two never meet), outputs listed from
// the store's tree, file events from the store's event bus.
type agentWorkspace struct {
	store *fs.Store
	cfg   WorkspaceConfig // the sessions' default quota
	views string          // where the executions' views are mounted
	host  string          // the host view of the whole tree (workspace.mount)
	// driver gives each machine's view its range of host ids; nil in
	// tests without machines.
	driver vmm.Driver
}

var _ agents.Workspace = agentWorkspace{}

func newAgentWorkspace(cfg Config, store *fs.Store, driver vmm.Driver) agentWorkspace {
	return agentWorkspace{store: store, cfg: cfg.Workspace, views: filepath.Join(cfg.StateDir, "views", "_executions"), host: cfg.Workspace.Mount, driver: driver}
}

// EnsureSession makes the session owned by uid:gid, or gives an existing
// one's directories to them (a session made through the workspace API
// belongs to root until an agent works in it), and sets its quota: the
// definition's, else the config's.
func (w agentWorkspace) EnsureSession(session string, uid, gid uint32, q agents.Quota) error {
	err := w.store.CreateSession(session, fs.Owner{UID: uid, GID: gid})
	if err == nil {
		return applyQuota(w.store, session, w.cfg.quota(q.Bytes, q.Files))
	}
	if !errors.Is(err, fs.ErrExists) {
		return err
	}
	if err := applyQuota(w.store, session, w.cfg.quota(q.Bytes, q.Files)); err != nil {
		return err
	}
	for _, sub := range []string{"", fs.InputsDir, fs.OutputsDir, fs.HomeDir} {
		p := filepath.Join(w.host, session, sub)
		if err := os.Lchown(p, int(uid), int(gid)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("give session %s to uid %d: %w", session, uid, err)
		}
	}
	return nil
}

func (w agentWorkspace) WriteFile(session, path string, r io.Reader, uid, gid uint32) error {
	_, err := w.store.WriteFile(session, path, r, 0, fs.Owner{UID: uid, GID: gid})
	return err
}

func (w agentWorkspace) MkdirAll(session, path string, uid, gid uint32) error {
	return w.store.MkdirAll(session, path, fs.Owner{UID: uid, GID: gid})
}

func (w agentWorkspace) RemoveAll(session, path string) error {
	return w.store.RemoveAll(session, path)
}

func (w agentWorkspace) Chmod(session, path string, mode os.FileMode) error {
	return w.store.Chmod(session, path, mode)
}

// OpenSession opens the session's directory in the host view; the
// session's name is one path component, checked as the store checks it.
func (w agentWorkspace) OpenSession(session string) (*os.Root, error) {
	if err := fs.ValidateID("session", session); err != nil {
		return nil, err
	}
	top, err := os.OpenRoot(w.host)
	if err != nil {
		return nil, err
	}
	defer top.Close()
	return top.OpenRoot(session)
}

// Snapshot takes snapshot name of the session's whole tree: an O(1)
// pointer copy in the store (the runner's call snapshots).
func (w agentWorkspace) Snapshot(session, name string) error {
	return w.store.Snapshot(session, name)
}

// Snapshots lists the session's snapshots by name, oldest first, without
// counting their bytes.
func (w agentWorkspace) Snapshots(session string) ([]agents.SnapshotRef, error) {
	list, err := w.store.SnapshotNames(session)
	out := make([]agents.SnapshotRef, len(list))
	for i, sn := range list {
		out[i] = agents.SnapshotRef{Name: sn.Name, Created: sn.Created}
	}
	return out, err
}

// SnapshotHolds lists the session's snapshots with the bytes each pins.
func (w agentWorkspace) SnapshotHolds(session string) ([]agents.SnapshotRef, error) {
	list, err := w.store.SnapshotHolds(session)
	out := make([]agents.SnapshotRef, len(list))
	for i, h := range list {
		out[i] = agents.SnapshotRef{Name: h.Name, Created: h.Created, Holds: h.Holds}
	}
	return out, err
}

func (w agentWorkspace) DeleteSnapshot(session, name string) error {
	return w.store.DeleteSnapshot(session, name)
}

// MountView mounts the view machine boots with; unmounting removes its
// directory too.
func (w agentWorkspace) MountView(session, machine string) (string, func() error, error) {
	dir := filepath.Join(w.views, machine)
	ids, err := viewIDs(w.driver, machine)
	if err != nil {
		return "", nil, err
	}
	v, err := w.store.Mount(dir, fs.ViewOptions{Session: session, IDs: ids})
	if err != nil {
		return "", nil, err
	}
	return v.Dir(), func() error {
		err := v.Unmount()
		os.Remove(dir)
		return err
	}, nil
}

// Glob matches pattern (like outputs/*.md) in the session's tree in the
// store; it returns regular files only, relative to the session. It never
// looks at the host view: there an agent's symlink (outputs -> another
// session's .home) would be followed and list that session's files. A
// session the workspace has not made yet (its first execution is
// starting) has no files: WaitForFiles waits for them.
func (w agentWorkspace) Glob(session, pattern string) ([]string, error) {
	m, err := w.store.Glob(session, pattern)
	if errors.Is(err, fs.ErrNotFound) {
		return nil, nil
	}
	return m, err
}

// FileEvents passes on the session's created, written, renamed and
// removed events after the call (SubscribeSettled) until stop. The bus never blocks: when the runner falls
// a buffer behind, events are dropped, not the agent slowed.
func (w agentWorkspace) FileEvents(session string) (<-chan agents.FileEvent, func(), error) {
	sub := w.store.SubscribeSettled(session, 1024)
	out := make(chan agents.FileEvent, 1024)
	go func() {
		defer close(out)
		for e := range sub.C {
			if e.Session != session || e.Op == fs.OpClosed || e.Op == fs.OpError {
				continue
			}
			out <- agents.FileEvent{Op: string(e.Op), Path: e.Path}
		}
	}()
	return out, sub.Close, nil
}

// ReadFile reads a file of the session's live tree in the store, at most
// limit bytes, following no symbolic link.
func (w agentWorkspace) ReadFile(session, path string, limit int64) ([]byte, error) {
	return w.store.ReadFile(session, "", path, limit)
}

// Restore rolls the session back to its snapshot name.
func (w agentWorkspace) Restore(session, name string) error { return w.store.Restore(session, name) }

// Branch makes session newID from the session's snapshot name.
func (w agentWorkspace) Branch(session, snapshot, newID string) error {
	return w.store.Branch(session, snapshot, session, newID)
}

// Move renames from to to in the session, replacing nothing.
func (w agentWorkspace) Move(session, from, to string) error {
	return w.store.Move(session, [][2]string{{from, to}})
}

// cleanStaleViews unmounts and removes the execution views a daemon that
// died left behind.
func (w agentWorkspace) cleanStaleViews() {
	ents, _ := os.ReadDir(w.views)
	for _, e := range ents {
		dir := filepath.Join(w.views, e.Name())
		fs.CleanStaleMount(dir)
		os.Remove(dir)
	}
}

// applyQuota gives session quota q unless it has it already (setting a
// byte quota on a session whose files are open is refused: fs.SetQuota).
func applyQuota(store *fs.Store, session string, q fs.Quota) error {
	for _, info := range store.Sessions() {
		if info.ID == session && info.Quota == q {
			return nil
		}
	}
	if err := store.SetQuota(session, q); err != nil {
		return fmt.Errorf("session %s: %w", session, err)
	}
	return nil
}

// viewIDs is how the view of machine shifts owners: from the range the
// store keeps them in onto the machine's own range of host ids, for
// drivers that give each machine one (vmm.IDRanger).
func viewIDs(driver vmm.Driver, machine string) (fs.IDShift, error) {
	r, ok := driver.(vmm.IDRanger)
	if !ok {
		return fs.IDShift{}, nil
	}
	base, size, err := r.HostIDs(machine)
	if err != nil {
		return fs.IDShift{}, err
	}
	return fs.IDShift{From: driver.Capabilities().HostIDOffset, To: base, Size: size}, nil
}
