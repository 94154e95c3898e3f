package appliance

import (
	"context"
	"fmt"
	"time"

	"hearth/agents/store"
)

// ClusterConfig is [cluster]: several daemons sharing one record of
// agent work. Empty, the daemon keeps it in its own SQLite file
// (<state_dir>/hearth.db), as a single host always has.
type ClusterConfig struct {
	// Database is a PostgreSQL URL (postgres://user@host/db?sslmode=...):
	// sessions, executions, events and the credit ledger are kept there,
	// shared by every daemon that names it.
	Database string `toml:"database"`
}

// storeOpenTimeout bounds reaching the cluster's database at start-up.
const storeOpenTimeout = 30 * time.Second

func (c ClusterConfig) validate() error {
	if c.Database == "" {
		return nil
	}
	if _, err := store.ParsePostgresURL(c.Database); err != nil {
		return fmt.Errorf("cluster.database: %w", err)
	}
	return nil
}

// openStore opens the agents' store: the cluster's PostgreSQL database
// when [cluster] names one, else the SQLite file db.
func (c ClusterConfig) openStore(db string) (*store.Store, error) {
	if c.Database == "" {
		return store.Open(db)
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
	defer cancel()
	st, err := store.OpenPostgres(ctx, c.Database, store.PostgresOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster.database: %w (check that the server runs and the URL is right, or remove [cluster] to keep the record in %s)", err, db)
	}
	return st, nil
}
