package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/rivertype"
)

// register writes the node's row for this incarnation. A previous
// incarnation still alive by its row is this node restarted: it is
// declared dead first, so its runs are not forgotten.
func (m *Member) register(ctx context.Context) error {
	var old string
	err := m.pool.QueryRow(ctx, `SELECT incarnation FROM hearth_cluster_node WHERE id = $1 AND dead_at IS NULL`, m.node.ID).Scan(&old)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("read node row: %w", err)
	default:
		if err := m.declareDead(ctx, m.node.ID, old, false); err != nil {
			return fmt.Errorf("declare previous incarnation dead: %w", err)
		}
	}
	_, err = m.pool.Exec(ctx, `
INSERT INTO hearth_cluster_node (id, incarnation, addr, tier, capacity, images)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO UPDATE SET incarnation = $2, addr = $3, tier = $4, capacity = $5,
	images = $6, joined_at = now(), last_seen = now(), dead_at = NULL`,
		m.node.ID, m.incarnation, m.node.Addr, m.node.Tier, m.node.Capacity, m.node.Images)
	if err != nil {
		return fmt.Errorf("write node row: %w", err)
	}
	return nil
}

// heartbeats updates the node's row every Heartbeat and fences the node
// when its lease runs out: no heartbeat has landed for 2/3 of DeadAfter
// (measured from when it was sent, on the local monotonic clock, so the
// lease ends here before the database's last_seen+DeadAfter), or the row
// says it was declared dead.
func (m *Member) heartbeats() {
	defer m.wg.Done()
	lease := m.opts.DeadAfter * 2 / 3
	tick := time.NewTicker(min(m.opts.Heartbeat, lease/4))
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		}
		m.mu.Lock()
		paused, last := m.stopped, m.lastOK
		m.mu.Unlock()
		if !paused {
			m.beat(lease)
			m.mu.Lock()
			last = m.lastOK
			m.mu.Unlock()
		}
		if time.Since(last) > lease {
			m.loseLease(fmt.Errorf("no heartbeat landed for %v", time.Since(last).Round(time.Millisecond)))
		}
	}
}

func (m *Member) beat(timeout time.Duration) {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(m.ctx, timeout)
	defer cancel()
	tag, err := m.pool.Exec(ctx, `UPDATE hearth_cluster_node SET last_seen = now() WHERE id = $1 AND incarnation = $2 AND dead_at IS NULL`,
		m.node.ID, m.incarnation)
	switch {
	case err != nil:
		m.opts.Logger.Warn("cluster heartbeat", "node", m.node.ID, "err", err)
	case tag.RowsAffected() == 0:
		m.loseLease(errors.New("declared dead by the cluster"))
	default:
		m.mu.Lock()
		m.lastOK = sent
		m.mu.Unlock()
	}
}

func (m *Member) loseLease(why error) {
	if m.fence.Err() != nil {
		return
	}
	m.opts.Logger.Error("cluster node fenced: its runs are cancelled", "node", m.node.ID, "why", why)
	m.fenced()
	// Take no more jobs: the cluster is about to requeue this node's.
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
		defer cancel()
		if err := m.client.Stop(ctx); err != nil {
			m.opts.Logger.Warn("cluster stop river on fence", "node", m.node.ID, "err", err)
		}
	}()
}

