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
	// Node names this daemon among those sharing the database (default:
	// the host name); each daemon needs its own. It owns the executions
	// it creates.
	Node string `toml:"node"`
}

// storeOpenTimeout bounds reaching the cluster's database at start-up.
const storeOpenTimeout = 30 * time.Second

func (c ClusterConfig) validate() error {
	if c.Database == "" {
		if c.Node != "" {
			return fmt.Errorf("cluster.node = %q without cluster.database: name the shared database too, or remove node", c.Node)
		}
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
		if err := createPrivate(db); err != nil {
			return nil, fmt.Errorf("agents store: %w", err)
		}
		return store.Open(db)
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
	defer cancel()
	st, err := store.OpenPostgres(ctx, c.Database, store.PostgresOptions{Node: c.Node})
	if err != nil {
		return nil, fmt.Errorf("cluster.database: %w (check that the server runs and the URL is right, or remove [cluster] to keep the record in %s)", err, db)
	}
	return st, nil
}
