package appliance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"hearth/fs"
	"hearth/image"
	"hearth/vmm"
)

// Forking a sandbox: new sandboxes that start with a copy of its writable
// layer as it is now and, with a session, a branch of its session. The
// source is paused only while its layer is captured (vmm.Forker). Its
// memory is not carried over, on any tier: neither its processes (a jail
// cannot copy them, and the VM tiers boot each fork afresh) nor its /tmp,
// a tmpfs.

const (
	opFork = "fork"
	// maxForks bounds one request: each fork is a whole machine, and
	// without reflinks each gets a full copy of the layer.
	maxForks = 16
)

// ForkResult is what a fork made.
type ForkResult struct {
	Sandboxes []SandboxInfo
	// Reflinked says the layer was captured as reflinks, not copied.
	Reflinked bool
}

// forkSource is a sandbox as a fork request captured it.
type forkSource struct {
	rec       sandboxRecord
	dir       string // holds the capture; removed when the forks are made
	layer     string // the captured layer, in dir
	reflinked bool
	snapshot  string   // of rec.Session, taken right after the layer; "" without a session
	quota     fs.Quota // rec.Session's
}

// CheckForkCount refuses a fork count out of 1..maxForks.
func CheckForkCount(n int) error {
	if n < 1 || n > maxForks {
		return invalidf("fork count %d: give 1 to %d", n, maxForks)
	}
	return nil
}

// Fork makes count new sandboxes from sandbox id as it is now: same
// image (the same version), limits, owner label, environment and
// timeouts, a copy of its writable layer, and each a branch of its
// session. All are made or none.
func (m *sandboxManager) Fork(ctx context.Context, id string, count int) (ForkResult, error) {
	if err := CheckForkCount(count); err != nil {
		return ForkResult{}, err
	}
	if err := m.available(); err != nil {
		return ForkResult{}, err
	}
	start := time.Now()
	src, err := m.captureSource(ctx, id)
	if err != nil {
		return ForkResult{}, err
	}
	defer m.dropSource(src)
	forks := make([]*sandbox, 0, count)
	for i := range count {
		s, err := m.createFork(ctx, src, i == count-1)
		if err != nil {
			m.undoForks(forks)
			return ForkResult{}, fmt.Errorf("fork sandbox %s: %w", id, err)
		}
		forks = append(forks, s)
	}
	out := ForkResult{Reflinked: src.reflinked}
	for _, s := range forks {
		out.Sandboxes = append(out.Sandboxes, m.info(s))
	}
	m.log.Info("sandbox forked; processes were not carried over", "id", id, "count", count,
		"reflinked", src.reflinked, "took", time.Since(start).Round(time.Millisecond))
	return out, nil
}