// Nodes lists every node that ever joined, live or dead.
func (m *Member) Nodes(ctx context.Context) ([]NodeStatus, error) {
	rows, err := m.pool.Query(ctx, `SELECT id, addr, tier, capacity, images, joined_at, last_seen, dead_at FROM hearth_cluster_node ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var out []NodeStatus
	for rows.Next() {
		var n NodeStatus
		var dead *time.Time
		if err := rows.Scan(&n.ID, &n.Addr, &n.Tier, &n.Capacity, &n.Images, &n.Joined, &n.LastSeen, &dead); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		if dead != nil {
			n.Dead = *dead
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// reapArgs is the leader's periodic job looking for dead nodes.
type reapArgs struct{}

func (reapArgs) Kind() string { return "hearth_cluster_reap" }

type reapWorker struct {
	river.WorkerDefaults[reapArgs]
	m *Member
}

// Work declares dead every live node whose last heartbeat is older than
// DeadAfter by the database's clock. Each node is marked and handled in
// its own transaction, so one failing hook does not hold up the others.
func (w *reapWorker) Work(ctx context.Context, _ *river.Job[reapArgs]) error {
	rows, err := w.m.pool.Query(ctx, `SELECT id, incarnation FROM hearth_cluster_node
		WHERE dead_at IS NULL AND last_seen < now() - make_interval(secs => $1)`, w.m.opts.DeadAfter.Seconds())
	if err != nil {
		return fmt.Errorf("find dead nodes: %w", err)
	}
	type inc struct{ id, incarnation string }
	dead, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inc, error) {
		var i inc
		return i, r.Scan(&i.id, &i.incarnation)
	})
	if err != nil {
		return fmt.Errorf("find dead nodes: %w", err)
	}
	var errs []error
	for _, d := range dead {
		errs = append(errs, w.m.declareDead(ctx, d.id, d.incarnation, true))
	}
	return errors.Join(errs...)
}

// declareDead marks one incarnation of a node dead, ends its unfinished
// runs as lost, finalizes their River jobs, calls NodeDead and requeues
// what it returns, all in one transaction: if anything fails nothing is
// marked, and the next reap tries again (NodeDead is idempotent). The
// row lock on the node makes a concurrent second declaration wait, then
// find nothing to do.
//
// reaped says the node stopped heartbeating (the reaper found it): its
// sandboxes are marked lost in the same transaction. A node leaving
// (Close) or joining again after a restart declares its own previous
// incarnation dead without that: its machines are still on its host,
// and it reconciles its sandboxes' rows itself (SyncSandboxes).
func (m *Member) declareDead(ctx context.Context, id, incarnation string, reaped bool) error {
	tx, err := m.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("declare node %s dead: %w", id, err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE hearth_cluster_node SET dead_at = now() WHERE id = $1 AND incarnation = $2 AND dead_at IS NULL`, id, incarnation)
	if err != nil {
		return fmt.Errorf("declare node %s dead: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return nil // already declared, or rejoined as a new incarnation
	}
	lost, err := m.endLostRuns(ctx, tx, id, incarnation)
	if err != nil {
		return fmt.Errorf("declare node %s dead: %w", id, err)
	}
	if reaped {
		if err := loseSandboxes(ctx, tx, id); err != nil {
			return fmt.Errorf("declare node %s dead: %w", id, err)
		}
	}
	requeue, err := m.hooks.NodeDead(ctx, id, lost)
	if err != nil {
		return fmt.Errorf("declare node %s dead: hook: %w", id, err)
	}
	if err := m.requeue(ctx, tx, lost, requeue); err != nil {
		return fmt.Errorf("declare node %s dead: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("declare node %s dead: %w", id, err)
	}
	m.opts.Logger.Warn("cluster node declared dead", "node", id, "lost", len(lost), "requeued", len(requeue))
	return nil
}

// endLostRuns marks the incarnation's unfinished runs lost and finalizes
// their River jobs as cancelled if still running (a dead client never
// completes them; River's rescuer would otherwise discard them only after
// RescueStuckJobsAfter).
func (m *Member) endLostRuns(ctx context.Context, tx pgx.Tx, id, incarnation string) ([]Assignment, error) {
	rows, err := tx.Query(ctx, `UPDATE hearth_cluster_run SET ended_at = now(), outcome = 'lost'
		WHERE node = $1 AND incarnation = $2 AND ended_at IS NULL RETURNING job_id, execution, attempt`, id, incarnation)
	if err != nil {
		return nil, fmt.Errorf("end lost runs: %w", err)
	}
	lost, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Assignment, error) {
		a := Assignment{Node: id}
		return a, r.Scan(&a.JobID, &a.Execution, &a.Attempt)
	})
	if err != nil {
		return nil, fmt.Errorf("end lost runs: %w", err)
	}
	params := &riverdriver.JobSetStateIfRunningManyParams{}
	now := time.Now()
	for i, a := range lost {
		// The run row names the execution; image and payload are the
		// job's (kept by River's cleaner for a day after it ends).
		if job, err := m.client.JobGetTx(ctx, tx, a.JobID); err == nil {
			if args, err := decodeArgs(job.EncodedArgs); err == nil {
				lost[i].Image, lost[i].Payload = args.Image, args.Payload
			}
		}
		params.ID = append(params.ID, a.JobID)
		params.Attempt = append(params.Attempt, nil)
		params.ErrData = append(params.ErrData, nil)
		params.FinalizedAt = append(params.FinalizedAt, &now)
		params.MetadataDoMerge = append(params.MetadataDoMerge, false)
		params.MetadataUpdates = append(params.MetadataUpdates, nil)
		params.ScheduledAt = append(params.ScheduledAt, nil)
		params.State = append(params.State, rivertype.JobStateCancelled)
	}
	if len(params.ID) > 0 {
		if _, err := m.client.Driver().UnwrapExecutor(tx).JobSetStateIfRunningMany(ctx, params); err != nil {
			return nil, fmt.Errorf("cancel lost jobs: %w", err)
		}
	}
	return lost, nil
}
