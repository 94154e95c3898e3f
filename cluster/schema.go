package cluster

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// schema is this package's own migration. It only ever grows with
// IF NOT EXISTS statements, so applying it again is harmless.
const schema = `
CREATE TABLE IF NOT EXISTS hearth_cluster_node (
	id          text PRIMARY KEY,
	incarnation text NOT NULL,
	addr        text NOT NULL,
	tier        text NOT NULL,
	capacity    int NOT NULL,
	images      text[] NOT NULL,
	joined_at   timestamptz NOT NULL DEFAULT now(),
	last_seen   timestamptz NOT NULL DEFAULT now(),
	dead_at     timestamptz
);
CREATE TABLE IF NOT EXISTS hearth_cluster_run (
	job_id      bigint PRIMARY KEY,
	execution   text NOT NULL,
	attempt     int NOT NULL,
	node        text NOT NULL,
	incarnation text NOT NULL,
	started_at  timestamptz NOT NULL DEFAULT now(),
	ended_at    timestamptz,
	outcome     text
);
CREATE INDEX IF NOT EXISTS hearth_cluster_run_open
	ON hearth_cluster_run (node, incarnation) WHERE ended_at IS NULL;
CREATE TABLE IF NOT EXISTS hearth_cluster_sandbox (
	id         text PRIMARY KEY,
	node       text NOT NULL,
	image      text NOT NULL,
	state      text NOT NULL,
	session    text NOT NULL DEFAULT '',
	created_at timestamptz NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS hearth_cluster_sandbox_node ON hearth_cluster_sandbox (node);
`

// migrateLock is the advisory lock key serializing migrations of nodes
// joining at the same moment ("hearth-cl" in ASCII).
const migrateLock = 0x68656172746863

// Migrate applies River's migrations, then this package's tables. River's
// own need several transactions (a new enum value must commit before use),
// so nodes joining at the same moment take turns on a session advisory
// lock held on one connection meanwhile. Join calls it; it is exported
// for tools that prepare a database before any node starts.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate cluster schema: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLock)); err != nil {
		return fmt.Errorf("migrate cluster schema: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrateLock))
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("migrate cluster schema: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate river schema: %w", err)
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("migrate cluster tables: %w", err)
	}
	return nil
}
