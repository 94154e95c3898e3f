package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hearth/cluster"
)

// TestPostgresRestart stops PostgreSQL (immediate, as a crash) while runs
// are going and jobs are queued, then starts it again: the nodes
// reconnect, every execution enqueued before and after runs exactly once
// and its outcome is recorded, and no node is declared dead.
func TestPostgresRestart(t *testing.T) {
	srv, url := startDB(t)
	if srv == nil {
		t.Skip("PostgreSQL restart: HEARTH_TEST_POSTGRES points at a server this test cannot restart")
	}
	r := newRecorder()
	r.hold = 1500 * time.Millisecond
	opts := cluster.Options{Heartbeat: 500 * time.Millisecond, DeadAfter: 45 * time.Second}
	var a *cluster.Member
	for _, id := range []string{"a", "b", "c"} {
		m := join(t, url, cluster.Node{ID: id, Capacity: 1, Images: []string{"img"}}, r, opts)
		if a == nil {
			a = m
		}
	}
	ctx := bg(t)
	for i := range 9 {
		if err := a.Enqueue(ctx, cluster.Job{Execution: fmt.Sprintf("before%d", i), Image: "img"}); err != nil {
			t.Fatal(err)
		}
	}
	r.waitFor(t, 60*time.Second, "3 runs going", func() bool { return len(r.runs) >= 3 })
	srv.Stop(t)
	time.Sleep(2 * time.Second) // runs end while the database is down
	srv.Restart(t)
	for i := range 3 {
		if err := enqueueRetrying(ctx, a, cluster.Job{Execution: fmt.Sprintf("after%d", i), Image: "img"}); err != nil {
			t.Fatal(err)
		}
	}
	r.waitFor(t, 90*time.Second, "12 executions to end", func() bool { return ended(r) == 12 })
	r.mu.Lock()
	for e, runs := range r.runs {
		if len(runs) != 1 {
			t.Errorf("execution %s ran %d times", e, len(runs))
		}
	}
	if len(r.dead) != 0 {
		t.Errorf("nodes declared dead across a database restart: %v", r.dead)
	}
	r.mu.Unlock()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Every run's outcome landed, once.
	waitOutcomes(t, ctx, pool, 12)
	var open int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'hearth_dispatch' AND state NOT IN ('completed')`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Errorf("%d River dispatch jobs not completed after the restart", open)
	}
}

// enqueueRetrying retries while the pool reconnects: an Enqueue that
// returned an error acknowledged nothing.
func enqueueRetrying(ctx context.Context, m *cluster.Member, j cluster.Job) error {
	var err error
	for range 60 {
		if err = m.Enqueue(ctx, j); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

func waitOutcomes(t *testing.T, ctx context.Context, pool *pgxpool.Pool, want int) {
	t.Helper()
	var ok, total int
	for range 100 {
		err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE outcome = 'ok'), count(*) FROM hearth_cluster_run`).Scan(&ok, &total)
		if err == nil && ok == want && total == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("runs recorded: %d ok of %d, want %d of %d", ok, total, want, want)
}
