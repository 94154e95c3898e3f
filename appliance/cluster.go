package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hearth/agents"
	"hearth/agents/store"
	"hearth/cluster"
)

// clusterNode is this daemon as a node of a cluster ([cluster]
// database): it joins with its tier, capacity and images, runs the
// executions the queue hands it (whichever node's API took them), ends a
// dead node's executions interrupted and fires schedules once per
// cluster. A single host has none (agentService.cluster nil) and runs
// everything as it always has.
type clusterNode struct {
	a    *agentService
	sbx  *sandboxManager // its sandboxes, recorded in the cluster; nil if none
	pool *pgxpool.Pool
	node cluster.Node
	opts cluster.Options
	log  *slog.Logger

	mu     sync.Mutex
	member *cluster.Member // replaced when the node re-joins after losing its lease
	stop   chan struct{}   // closed by Close
	wg     sync.WaitGroup
}

// nodeQueue is the pseudo-image every node lists besides its images: a
// job queued to it runs on that node only (a session's later runs, where
// its files are, when that node's workspace is its own).
func nodeQueue(id string) string { return "node:" + id }

// sharedQueue is the pseudo-image a node on a shared workspace (served
// from it or reached from it, remote.WorkspaceID ws) lists for each of
// its images: a session's later runs go to any node with the image that
// sees the session's files.
func sharedQueue(ws, image string) string { return "ws:" + ws + "/" + image }

// sharedWorkspace is the workspace a node's listed queues say it shares,
// "" for none.
func sharedWorkspace(n cluster.Node) string {
	for _, q := range n.Images {
		// An image name has no '/'; a fingerprint (base64) may.
		if rest, ok := strings.CutPrefix(q, "ws:"); ok {
			if i := strings.LastIndexByte(rest, '/'); i > 0 {
				return rest[:i]
			}
		}
	}
	return ""
}

// rejoinWait bounds the wait between attempts to join again after the
// node lost its lease.
const rejoinWait = 10 * time.Second

// joinCluster makes this daemon a node: its executions' capacity, its
// tier, the images it has built (an image built later is listed at the
// next join), addr, where its API listens on TCP ("" for none), and ws,
// the shared workspace it works in ("" when its workspace is its own).
func joinCluster(ctx context.Context, cfg Config, a *agentService, sbx *sandboxManager, tier, addr, ws string, log *slog.Logger) (*clusterNode, error) {
	id, err := cfg.Cluster.nodeID()
	if err != nil {
		return nil, err
	}
	images := []string{nodeQueue(id)}
	built, err := a.images.List()
	if err != nil {
		return nil, fmt.Errorf("cluster: list this node's images: %w", err)
	}
	for _, img := range built {
		if !slices.Contains(images, img.Name) {
			images = append(images, img.Name)
			if ws != "" {
				images = append(images, sharedQueue(ws, img.Name))
			}
		}
	}
	pcfg, err := pgxpool.ParseConfig(cfg.Cluster.Database)
	if err != nil {
		return nil, fmt.Errorf("cluster.database: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("cluster.database: %w", err)
	}
	c := &clusterNode{a: a, sbx: sbx, pool: pool, log: log, stop: make(chan struct{}),
		node: cluster.Node{ID: id, Addr: addr, Tier: tier, Capacity: cfg.Cluster.capacity(), Images: images},
		opts: cluster.Options{DeadAfter: time.Duration(cfg.Cluster.DeadAfter), Logger: slog.New(warnOnly{log.Handler()})}}
	a.cluster = c // before its hooks can run
	m, err := cluster.Join(ctx, pool, c.node, c.hooks(), c.opts)
	if err != nil {
		a.cluster = nil
		pool.Close()
		return nil, fmt.Errorf("cluster: %w (check that the database is reachable, or remove [cluster])", err)
	}
	c.mu.Lock()
	c.member = m
	c.mu.Unlock()
	if sbx != nil {
		sbx.cl.Store(c)
		if err := c.syncSandboxes(ctx); err != nil {
			log.Warn("cluster: sync this node's sandboxes (retried every few seconds)", "err", err)
		}
		c.wg.Add(1)
		go c.followSandboxes()
	}
	c.wg.Add(2)
	go c.watch(m)
	go c.followCancels()
	log.Info("cluster: joined", "node", id, "tier", tier, "capacity", c.node.Capacity, "images", images[1:], "addr", addr)
	return c, nil
}

func (c *clusterNode) hooks() cluster.Hooks {
	return cluster.Hooks{Run: c.run, NodeDead: c.nodeDead, Schedule: c.schedule}
}

// current is the node's membership: nil while it joins.
func (c *clusterNode) current() (*cluster.Member, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.member == nil {
		return nil, unavailablef("this node is still joining the cluster: try again in a moment")
	}
	return c.member, nil
}

// watch joins again when the node loses its lease (its runs were
// stopped), until Close.
func (c *clusterNode) watch(m *cluster.Member) {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case <-m.Fenced():
		}
		c.log.Warn("cluster: this node lost its lease (no heartbeat landed in time): its runs were stopped; joining again", "node", c.node.ID)
		c.mu.Lock()
		c.member = nil
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), c.deadAfter())
		if err := m.Close(ctx); err != nil {
			c.log.Warn("cluster: leave", "err", err)
		}
		cancel()
		if m = c.rejoin(); m == nil {
			return
		}
	}
}

