package appliance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"time"

	"hearth/cluster"
)

// A clustered node's sandboxes in the cluster's record
// (cluster.Member.PutSandbox...): written when one is created, changes
// state or is destroyed, and synced with what the node has at each join
// and every sandboxSync. Another node's sandbox is listed here with its
// node; an operation on it answers an error naming that node and its
// address (not proxied: nodes do not hold each other's tokens). A node
// declared dead has its rows marked lost by the cluster; when it comes
// back it destroys those sandboxes (machine, view, record), and their
// rows stay lost until removed (`hearth sandboxes rm`), as does a row a
// user removed while its node was dead.

// sandboxSync bounds how stale a node's rows may be (a machine that
// stopped by itself, an idle pause), and how soon a failed write is
// written again.
const sandboxSync = 2 * time.Second

// clusterTimeout bounds one read or write of the cluster's record made
// for an API call.
const clusterTimeout = 10 * time.Second

// clustered is the node this manager's sandboxes are recorded by, nil on
// a single host (or before the node joined).
func (m *sandboxManager) clustered() *clusterNode { return m.cl.Load() }

// changed asks the node to write the sandboxes' state soon.
func (m *sandboxManager) changed() {
	select {
	case m.dirty <- struct{}{}:
	default:
	}
}

// row is s as the cluster records it; the caller holds s.mu.
func row(s *sandbox) cluster.Sandbox {
	return cluster.Sandbox{ID: s.rec.ID, Image: s.rec.Image, State: s.status(), Session: s.rec.Session,
		Created: s.rec.Created.UTC().Truncate(time.Microsecond)}
}

// rows are this node's sandboxes as the cluster records them, and which
// of them were recorded there by node before.
func (m *sandboxManager) rows(node string) ([]cluster.Sandbox, map[string]bool) {
	var out []cluster.Sandbox
	recorded := map[string]bool{}
	for _, s := range m.list() {
		s.mu.Lock()
		if !s.destroyed {
			out = append(out, row(s))
			recorded[s.rec.ID] = s.rec.Node == node
		}
		s.mu.Unlock()
	}
	return out, recorded
}

// withMember runs fn with this node's membership and ctx bounded by
// clusterTimeout: every read or write of the cluster's sandbox record.
func (c *clusterNode) withMember(ctx context.Context, fn func(context.Context, *cluster.Member) error) error {
	mem, err := c.current()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	return fn(ctx, mem)
}

// checkClusterID refuses, before a create boots anything, an id another
// node's sandbox has.
func (m *sandboxManager) checkClusterID(ctx context.Context, id string) error {
	c := m.clustered()
	if c == nil {
		return nil
	}
	var s cluster.SandboxStatus
	err := c.withMember(ctx, func(ctx context.Context, mem *cluster.Member) (err error) {
		s, err = mem.Sandbox(ctx, id)
		return err
	})
	switch {
	case errors.Is(err, cluster.ErrSandboxNotFound):
		return nil
	case err != nil:
		return err
	case s.Node == c.node.ID && s.State != cluster.SandboxLost:
		return nil // a row left by a crash: the create replaces it
	}
	return conflictf("sandbox %s already exists on node %s of the cluster: pick another id", id, s.Node)
}

// recordCreated writes a new sandbox's row and registers it, under
// syncMu so that a sync never sees one without the other. A row that
// cannot be written fails the create (the caller destroys the machine).
func (m *sandboxManager) recordCreated(ctx context.Context, s *sandbox) error {
	m.syncMu.Lock()
	defer m.syncMu.Unlock()
	if c := m.clustered(); c != nil {
		s.mu.Lock()
		r := row(s)
		s.mu.Unlock()
		err := c.withMember(context.WithoutCancel(ctx), func(ctx context.Context, mem *cluster.Member) error {
			return mem.PutSandbox(ctx, r)
		})
		if errors.Is(err, cluster.ErrSandboxTaken) {
			return conflictf("sandbox %s already exists on another node of the cluster: pick another id", s.rec.ID)
		}
		if err != nil {
			return unavailablef("sandbox %s: record it in the cluster: %v", s.rec.ID, err)
		}
	}
	m.mu.Lock()
	m.boxes[s.rec.ID] = s
	m.mu.Unlock()
	return nil
}

