package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/appliance/appliancetest"
	"hearth/client"
	"hearth/internal/pgtest"
)

// clusterDaemons starts one daemon per node id on one PostgreSQL
// database, each with its own state directory, jail tier and scripted
// model server (the same script), credits on.
func clusterDaemons(t *testing.T, script modeltest.Config, capacity map[string]int) (map[string]*agentEnv, string) {
	t.Helper()
	_, dbURL := pgtest.Start(t, pgtest.Options{})
	envs := map[string]*agentEnv{}
	for _, id := range []string{"node-a", "node-b", "node-c"} {
		if capacity[id] == 0 {
			continue
		}
		envs[id] = startAgentDaemon(t, script, func(cfg *Config) {
			cfg.Credits.Enabled = true
			cfg.Cluster = ClusterConfig{Database: dbURL, Node: id, Capacity: capacity[id], DeadAfter: Duration(4 * time.Second)}
		})
	}
	return envs, dbURL
}

// TestClusterDispatch: tasks started through node A's API are queued and
// run on A and B (A takes one at a time), each adopted by the node that
// ran it; every one completes with exactly what the script metered, and
// the shared ledger holds the exact sum. A resume runs on the node that
// ran its session.
func TestClusterDispatch(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("sleep 2", modeltest.Usage{InputTokens: 2000, OutputTokens: 50}),
		textTurn("done"),
	}}
	envs, _ := clusterDaemons(t, script, map[string]int{"node-a": 1, "node-b": 2})
	a := envs["node-a"]
	ctx := context.Background()
	if _, err := a.c.AddCredits(ctx, 10, "cluster budget"); err != nil {
		t.Fatal(err)
	}
	const tasks = 4
	ids := make([]string, tasks)
	var wg sync.WaitGroup
	errs := make(chan error, tasks)
	for i := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := a.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: fmt.Sprintf("task %d", i), Limits: Limits{Usd: 1}, Wait: true})
			if err == nil && e.Status != "completed" {
				err = fmt.Errorf("task %d ended %s: %s", i, e.Status, e.Error)
			}
			ids[i] = e.Id
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ran := map[string]int{}
	var sum float64
	for _, id := range ids {
		e, err := a.d.agents.store.GetExecution(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		ran[e.Node]++
		sum += e.USD
		// Two calls: 2000+1000 input tokens, 50+100 output.
		if e.Tokens.Input != 3000 || e.Tokens.Output != 150 || e.Turns != 2 || e.USD <= 0 {
			t.Errorf("execution %s on %s: %+v tokens, %d turns, $%v; want 3000 in, 150 out, 2 turns", id, e.Node, e.Tokens, e.Turns, e.USD)
		}
	}
	if ran["node-b"] == 0 || ran["node-a"]+ran["node-b"] != tasks {
		t.Errorf("executions ran %v; want all %d, some on node-b", ran, tasks)
	}
	cr, err := envs["node-b"].c.Credits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cr.Reserved != 0 || fmt.Sprintf("%.6f", cr.Spent) != fmt.Sprintf("%.6f", sum) || fmt.Sprintf("%.6f", cr.Available) != fmt.Sprintf("%.6f", 10-sum) {
		t.Errorf("ledger seen from node-b: %+v; want $%.6f spent of 10, none reserved", cr, sum)
	}

	nodes, err := a.c.ClusterNodes(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("ClusterNodes = %+v, %v; want node-a and node-b", nodes, err)
	}
	for i, n := range nodes {
		want := []string{"node-a", "node-b"}[i]
		if n.Id != want || n.Self != (i == 0) || n.Dead || n.Tier != "jail" || n.Capacity != i+1 || !slices.Contains(n.Images, "claude-code") || slices.ContainsFunc(n.Images, func(s string) bool { return strings.HasPrefix(s, "node:") }) {
			t.Errorf("node %d: %+v; want %s alive, jail, capacity %d, its images", i, n, want, i+1)
		}
	}

	// A resume of a session runs where the session ran last.
	first, _ := a.d.agents.store.GetExecution(ctx, ids[0])
	e, err := a.c.Delegate(ctx, DelegateRequest{Session: first.Session, Prompt: "again", Limits: Limits{Usd: 1}, Wait: true})
	if err != nil || e.Status != "completed" {
		t.Fatalf("resume = %+v, %v", e, err)
	}
	if got, _ := a.d.agents.store.GetExecution(ctx, e.Id); got.Node != first.Node || got.Kind != store.Resume {
		t.Errorf("resume ran on %s as %s; want on %s, where session %s ran", got.Node, got.Kind, first.Node, first.Session)
	}
}

