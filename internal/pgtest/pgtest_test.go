package pgtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"hearth/internal/netnstest"
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

// TestStartInNetNS starts a server inside a test host's network
// namespace, listening on the host's address: the URL Start returns is
// that address's, and it serves the database there to a client in the
// namespace.
func TestStartInNetNS(t *testing.T) {
	lan := netnstest.New(t, 1)
	h := lan.Hosts[0]
	s, dsn := Start(t, Options{Listen: h.HostPort(5432), NetNS: h.NetNS})
	if s.Host != h.Addr.String() || !strings.Contains(dsn, "@"+h.HostPort(5432)+"/hearth_") {
		t.Fatalf("Start in %s = host %s, URL %s; want the host's address", h.NetNS, s.Host, dsn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = h.DialContext
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect from %s: %v", h.NetNS, err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT 7").Scan(&n); err != nil || n != 7 {
		t.Fatalf("SELECT 7 = %d, %v", n, err)
	}
}
