package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The cluster's record of every node's sandboxes (hearth_cluster_sandbox):
// each node writes its own rows; the reaper marks a dead node's rows
// lost; any node may delete a row whose node is dead or which is lost.
// The machines themselves are only ever touched by their own node.

// SandboxLost is the state of a sandbox whose node was declared dead.
const SandboxLost = "lost"

// Errors about sandbox rows.
var (
	// ErrSandboxTaken: the id is another node's sandbox.
	ErrSandboxTaken = errors.New("sandbox id held by another node")
	// ErrSandboxNotFound: no row has the id.
	ErrSandboxNotFound = errors.New("no such sandbox in the cluster")
	// ErrSandboxLive: the row belongs to a live node, which alone may
	// remove it.
	ErrSandboxLive = errors.New("sandbox belongs to a live node")
)

// Sandbox is a sandbox as the cluster records it.
type Sandbox struct {
	ID      string
	Node    string
	Image   string
	State   string // running, paused, stopped, or SandboxLost
	Session string // "" when none
	Created time.Time
}

// SandboxStatus is a row with its node's address and liveness.
type SandboxStatus struct {
	Sandbox
	Addr     string // the node's API address, "" if it has none
	NodeDead bool   // its node is declared dead (or left)
}

func (s Sandbox) check() error {
	for _, f := range []struct{ what, v string }{{"sandbox id", s.ID}, {"image", s.Image}, {"state", s.State}} {
		if err := checkName(f.what, f.v); err != nil {
			return err
		}
	}
	if s.Session != "" {
		if err := checkName("session", s.Session); err != nil {
			return err
		}
	}
	if s.State == SandboxLost {
		return fmt.Errorf("%w: sandbox %s: only the cluster marks a sandbox lost", ErrBadJob, s.ID)
	}
	return nil
}

// same compares rows as the database keeps them (microseconds).
func (s Sandbox) same(o Sandbox) bool {
	t1, t2 := s.Created, o.Created
	s.Created, o.Created = time.Time{}, time.Time{}
	return s == o && t1.Truncate(time.Microsecond).Equal(t2.Truncate(time.Microsecond))
}

// PutSandbox records (or updates) one of this node's sandboxes. It never
// overwrites another node's row (ErrSandboxTaken) nor a row marked lost
// (left as it is: the node was declared dead, and will clean up when it
// syncs).
func (m *Member) PutSandbox(ctx context.Context, s Sandbox) error {
	s.Node = m.node.ID
	if err := s.check(); err != nil {
		return err
	}
	tag, err := m.pool.Exec(ctx, `
INSERT INTO hearth_cluster_sandbox AS t (id, node, image, state, session, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO UPDATE SET image = $3, state = $4, session = $5, updated_at = now()
	WHERE t.node = $2 AND t.state <> 'lost'`, s.ID, s.Node, s.Image, s.State, s.Session, s.Created)
	if err != nil {
		return fmt.Errorf("record sandbox %s: %w", s.ID, err)
	}
	if tag.RowsAffected() == 0 {
		got, err := m.Sandbox(ctx, s.ID)
		if err == nil && got.Node != s.Node {
			return fmt.Errorf("record sandbox %s: %w %s", s.ID, ErrSandboxTaken, got.Node)
		}
	}
	return nil
}

// ForgetSandbox deletes this node's row of a sandbox it destroyed; a row
// marked lost stays (RemoveSandbox deletes it). Idempotent.
func (m *Member) ForgetSandbox(ctx context.Context, id string) error {
	_, err := m.pool.Exec(ctx, `DELETE FROM hearth_cluster_sandbox WHERE id = $1 AND node = $2 AND state <> 'lost'`, id, m.node.ID)
	if err != nil {
		return fmt.Errorf("forget sandbox %s: %w", id, err)
	}
	return nil
}

