package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStart starts a server, writes a row, survives a crash-restart
// with the row committed, and leaves no server behind (the cleanup's
// pg_ctl stop fails the test otherwise).
func TestStart(t *testing.T) {
	s, dsn := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect %s: %v", dsn, err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE TABLE t (n int); INSERT INTO t VALUES (7)")
	if s == nil {
		return // HEARTH_TEST_POSTGRES: not our server to restart
	}
	s.Stop(t)
	s.Restart(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect after restart: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT n FROM t").Scan(&n); err != nil || n != 7 {
		t.Fatalf("SELECT n = %d, %v; want 7", n, err)
	}
}