// nodeConfigEnv names the config file of a daemon that
// TestClusterNodeProcess runs in a child process of the test.
const nodeConfigEnv = "HEARTH_TEST_NODE_CONFIG"

// TestClusterNodeProcess is not a test: it is the daemon of a cluster
// node that another test runs as a child process, to kill it with SIGKILL.
func TestClusterNodeProcess(t *testing.T) {
	path := os.Getenv(nodeConfigEnv)
	if path == "" {
		t.Skip("the child process of TestClusterKilledNode: runs only as that (" + nodeConfigEnv + " not set)")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(path + ".log")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(logf, nil))); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path+".ready", nil, 0o600)
	select {} // until killed
}

// nodeConfig is the config of another node beside env: its own state
// directory and images, the same agent, model server and database.
func nodeConfig(t *testing.T, env *agentEnv, id string) Config {
	cfg := agentConfig(t)
	appliancetest.LinkImages(t, cfg.StateDir, appliancetest.ClaudeCodeImages(t))
	cfg.Model, cfg.Agents.Grace, cfg.Credits = env.cfg.Model, env.cfg.Agents.Grace, env.cfg.Credits
	cfg.Cluster = env.cfg.Cluster
	cfg.Cluster.Node = id
	os.MkdirAll(cfg.AgentsDir(), 0o755)
	if err := os.WriteFile(filepath.Join(cfg.AgentsDir(), "analyst.toml"), []byte(analystTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startNodeProcess runs a daemon on cfg in a child process and returns
// once it serves.
func startNodeProcess(t *testing.T, cfg Config) *exec.Cmd {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "node.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestClusterNodeProcess$", "-test.count", "1")
	cmd.Env = append(os.Environ(), nodeConfigEnv+"="+path)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if log, err := os.ReadFile(path + ".log"); err == nil {
			t.Logf("the child node's log:\n%s", log)
		}
		unmountUnder(filepath.Dir(cfg.StateDir)) // a killed daemon's FUSE mounts, if no daemon cleaned them up
	})
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(path + ".ready"); err == nil {
			return cmd
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			t.Fatalf("the child node did not start within 2 minutes")
		}
	}
}

// waitExecution polls the store until ok(execution) or the deadline.
func waitExecution(t *testing.T, st *store.Store, id string, within time.Duration, ok func(store.Execution) bool) store.Execution {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		e, err := st.GetExecution(context.Background(), id)
		if err == nil && ok(e) {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s after %v: %+v, %v", id, within, e, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterKilledNode: node B, a daemon in its own process running one
// of two tasks started through A, is killed with SIGKILL: its execution
// ends interrupted, saying its node was declared dead, within DeadAfter
// plus the reaper's period (plus River's leader failover when B led),
// while A's task goes on to complete. B started again on its state
// cleans up what it left and joins again.
func TestClusterKilledNode(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("echo busy; sleep 12", modeltest.Usage{InputTokens: 2000, OutputTokens: 50}),
		textTurn("done"),
	}}
	envs, _ := clusterDaemons(t, script, map[string]int{"node-a": 1})
	a := envs["node-a"]
	bcfg := nodeConfig(t, a, "node-b")
	bcfg.Cluster.Capacity = 1
	child := startNodeProcess(t, bcfg)
	ctx := context.Background()
	if _, err := a.c.AddCredits(ctx, 10, "cluster budget"); err != nil {
		t.Fatal(err)
	}
	ids := startTasks(t, a.c, 2)
	st := a.d.agents.store
	onNode := map[string]string{}
	for _, id := range ids {
		e := waitExecution(t, st, id, time.Minute, func(e store.Execution) bool { return e.Status == store.Running })
		onNode[e.Node] = id
	}
	victim, other := onNode["node-b"], onNode["node-a"]
	if victim == "" || other == "" {
		t.Fatalf("executions by node: %v; want one on each (capacity 1 each)", onNode)
	}
	time.Sleep(time.Second) // the agent is at work
	child.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	e := waitExecution(t, st, victim, time.Minute, func(e store.Execution) bool { return e.Status.Terminal() })
	t.Logf("the killed node's execution ended %s %v after the kill: %s", e.Status, time.Since(killed).Round(time.Millisecond), e.Error)
	if e.Status != store.Interrupted || !strings.Contains(e.Error, "node-b") || !strings.Contains(e.Error, "declared dead") {
		t.Errorf("the killed node's execution: %s %q; want interrupted, saying node-b was declared dead", e.Status, e.Error)
	}
	if cr, err := a.c.Credits(ctx); err != nil || cr.Reserved > 1.0001 {
		t.Errorf("credits after the death: %+v, %v; want the dead run's reservation released", cr, err)
	}
	e = waitExecution(t, st, other, time.Minute, func(e store.Execution) bool { return e.Status.Terminal() })
	if e.Status != store.Completed || e.Turns != 2 {
		t.Errorf("node-a's execution ended %s after %d turns: %s; want completed, 2 turns", e.Status, e.Turns, e.Error)
	}
	child.Wait()
	startSandboxDaemon(t, bcfg) // cleans up the machine and views it left, and joins again
}

