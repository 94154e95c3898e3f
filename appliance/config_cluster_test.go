package appliance

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

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
