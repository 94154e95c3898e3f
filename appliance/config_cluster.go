package appliance

import (
	"context"
	"fmt"
	"os"
	"regexp"
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
	// Capacity is how many executions this node runs at once, across
	// its images (default 8); a job reaching a full node waits for any
	// node with room.
	Capacity int `toml:"capacity"`
	// DeadAfter is how long a node may go without a heartbeat before the
	// others declare it dead and end its executions interrupted (default
	// 15s, at least 3s).
	DeadAfter Duration `toml:"dead_after"`
}

// defaultCapacity is [cluster] capacity when none is given.
const defaultCapacity = 8

// maxCapacity bounds [cluster] capacity: a node's River workers.
const maxCapacity = 1000

// nodeIDPattern is what the cluster accepts as a node id.
var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// nodeID is this daemon's node id: cluster.node, else the host name.
func (c ClusterConfig) nodeID() (string, error) {
	if c.Node != "" {
		return c.Node, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("cluster.node: the host name: %w: set cluster.node", err)
	}
	if !nodeIDPattern.MatchString(host) {
		return "", fmt.Errorf("cluster.node: the host name %q is not a node id: set cluster.node to 1 to 63 letters, digits, '.', '_' or '-'", host)
	}
	return host, nil
}

func (c ClusterConfig) capacity() int {
	if c.Capacity == 0 {
		return defaultCapacity
	}
	return c.Capacity
}

// storeOpenTimeout bounds reaching the cluster's database at start-up.
const storeOpenTimeout = 30 * time.Second

func (c ClusterConfig) validate() error {
	// capacity and dead_after mean nothing on a single host, but their
	// range is checked all the same.
	if c.Database == "" && c.Node != "" {
		return fmt.Errorf("cluster.node = %q without cluster.database: name the shared database too, or remove node", c.Node)
	}
	if c.Node != "" && !nodeIDPattern.MatchString(c.Node) {
		return fmt.Errorf("cluster.node = %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", c.Node)
	}
	if c.Capacity < 0 || c.Capacity > maxCapacity {
		return fmt.Errorf("cluster.capacity = %d: give how many executions this node runs at once, 1 to %d (0 or none: %d)", c.Capacity, maxCapacity, defaultCapacity)
	}
	if d := time.Duration(c.DeadAfter); d != 0 && d < 3*time.Second {
		return fmt.Errorf("cluster.dead_after = %v: give at least 3s (none: 15s)", d)
	}
	if _, err := store.ParsePostgresURL(c.Database); c.Database != "" && err != nil {
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
	node, err := c.nodeID()
	if err != nil {
		return nil, err
	}
	st, err := store.OpenPostgres(ctx, c.Database, store.PostgresOptions{Node: node})
	if err != nil {
		return nil, fmt.Errorf("cluster.database: %w (check that the server runs and the URL is right, or remove [cluster] to keep the record in %s)", err, db)
	}
	return st, nil
}