// TestClusterScheduleFiresOnce: an agent's "@every 1m" schedule, which
// each of two nodes' schedulers keeps, starts one execution per due time
// across the cluster, not one per node; each node's history records each
// due time, fired by it or by the other.
func TestClusterScheduleFiresOnce(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{textTurn("done")}}
	_, dbURL := pgtest.Start(t, pgtest.Options{})
	var envs []*agentEnv
	for _, id := range []string{"node-a", "node-b"} {
		envs = append(envs, startAgentDaemon(t, script, func(cfg *Config) {
			cfg.Cluster = ClusterConfig{Database: dbURL, Node: id, DeadAfter: Duration(4 * time.Second)}
			ticker := "schedule = \"@every 1m\"\n" + analystTOML
			if err := os.WriteFile(filepath.Join(cfg.AgentsDir(), "ticker.toml"), []byte(ticker), 0o644); err != nil {
				t.Fatal(err)
			}
		}))
	}
	// Two due times: the next two whole minutes, and a little for the
	// runs to be queued.
	first := time.Now().Truncate(time.Minute).Add(time.Minute)
	second := first.Add(time.Minute)
	time.Sleep(time.Until(second.Add(10 * time.Second)))
	st := envs[0].d.agents.store
	all, err := st.ListExecutions(context.Background(), store.ExecutionFilter{Agent: "ticker", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var list []store.Execution // those of the two due times (one may have passed as the nodes started)
	for _, e := range all {
		if !e.Created.Before(first) {
			list = append(list, e)
		}
	}
	if len(list) != 2 {
		t.Fatalf("%d executions of the scheduled agent from %v to %v; want 2, one per due time", len(list), first, second)
	}
	for _, env := range envs {
		runs, err := env.d.sched.Runs(context.Background(), "agent-ticker", 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range runs {
			if r.Scheduled.Equal(first) || r.Scheduled.Equal(second) {
				n++
				if !strings.HasPrefix(r.Result, "fired") || r.Err != "" {
					t.Errorf("run %+v: want fired by this node or another", r)
				}
			}
		}
		if n != 2 {
			t.Errorf("node's schedule history: %+v; want a run due at %v and one at %v", runs, first, second)
		}
	}
	for _, e := range list {
		waitExecution(t, st, e.ID, time.Minute, func(e store.Execution) bool { return e.Status == store.Completed })
	}
}

// TestClusterNodesSingleHost: a daemon without [cluster] runs as ever (no
// River, tasks run in the daemon) and answers GET /v1/cluster/nodes 503,
// saying how to make it a node.
func TestClusterNodesSingleHost(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{textTurn("done")}}, nil)
	if env.d.agents.cluster != nil {
		t.Fatal("a daemon without [cluster] joined a cluster")
	}
	_, err := env.c.ClusterNodes(context.Background())
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(err.Error(), "[cluster] database") {
		t.Errorf("ClusterNodes on a single host: %v; want 503 saying to set [cluster] database", err)
	}
}

// TestClusterImageElsewhere: a node that has not built the agent's image
// takes the task through its API all the same and it runs on a node
// that has.
func TestClusterImageElsewhere(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{textTurn("done")}}
	_, dbURL := pgtest.Start(t, pgtest.Options{})
	var envs []*agentEnv
	for _, id := range []string{"node-a", "node-b"} {
		envs = append(envs, startAgentDaemon(t, script, func(cfg *Config) {
			cfg.Cluster = ClusterConfig{Database: dbURL, Node: id, DeadAfter: Duration(4 * time.Second)}
			if id == "node-a" { // no images built here
				images := filepath.Join(cfg.StateDir, "images")
				if err := os.Remove(images); err != nil {
					t.Fatal(err)
				}
				os.Mkdir(images, 0o700)
			}
		}))
	}
	ctx := context.Background()
	e, err := envs[0].c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Wait: true})
	if err != nil || e.Status != "completed" {
		t.Fatalf("task through the node without the image = %+v, %v", e, err)
	}
	if got, _ := envs[0].d.agents.store.GetExecution(ctx, e.Id); got.Node != "node-b" {
		t.Errorf("it ran on %s; want node-b, the node with the image", got.Node)
	}
}