// forgetDestroyed deletes a destroyed sandbox's row; a failure is left
// to the next sync.
func (m *sandboxManager) forgetDestroyed(ctx context.Context, id string) {
	c := m.clustered()
	if c == nil {
		return
	}
	err := c.withMember(context.WithoutCancel(ctx), func(ctx context.Context, mem *cluster.Member) error {
		return mem.ForgetSandbox(ctx, id)
	})
	if err != nil {
		m.log.Warn("sandbox: forget it in the cluster (the next sync does)", "id", id, "err", err)
	}
}

// elsewhere is why sandbox id, which this node does not have, cannot be
// used through it: another node has it, or it was lost. nil when the
// cluster has no such sandbox either (or on a single host).
func (m *sandboxManager) elsewhere(id string) error {
	c := m.clustered()
	if c == nil {
		return nil
	}
	var s cluster.SandboxStatus
	var read error
	err := c.withMember(context.Background(), func(ctx context.Context, mem *cluster.Member) error {
		s, read = mem.Sandbox(ctx, id)
		return nil
	})
	if err != nil {
		return err
	}
	switch err := read; {
	case errors.Is(err, cluster.ErrSandboxNotFound):
		return nil
	case err != nil:
		return unavailablef("sandbox %s: read the cluster's record: %v", id, err)
	}
	return errElsewhere(s)
}

func errElsewhere(s cluster.SandboxStatus) error {
	addr := s.Addr
	if addr == "" {
		addr = "no TCP address"
	}
	switch {
	case s.State == cluster.SandboxLost:
		return conflictf("sandbox %s was lost: its node %s (%s) stopped heartbeating and was declared dead; remove it from the record with `hearth sandboxes rm %s`", s.ID, s.Node, addr, s.ID)
	case s.NodeDead:
		return unavailablef("sandbox %s is on node %s (%s), which is not running: start that node, or remove the sandbox from the record with `hearth sandboxes rm %s`", s.ID, s.Node, addr, s.ID)
	}
	return unavailablef("sandbox %s is on node %s of the cluster: use that node's API at %s", s.ID, s.Node, addr)
}

// removeRecorded is Destroy of a sandbox this node does not have: a lost
// one, or one on a dead node, is removed from the cluster's record;
// another live node's is refused, naming it.
func (m *sandboxManager) removeRecorded(ctx context.Context, id string) error {
	c := m.clustered()
	if c == nil {
		return notFoundf("no sandbox %s: list them with `hearth sandboxes ls`", id)
	}
	var s cluster.SandboxStatus
	var removed error
	err := c.withMember(ctx, func(ctx context.Context, mem *cluster.Member) error {
		s, removed = mem.RemoveSandbox(ctx, id)
		return nil
	})
	if err != nil {
		return err
	}
	switch err := removed; {
	case errors.Is(err, cluster.ErrSandboxNotFound):
		return notFoundf("no sandbox %s in the cluster: list them with `hearth sandboxes ls`", id)
	case errors.Is(err, cluster.ErrSandboxLive):
		return errElsewhere(s)
	case err != nil:
		return unavailablef("sandbox %s: remove it from the cluster's record: %v", id, err)
	}
	m.log.Info("sandbox removed from the cluster's record", "id", id, "node", s.Node, "state", s.State)
	return nil
}