// captureSource captures the source's layer, then snapshots its session.
func (m *sandboxManager) captureSource(ctx context.Context, id string) (src forkSource, err error) {
	s, end, err := m.beginOp(id, opFork)
	if err != nil {
		return src, err
	}
	defer end()
	f, ok := s.m.(vmm.Forker)
	if !ok {
		return src, m.unsupported(id, "be forked")
	}
	s.mu.Lock()
	src.rec = s.rec
	s.mu.Unlock()
	if err := os.MkdirAll(m.forksDir(), 0o700); err != nil {
		return src, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	if src.dir, err = os.MkdirTemp(m.forksDir(), id+"-"); err != nil {
		return src, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	src.layer = filepath.Join(src.dir, "layer")
	if src.reflinked, err = f.CaptureLayer(ctx, src.layer); err != nil {
		os.RemoveAll(src.dir)
		return src, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	if src.rec.Session != "" {
		if err := m.snapshotForFork(&src); err != nil {
			os.RemoveAll(src.dir)
			return src, fmt.Errorf("fork sandbox %s: %w", id, err)
		}
	}
	return src, nil
}

// forksDir holds captured layers while forks are made; beside the
// sandboxes' records, on the state directory's filesystem, where the
// drivers keep their layers (reflinks need one filesystem).
func (m *sandboxManager) forksDir() string { return filepath.Join(filepath.Dir(m.dir), "forks") }

func (m *sandboxManager) snapshotForFork(src *forkSource) error {
	src.snapshot = "fork-" + filepath.Base(src.dir)
	if err := m.store.Snapshot(src.rec.Session, src.snapshot); err != nil {
		return fmt.Errorf("snapshot session %s: %w", src.rec.Session, err)
	}
	for _, ws := range m.store.Sessions() {
		if ws.ID == src.rec.Session {
			src.quota = ws.Quota
		}
	}
	return nil
}

// dropSource removes the capture and the session snapshot: the forks
// have their copies.
func (m *sandboxManager) dropSource(src forkSource) {
	if src.snapshot != "" {
		if err := m.store.DeleteSnapshot(src.rec.Session, src.snapshot); err != nil {
			m.log.Warn("sandbox fork: delete session snapshot", "session", src.rec.Session, "err", err)
		}
	}
	os.RemoveAll(src.dir)
}

// createFork makes one fork of src.
// The last one takes the capture itself rather than a copy.
func (m *sandboxManager) createFork(ctx context.Context, src forkSource, last bool) (*sandbox, error) {
	idle, exec := time.Duration(src.rec.IdleTimeout), time.Duration(src.rec.ExecTimeout)
	spec := createSpec{ID: newSandboxID(), Image: src.rec.Image, ImageHash: src.rec.ImageHash, Owner: src.rec.Owner,
		CPUs: src.rec.CPUs, Memory: src.rec.Memory, Pids: src.rec.Pids, Disk: src.rec.Disk,
		Env: maps.Clone(src.rec.Env), IdleTimeout: &idle, ExecTimeout: &exec,
		Layer: src.layer, TakeLayer: last, ForkedFrom: src.rec.ID}
	if src.snapshot != "" {
		spec.Session = forkSessionID(src.rec.Session, spec.ID)
		if err := m.branchWorkspace(src.rec.Session, src.snapshot, spec.Session); err != nil {
			return nil, err
		}
		spec.WorkspaceBytes, spec.WorkspaceFiles = src.quota.Bytes, src.quota.Inodes
	}
	s, err := m.create(ctx, spec)
	if err != nil && spec.Session != "" {
		m.store.DeleteSession(spec.Session)
	}
	return s, err
}

// branchWorkspace makes session newID a branch of session from at its
// snapshot: the workspace-level branch of a session. (Agent sessions
// with executions get theirs from the agents' own branching; this is
// the one place a fork branches a session, to be pointed at that.)
func (m *sandboxManager) branchWorkspace(from, snapshot, newID string) error {
	if err := m.store.Branch(from, snapshot, from, newID); err != nil {
		return fmt.Errorf("branch session %s into %s: %w", from, newID, err)
	}
	return nil
}

// forkSessionID names a fork's session: the source's, cut to fit, and
// the fork's id.
func forkSessionID(session, fork string) string {
	if max := 62 - len(fork); len(session) > max {
		session = session[:max]
	}
	return session + "-" + fork
}

// undoForks destroys the forks a failed request made, with their sessions.
func (m *sandboxManager) undoForks(forks []*sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range forks {
		err := m.Destroy(ctx, s.rec.ID)
		if s.rec.Session != "" {
			err = errors.Join(err, m.store.DeleteSession(s.rec.Session))
		}
		if err != nil {
			m.log.Warn("sandbox fork: undo", "id", s.rec.ID, "err", err)
		}
	}
}

// resolveVersion finds image name at version hash ("" the newest): a
// fork boots from its source's image even if it was built again since.
func (s *imageService) resolveVersion(name, hash string) (image.Image, error) {
	img, err := s.resolve(name)
	if err != nil || hash == "" || img.Hash == hash {
		return img, err
	}
	all, err := s.List()
	if err != nil {
		return image.Image{}, err
	}
	for _, img := range all {
		if img.Name == name && img.Hash == hash {
			return img, nil
		}
	}
	return image.Image{}, notFoundf("image %s version %s is gone: its sandboxes cannot be forked", name, shortHash(hash))
}
