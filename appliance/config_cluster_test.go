package appliance

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/internal/pgtest"
)

// TestClusterOpensPostgres: with [cluster] database set the daemon's
// store is that PostgreSQL database, and an unreachable server is refused
// naming it (without its password) and saying what to do.
func TestClusterOpensPostgres(t *testing.T) {
	_, dbURL := pgtest.Start(t, pgtest.Options{})
	sqlite := filepath.Join(t.TempDir(), "hearth.db")
	st, err := ClusterConfig{Database: dbURL}.openStore(sqlite)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.Path(), "postgres://") {
		t.Errorf("store at %s, want the cluster's database", st.Path())
	}
	if err := st.AddCredits(context.Background(), 1, "top-up"); err != nil {
		t.Fatal(err)
	}
	st.Close()

	_, err = ClusterConfig{Database: "postgres://hearth:secret@127.0.0.1:9/hearth?connect_timeout=5"}.openStore(sqlite)
	if !errors.Is(err, store.ErrUnreachable) || !strings.Contains(err.Error(), "127.0.0.1:9") ||
		!strings.Contains(err.Error(), "remove [cluster]") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("unreachable server: %v; want ErrUnreachable naming 127.0.0.1:9, what to do, and no password", err)
	}
}

// TestAgentsOnPostgres: a daemon with [cluster] database runs a real
// agent task with credits on PostgreSQL: it is charged exactly what the
// gateway metered, and another node reading the database finds the
// execution (owned by this daemon's node), its events and the ledger.
func TestAgentsOnPostgres(t *testing.T) {
	_, dbURL := pgtest.Start(t, pgtest.Options{})
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{textTurn("done")}}, func(cfg *Config) {
		cfg.Credits.Enabled = true
		cfg.Cluster = ClusterConfig{Database: dbURL, Node: "node-a"}
	})
	ctx := context.Background()
	if _, err := env.c.AddCredits(ctx, 2, "cluster budget"); err != nil {
		t.Fatal(err)
	}
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{Usd: 1}, Wait: true})
	if err != nil || e.Status != "completed" {
		t.Fatalf("Delegate on PostgreSQL = %+v, %v", e, err)
	}
	other, err := store.OpenPostgres(ctx, dbURL, store.PostgresOptions{Node: "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	got, err := other.GetExecution(ctx, e.Id)
	if err != nil || got.Status != store.Completed || got.Node != "node-a" {
		t.Fatalf("node-b reads %+v, %v; want the completed execution owned by node-a", got, err)
	}
	evs, err := other.Events(ctx, e.Id, 0, 0)
	if err != nil || len(evs) == 0 {
		t.Fatalf("node-b reads %d events, %v", len(evs), err)
	}
	avail, reserved, spent, err := other.Balance(ctx)
	if err != nil || reserved != 0 || spent < 0.00449 || spent > 0.00451 || avail != 2-spent {
		t.Errorf("ledger seen from node-b: %v available, %v reserved, %v spent, %v; want $0.0045 spent of 2", avail, reserved, spent, err)
	}
}
