package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// Node is what a daemon tells the cluster about itself.
type Node struct {
	ID   string // stable across restarts, unique in the cluster
	Addr string // where other nodes and operators reach its API
	Tier string // the sandbox tier it runs: jail, qemu, chv
	// Capacity is how many executions it runs at once.
	Capacity int
	// Images are the images it can run; it takes only jobs for these.
	Images []string
}

// NodeStatus is a node as the cluster sees it.
type NodeStatus struct {
	Node
	Joined   time.Time
	LastSeen time.Time // its latest heartbeat, by the database's clock
	Dead     time.Time // when it was declared dead; zero while alive
}

// Assignment is one execution run on one node: what the Run hook gets and
// what a dead node's hook is told was lost.
type Assignment struct {
	Execution string
	Image     string
	Payload   []byte
	Attempt   int   // 1 for the first run, +1 per requeue
	JobID     int64 // the River job
	Node      string
}

// Fired is a schedule's due time, fired once per cluster.
type Fired struct {
	Schedule string
	Due      time.Time
	Payload  []byte
}

// Hooks are what the appliance does for the cluster. Every node must give
// the same ones: any node may run any of them.
type Hooks struct {
	// Run runs an execution on this node and returns when it has ended.
	// It must return soon after ctx is done: ctx ends when this node
	// loses its lease (see Options.DeadAfter) or leaves.
	Run func(ctx context.Context, a Assignment) error
	// NodeDead is told, once per death (again only if it failed), that a
	// node died with these runs unfinished; it marks them interrupted
	// (the node's sandboxes are marked lost in the same transaction, see
	// SyncSandboxes), and returns the executions to run again
	// elsewhere (the agent's retry policy). It must be idempotent.
	NodeDead func(ctx context.Context, node string, lost []Assignment) (requeue []string, err error)
	// Schedule starts a schedule's run; it is called once per due time
	// given to Fire, on whichever node takes it.
	Schedule func(ctx context.Context, f Fired) error
}

// Options tune a member; zero values take the defaults.
type Options struct {
	// Heartbeat is how often the node says it is alive; default 3s.
	Heartbeat time.Duration
	// DeadAfter is how long without a heartbeat makes a node dead;
	// default 15s. A node stops its own runs (cancels their ctx) when it
	// has not heartbeated for 2/3 of it, before anyone can declare it
	// dead, so a run is never going on two nodes at once.
	DeadAfter time.Duration
	// Reap is how often the leader looks for dead nodes; default 1s.
	Reap   time.Duration
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Heartbeat <= 0 {
		o.Heartbeat = 3 * time.Second
	}
	if o.DeadAfter <= 0 {
		o.DeadAfter = 15 * time.Second
	}
	if o.Reap <= 0 {
		o.Reap = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Errors.
var (
	ErrBadNode   = errors.New("bad node")
	ErrBadJob    = errors.New("bad job")
	ErrNoNode    = errors.New("no live node has the image")
	ErrFenced    = errors.New("node lost its lease")
	ErrDuplicate = errors.New("node id already joined by a live process")
)

// Member is this daemon's membership of the cluster. Close leaves.
type Member struct {
	node        Node
	incarnation string
	pool        *pgxpool.Pool
	client      *river.Client[pgx.Tx]
	hooks       Hooks
	opts        Options
	slots       chan struct{} // capacity: one token per running execution

	ctx    context.Context // the member's life; cancelled by Close or a crash
	cancel context.CancelFunc
	fence  context.Context // cancelled when the lease is lost: runs stop
	fenced context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	lastOK  time.Time // local monotonic time a successful heartbeat was sent
	stopped bool      // heartbeats paused (tests of a partition)
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func (n Node) validate() error {
	if !idPattern.MatchString(n.ID) {
		return fmt.Errorf("%w: id %q: use 1 to 63 letters, digits, '.', '_' or '-'", ErrBadNode, n.ID)
	}
	if n.Capacity < 1 {
		return fmt.Errorf("%w: node %s: capacity %d: give at least 1", ErrBadNode, n.ID, n.Capacity)
	}
	if len(n.Images) == 0 {
		return fmt.Errorf("%w: node %s: no images: list the images it can run", ErrBadNode, n.ID)
	}
	for _, im := range n.Images {
		if im == "" {
			return fmt.Errorf("%w: node %s: empty image name", ErrBadNode, n.ID)
		}
	}
	return nil
}

// Join registers n (its schema migrated first) and starts heartbeating and
// working the queues of its images. A previous incarnation of the same id
// still marked alive (this node restarting before it was declared dead)
// is declared dead first, so its unfinished runs reach Hooks.NodeDead.
// ctx bounds the join only.
func Join(ctx context.Context, pool *pgxpool.Pool, n Node, hooks Hooks, opts Options) (*Member, error) {
	if err := n.validate(); err != nil {
		return nil, err
	}
	if hooks.Run == nil || hooks.NodeDead == nil || hooks.Schedule == nil {
		return nil, fmt.Errorf("%w: node %s: give all of Run, NodeDead and Schedule hooks", ErrBadNode, n.ID)
	}
	if err := Migrate(ctx, pool); err != nil {
		return nil, err
	}
	m := &Member{node: n, pool: pool, hooks: hooks, opts: opts.withDefaults(), slots: make(chan struct{}, n.Capacity)}
	m.incarnation = newIncarnation()
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.fence, m.fenced = context.WithCancel(m.ctx)
	client, err := m.newClient()
	if err != nil {
		m.cancel()
		return nil, fmt.Errorf("join node %s: %w", n.ID, err)
	}
	m.client = client
	m.lastOK = time.Now()
	if err := m.register(ctx); err != nil {
		m.cancel()
		return nil, fmt.Errorf("join node %s: %w", n.ID, err)
	}
	if err := client.Start(m.ctx); err != nil {
		m.cancel()
		return nil, fmt.Errorf("join node %s: start river: %w", n.ID, err)
	}
	m.wg.Add(1)
	go m.heartbeats()
	return m, nil
}

func newIncarnation() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ID is the node's id.
func (m *Member) ID() string { return m.node.ID }

// Fenced is closed when this node lost its lease (it did not heartbeat in
// time, or was declared dead): its runs were cancelled and it takes no
// more; the daemon should Close and Join again.
func (m *Member) Fenced() <-chan struct{} { return m.fence.Done() }

// Close leaves the cluster: it stops taking jobs and waits, bounded by
// ctx, for its runs to end; then it cancels those still going and
// declares itself dead (bounded apart from ctx, since it must happen),
// so runs it could not finish are handed to NodeDead, not forgotten.
func (m *Member) Close(ctx context.Context) error {
	stopErr := m.client.Stop(ctx)
	m.cancel()
	select {
	case <-m.client.Stopped():
	case <-time.After(m.opts.DeadAfter / 3):
		// A Run hook ignoring its context: leave it to NodeDead.
	}
	m.wg.Wait()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	if err := m.declareDead(dctx, m.node.ID, m.incarnation, false); err != nil {
		return fmt.Errorf("leave node %s: %w", m.node.ID, err)
	}
	if stopErr != nil {
		return fmt.Errorf("leave node %s: stop river: %w", m.node.ID, stopErr)
	}
	return nil
}