// ListCluster lists the sandboxes: this node's as List does and, on a
// clustered node, every other node's from the cluster's record (with
// what the record has: id, node, image, state, session, created).
func (m *sandboxManager) ListCluster(ctx context.Context) ([]SandboxInfo, error) {
	local := m.List()
	c := m.clustered()
	if c == nil {
		return local, nil
	}
	var rows []cluster.SandboxStatus
	var listed error
	if err := c.withMember(ctx, func(ctx context.Context, mem *cluster.Member) error {
		rows, listed = mem.Sandboxes(ctx)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := listed; err != nil {
		return nil, unavailablef("list the cluster's sandboxes: %v", err)
	}
	here := map[string]bool{}
	for i := range local {
		local[i].Node = c.node.ID
		here[local[i].ID] = true
	}
	for _, r := range rows {
		if r.Node == c.node.ID && here[r.ID] {
			continue
		}
		local = append(local, SandboxInfo{sandboxRecord: sandboxRecord{ID: r.ID, Image: r.Image, Session: r.Session,
			Created: r.Created.UTC(), Node: r.Node}, Status: r.State, NodeAddr: r.Addr})
	}
	slices.SortStableFunc(local, func(x, y SandboxInfo) int { return x.Created.Compare(y.Created) })
	return local, nil
}

// syncSandboxes writes this node's sandboxes to the cluster's record
// (see cluster.Member.SyncSandboxes) and destroys those the cluster
// lost: their rows are marked lost, or were removed while their node
// was dead.
func (c *clusterNode) syncSandboxes(ctx context.Context) error {
	m := c.sbx
	if m == nil || m.clustered() != c {
		return nil
	}
	mem, err := c.current()
	if err != nil {
		return err
	}
	m.syncMu.Lock()
	have, recorded := m.rows(c.node.ID)
	lost, taken, err := mem.SyncSandboxes(ctx, have, recorded)
	m.syncMu.Unlock()
	if err != nil {
		return err
	}
	for _, id := range taken {
		c.log.Warn("cluster: a sandbox here has the id of another node's: it is not in the cluster's record; destroy it or the other", "id", id)
	}
	for _, id := range lost {
		c.log.Warn("cluster: this node's sandbox was lost while the node was declared dead (marked lost, or since removed from the record): destroying it", "id", id)
		if err := m.Destroy(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			c.log.Warn("cluster: destroy a lost sandbox", "id", id, "err", err)
		}
	}
	m.markRecorded(c.node.ID, taken)
	return nil
}

// markRecorded notes in their records that the sandboxes are in the
// cluster's record of node (all but skip), so that a row removed while
// the node was dead is told from one never written.
func (m *sandboxManager) markRecorded(node string, skip []string) {
	for _, s := range m.list() {
		s.mu.Lock()
		if s.rec.Node == "" && !s.destroyed && !slices.Contains(skip, s.rec.ID) {
			s.rec.Node = node
			if err := m.save(&s.rec); err != nil {
				m.log.Warn("sandbox", "id", s.rec.ID, "err", err)
			}
		}
		s.mu.Unlock()
	}
}

// followSandboxes syncs this node's sandboxes when one changes and every
// sandboxSync, until the node closes.
func (c *clusterNode) followSandboxes() {
	defer c.wg.Done()
	tick := time.NewTicker(sandboxSync)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		case <-c.sbx.dirty:
		}
		ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
		if err := c.syncSandboxes(ctx); err != nil {
			c.log.Warn("cluster: sync this node's sandboxes", "err", err)
		}
		cancel()
	}
}

// undoBoot takes back a sandbox booted but not registered: its machine,
// its view and its record (its session, if made, stays, as a destroy
// leaves it).
func (m *sandboxManager) undoBoot(s *sandbox) {
	if err := s.m.Destroy(context.Background()); err != nil {
		m.log.Warn("sandbox: destroy a machine whose create failed", "id", s.rec.ID, "err", err)
	}
	if s.view != nil {
		s.view.Unmount()
	}
	os.Remove(m.viewDir(s.rec.ID))
	os.Remove(filepath.Join(m.dir, s.rec.ID+".json"))
}