// RemoveSandbox deletes a row from the record: this node's own, one
// marked lost, or one whose node is dead. Another live node's row is
// refused (ErrSandboxLive): only that node may remove it, by destroying
// the sandbox. It returns the row removed.
func (m *Member) RemoveSandbox(ctx context.Context, id string) (SandboxStatus, error) {
	s, err := m.Sandbox(ctx, id)
	if err != nil {
		return s, err
	}
	tag, err := m.pool.Exec(ctx, `
DELETE FROM hearth_cluster_sandbox t WHERE id = $1 AND (node = $2 OR state = 'lost'
	OR NOT EXISTS (SELECT 1 FROM hearth_cluster_node n WHERE n.id = t.node AND n.dead_at IS NULL))`, id, m.node.ID)
	if err != nil {
		return s, fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return s, fmt.Errorf("remove sandbox %s: %w %s", id, ErrSandboxLive, s.Node)
	}
	return s, nil
}

const sandboxColumns = `SELECT s.id, s.node, s.image, s.state, s.session, s.created_at, coalesce(n.addr, ''), n.id IS NULL OR n.dead_at IS NOT NULL
	FROM hearth_cluster_sandbox s LEFT JOIN hearth_cluster_node n ON n.id = s.node`

func scanSandbox(r pgx.CollectableRow) (SandboxStatus, error) {
	var s SandboxStatus
	return s, r.Scan(&s.ID, &s.Node, &s.Image, &s.State, &s.Session, &s.Created, &s.Addr, &s.NodeDead)
}

// Sandbox reads one row; ErrSandboxNotFound if none has the id.
func (m *Member) Sandbox(ctx context.Context, id string) (SandboxStatus, error) {
	rows, err := m.pool.Query(ctx, sandboxColumns+` WHERE s.id = $1`, id)
	if err != nil {
		return SandboxStatus{}, fmt.Errorf("read sandbox %s: %w", id, err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSandbox)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("sandbox %s: %w", id, ErrSandboxNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("read sandbox %s: %w", id, err)
	}
	return s, nil
}

// Sandboxes lists every node's sandboxes, oldest first.
func (m *Member) Sandboxes(ctx context.Context) ([]SandboxStatus, error) {
	return m.sandboxes(ctx, sandboxColumns+` ORDER BY s.created_at, s.id`)
}

func (m *Member) sandboxes(ctx context.Context, q string, args ...any) ([]SandboxStatus, error) {
	rows, err := m.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanSandbox)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// SyncSandboxes makes this node's rows say what it has: each of have is
// written (as PutSandbox), and its rows of sandboxes it no longer has are
// deleted, except those marked lost. It returns the ids among have whose
// rows are marked lost (the node was declared dead meanwhile: the caller
// destroys them, and their rows stay lost until removed) or were
// recorded before (recorded[id]) and are gone (removed from the record
// while the node was dead: the caller destroys them too), and those
// another node holds (not recorded).
func (m *Member) SyncSandboxes(ctx context.Context, have []Sandbox, recorded map[string]bool) (lost, taken []string, err error) {
	mine, err := m.sandboxes(ctx, sandboxColumns+` WHERE s.node = $1`, m.node.ID)
	if err != nil {
		return nil, nil, err
	}
	rows := map[string]Sandbox{}
	for _, r := range mine {
		rows[r.ID] = r.Sandbox
	}
	for _, s := range have {
		r, ok := rows[s.ID]
		delete(rows, s.ID)
		s.Node = m.node.ID
		switch {
		case ok && r.State == SandboxLost, !ok && recorded[s.ID]:
			lost = append(lost, s.ID)
		case ok && r.same(s):
		default:
			if err := m.PutSandbox(ctx, s); errors.Is(err, ErrSandboxTaken) {
				taken = append(taken, s.ID)
			} else if err != nil {
				return nil, nil, err
			}
		}
	}
	for id, r := range rows {
		if r.State != SandboxLost {
			if err := m.ForgetSandbox(ctx, id); err != nil {
				return nil, nil, err
			}
		}
	}
	return lost, taken, nil
}

// loseSandboxes marks a dead node's sandboxes lost, in the transaction
// declaring it dead. Idempotent.
func loseSandboxes(ctx context.Context, tx pgx.Tx, node string) error {
	if _, err := tx.Exec(ctx, `UPDATE hearth_cluster_sandbox SET state = 'lost', updated_at = now() WHERE node = $1 AND state <> 'lost'`, node); err != nil {
		return fmt.Errorf("mark sandboxes lost: %w", err)
	}
	return nil
}