// TestClusterCancelElsewhere: cancelling through one node's API an
// execution another node runs stops it there (it ends cancelled, its
// partial work recorded), and one still queued ends cancelled at once and
// never runs.
func TestClusterCancelElsewhere(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("echo busy; sleep 30", modeltest.Usage{InputTokens: 2000, OutputTokens: 50}),
		textTurn("done"),
	}}
	envs, _ := clusterDaemons(t, script, map[string]int{"node-a": 1, "node-b": 1})
	ctx := context.Background()
	a := envs["node-a"]
	if _, err := a.c.AddCredits(ctx, 10, "budget"); err != nil {
		t.Fatal(err)
	}
	ids := startTasks(t, a.c, 3)
	st := a.d.agents.store
	var running []store.Execution
	queued := ""
	deadline := time.Now().Add(time.Minute)
	for len(running) < 2 && time.Now().Before(deadline) {
		running, queued = nil, ""
		for _, id := range ids {
			e, _ := st.GetExecution(ctx, id)
			switch e.Status {
			case store.Running:
				running = append(running, e)
			case store.Pending:
				queued = id
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(running) != 2 || queued == "" {
		t.Fatalf("after a minute %d running and queued %q; want one running on each node, one queued", len(running), queued)
	}
	got, err := a.c.Cancel(ctx, queued)
	if err != nil || got.Status != "cancelled" {
		t.Errorf("cancel the queued execution = %s, %v; want cancelled", got.Status, err)
	}
	for _, e := range running {
		via := envs["node-a"]
		if e.Node == "node-a" {
			via = envs["node-b"]
		}
		got, err := via.c.Cancel(ctx, e.ID)
		if err != nil || got.Status != "cancelled" {
			t.Errorf("cancel %s's execution through the other node = %s, %v; want cancelled", e.Node, got.Status, err)
		}
	}
	time.Sleep(2 * time.Second) // a node that took the cancelled job would have started it by now
	if e, _ := st.GetExecution(ctx, queued); e.Status != store.Cancelled || !e.Started.IsZero() {
		t.Errorf("the execution cancelled while queued: %s, started %v; want cancelled, never started", e.Status, e.Started)
	}
	if cr, err := a.c.Credits(ctx); err != nil || cr.Reserved != 0 {
		t.Errorf("credits after the cancels: %+v, %v; want none reserved", cr, err)
	}
}

// unmountUnder detaches every mount under dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			points = append(points, f[1])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// TestClusterFencedRejoins: a node whose heartbeats cannot land (its row
// locked away from it, as a database it cannot reach would) loses its
// lease: its run is stopped (it ends cancelled rather than going on while
// another node may be told it died); once the database answers again it
// joins again and runs tasks.
func TestClusterFencedRejoins(t *testing.T) {
	script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("echo busy; sleep 30", modeltest.Usage{InputTokens: 2000, OutputTokens: 50}),
		textTurn("done"),
	}}
	envs, dbURL := clusterDaemons(t, script, map[string]int{"node-a": 1})
	a := envs["node-a"]
	ctx := context.Background()
	if _, err := a.c.AddCredits(ctx, 10, "budget"); err != nil {
		t.Fatal(err)
	}
	e, err := a.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "long", Limits: Limits{Usd: 1}})
	if err != nil {
		t.Fatal(err)
	}
	st := a.d.agents.store
	waitExecution(t, st, e.Id, time.Minute, func(e store.Execution) bool { return e.Status == store.Running })
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE hearth_cluster_node IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	got := waitExecution(t, st, e.Id, time.Minute, func(e store.Execution) bool { return e.Status.Terminal() })
	tx.Rollback(ctx)
	if got.Status != store.Cancelled {
		t.Errorf("the fenced node's run ended %s: %s; want cancelled", got.Status, got.Error)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		nodes, err := a.c.ClusterNodes(ctx)
		if err == nil && len(nodes) == 1 && !nodes[0].Dead && time.Since(nodes[0].LastSeen) < 2*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not join again within a minute: %+v, %v", nodes, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e2, err := a.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "after", Limits: Limits{Usd: 1}})
	if err != nil {
		t.Fatal(err)
	}
	waitExecution(t, st, e2.Id, time.Minute, func(e store.Execution) bool { return e.Status == store.Running })
}

// startTasks starts n tasks of the analyst agent ($1 each) through c and
// returns their executions' ids.
func startTasks(t *testing.T, c *Client, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		e, err := c.Delegate(context.Background(), DelegateRequest{Agent: "analyst", Prompt: fmt.Sprintf("task %d", i), Limits: Limits{Usd: 1}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.Id)
	}
	return ids
}