// rejoin joins again, retrying with a growing wait; nil once closed.
func (c *clusterNode) rejoin() *cluster.Member {
	for wait := time.Second; ; wait = min(2*wait, rejoinWait) {
		ctx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
		m, err := cluster.Join(ctx, c.pool, c.node, c.hooks(), c.opts)
		cancel()
		if err == nil {
			c.mu.Lock()
			c.member = m
			c.mu.Unlock()
			c.log.Info("cluster: joined again", "node", c.node.ID)
			if c.sbx != nil {
				c.sbx.changed() // sync: it may have been declared dead meanwhile
			}
			return m
		}
		c.log.Warn("cluster: join again", "node", c.node.ID, "err", err, "retry_in", wait)
		select {
		case <-c.stop:
			return nil
		case <-time.After(wait):
		}
	}
}

func (c *clusterNode) deadAfter() time.Duration {
	if c.opts.DeadAfter > 0 {
		return c.opts.DeadAfter
	}
	return 15 * time.Second
}

// Close leaves the cluster: the node takes no more jobs; under
// agents.on_shutdown = "finish" its runs may finish for as long as that
// allows, else they are stopped (they end cancelled). Runs still going
// once it has left are handed to NodeDead (another node ends them).
func (c *clusterNode) Close() error {
	if c.sbx != nil {
		c.sbx.cl.CompareAndSwap(c, nil)
	}
	close(c.stop)
	wait := time.Millisecond
	if c.a.cfg.Agents.OnShutdown == OnShutdownFinish {
		wait = time.Duration(c.a.cfg.Agents.shutdownTimeout())
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c.wg.Wait() // no re-join from now on
	var err error
	if m, cerr := c.current(); cerr == nil {
		err = m.Close(ctx)
	}
	c.pool.Close()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// Nodes lists the cluster's nodes, this one among them.
func (c *clusterNode) Nodes(ctx context.Context) ([]cluster.NodeStatus, error) {
	m, err := c.current()
	if err != nil {
		return nil, err
	}
	return m.Nodes(ctx)
}

// runQuit bounds how long a run stopped by the cluster (the node leaves
// or lost its lease) may take to end once cancelled: the cluster wants
// the Run hook back within a third of DeadAfter.
func (c *clusterNode) runQuit() time.Duration { return c.deadAfter() / 3 }

// run is the Run hook: it runs a queued execution here and returns when
// it has ended. A job that cannot run here ends its execution
// interrupted, saying why, unless the execution is not a pending one
// (then it is none of this job's business and is left as it is).
func (c *clusterNode) run(ctx context.Context, as cluster.Assignment) error {
	q, err := decodeJob(as.Payload)
	if err == nil {
		var done <-chan outcome
		if done, err = c.a.startQueued(as.Execution, q); err == nil {
			return c.waitRun(ctx, as.Execution, done)
		}
	}
	if errors.Is(err, agents.ErrNotPending) || errors.Is(err, store.ErrNotFound) {
		c.log.Warn("cluster: job refused", "execution", as.Execution, "err", err)
		return err
	}
	why := fmt.Sprintf("node %s could not run it: %v", c.node.ID, err)
	if gerr := c.a.endElsewhere(context.WithoutCancel(ctx), as.Execution, why); gerr != nil {
		c.log.Warn("cluster: end refused execution", "execution", as.Execution, "err", gerr)
	}
	return err
}

func (c *clusterNode) waitRun(ctx context.Context, id string, done <-chan outcome) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	c.a.runner.Cancel(id)
	select {
	case <-done:
	case <-time.After(c.runQuit()):
		c.log.Warn("cluster: a stopped run did not end in time; another node ends it", "execution", id)
	}
	return ctx.Err()
}

// nodeDead is the NodeDead hook: the dead node's unfinished executions
// end interrupted, saying so (the agents have no retry policy: none is
// requeued). Their machines went with the node. Idempotent: an ended
// execution is left as it is.
func (c *clusterNode) nodeDead(ctx context.Context, node string, lost []cluster.Assignment) ([]string, error) {
	why := fmt.Sprintf("node %s stopped heartbeating and was declared dead (no heartbeat for %v): the execution and its machine were lost with it", node, c.deadAfter())
	for _, as := range lost {
		if err := c.a.endElsewhere(ctx, as.Execution, why); err != nil {
			return nil, err
		}
	}
	if len(lost) > 0 {
		c.log.Warn("cluster: node declared dead; its unfinished executions end interrupted (one still running here ends by itself)", "node", node, "executions", len(lost))
	}
	return nil, nil
}

// dispatch records a task's execution (record), queues it for a node
// with room (queue: its image, or a node's own) and returns it pending,
// with a channel that delivers its end as the store sees it. An
// execution recorded but not queued ends interrupted, saying why.
func (c *clusterNode) dispatch(ctx context.Context, record func(context.Context) (store.Execution, agents.Queued, error), queue string) (store.Execution, <-chan outcome, error) {
	e, q, err := record(ctx)
	if err != nil {
		return store.Execution{}, nil, err
	}
	payload, err := encodeJob(q)
	var m *cluster.Member
	if err == nil {
		m, err = c.current()
	}
	if err == nil {
		err = m.Enqueue(ctx, cluster.Job{Execution: e.ID, Image: queue, Payload: payload})
	}
	if err != nil {
		if gerr := c.a.endElsewhere(context.WithoutCancel(ctx), e.ID, fmt.Sprintf("it could not be queued: %v", err)); gerr != nil {
			c.log.Warn("cluster: end unqueued execution", "execution", e.ID, "err", gerr)
		}
		if errors.Is(err, cluster.ErrNoNode) {
			return store.Execution{}, nil, unavailablef("no live node of the cluster has %s: build the image on a node, or start the node that ran the session ('hearth cluster nodes' lists them)", queue)
		}
		return store.Execution{}, nil, err
	}
	return e, c.a.watchEnd(e.ID), nil
}

// queueOf is where a task runs: a new one on any node with its agent's
// image; a resume or retry of session on the node that ran the session
// last, since its files are there.
func (c *clusterNode) queueOf(ctx context.Context, image, session string) (string, error) {
	if session == "" {
		return image, nil
	}
	sess, err := c.a.store.GetSession(ctx, session)
	if err != nil {
		return "", err
	}
	if sess.LastExecution == "" {
		return nodeQueue(c.node.ID), nil // a branch made here, not run yet
	}
	last, err := c.a.store.GetExecution(ctx, sess.LastExecution)
	if err != nil {
		return "", err
	}
	if ws, err := c.workspaceOf(ctx, last.Node); err != nil {
		return "", err
	} else if ws != "" {
		return sharedQueue(ws, image), nil
	}
	return nodeQueue(last.Node), nil
}

// workspaceOf is the shared workspace node works in, as it listed when it
// last joined (dead or alive: its sessions' files outlive it there), ""
// when its workspace is its own or the node is unknown.
func (c *clusterNode) workspaceOf(ctx context.Context, node string) (string, error) {
	m, err := c.current()
	if err != nil {
		return "", err
	}
	nodes, err := m.Nodes(ctx)
	if err != nil {
		return "", fmt.Errorf("cluster: list nodes: %w", err)
	}
	for _, n := range nodes {
		if n.ID == node {
			return sharedWorkspace(n.Node), nil
		}
	}
	return "", nil
}

// cancelChannel is the PostgreSQL notification channel on which a node
// asks the node running an execution to cancel it.
const cancelChannel = "hearth_cancel"

// requestCancel asks whichever node runs execution id to cancel it. A
// notification is not kept for a node that does not listen at that
// moment, so the canceller asks again until the execution has ended.
func (c *clusterNode) requestCancel(ctx context.Context, id string) error {
	_, err := c.pool.Exec(ctx, "SELECT pg_notify($1, $2)", cancelChannel, id)
	return err
}

// followCancels cancels the executions running here that another node's
// API was asked to cancel, listening again after a lost connection.
func (c *clusterNode) followCancels() {
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-c.stop; cancel() }()
	for wait := 100 * time.Millisecond; ctx.Err() == nil; wait = min(2*wait, 2*time.Second) {
		if err := c.listenCancels(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("cluster: follow cancel requests", "err", err, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

func (c *clusterNode) listenCancels(ctx context.Context) error {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+cancelChannel); err != nil {
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Exec(uctx, "UNLISTEN "+cancelChannel) // else a pooled conn keeps listening
	}()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if _, running := c.a.liveDone(n.Payload); running {
			c.log.Info("cluster: cancel asked through another node", "execution", n.Payload)
			c.a.runner.Cancel(n.Payload)
		}
	}
}

// openCluster joins the cluster when [cluster] names a database and
// agents can run here (a node that cannot run them does not join: its
// API refuses tasks, saying why). It comes before the scheduler, whose
// runs it fires, and leaves after it.
func (d *Daemon) openCluster(ctx context.Context) error {
	if d.cfg.Cluster.Database == "" {
		return nil
	}
	if d.agents.runner == nil {
		d.log.Warn("cluster: agents are unavailable here, so this daemon does not join the cluster", "err", d.agents.unavailable)
		return nil
	}
	addr := ""
	if d.tcpLn != nil {
		addr = d.tcpLn.Addr().String()
	}
	jctx, cancel := context.WithTimeout(ctx, storeOpenTimeout)
	defer cancel()
	c, err := joinCluster(jctx, d.cfg, d.agents, d.sbx, d.tier.Tier, addr, d.wsID, d.log)
	if err != nil {
		return err
	}
	d.undo.push("cluster", c.Close)
	return nil
}

// warnOnly passes on warnings and errors only: River logs its routine
// (job counts every few seconds) at info.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(as []slog.Attr) slog.Handler { return warnOnly{h.Handler.WithAttrs(as)} }
func (h warnOnly) WithGroup(g string) slog.Handler       { return warnOnly{h.Handler.WithGroup(g)} }

// ClusterNode is a node as GET /v1/cluster/nodes lists it.
type ClusterNode struct {
	cluster.NodeStatus
	Workspace string // the shared workspace it works in; "" its own
	Self      bool   // the daemon asked
}

// ClusterNodes lists the nodes of the cluster this daemon is in, without
// the per-node and per-workspace queues among their images; unavailable
// on a single host.
func (d *Daemon) ClusterNodes(ctx context.Context) ([]ClusterNode, error) {
	c := d.agents.cluster
	if c == nil {
		if d.cfg.Cluster.Database == "" {
			return nil, unavailablef("this daemon is not in a cluster: set [cluster] database to make it a node")
		}
		return nil, unavailablef("this daemon did not join its cluster: agents cannot run here (%v)", d.agents.unavailable)
	}
	list, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]ClusterNode, 0, len(list))
	for _, n := range list {
		ws := sharedWorkspace(n.Node)
		n.Images = slices.DeleteFunc(slices.Clone(n.Images), func(im string) bool {
			return strings.HasPrefix(im, "node:") || strings.HasPrefix(im, "ws:")
		})
		out = append(out, ClusterNode{NodeStatus: n, Workspace: ws, Self: n.ID == c.node.ID})
	}
	return out, nil
}
