package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hearth/cluster"
)

// TestDeadNodeHandledOnce stops one of three nodes in the middle of a run,
// as kill -9 would (crash) or as a network partition from the database
// would (partition: its process goes on). It must be declared dead once,
// within DeadAfter plus the reap period plus River's leader failover, its
// unfinished run handed to NodeDead and requeued elsewhere only after the
// first attempt stopped, while the other nodes' runs go on and end well.
func TestDeadNodeHandledOnce(t *testing.T) {
	// The leader killed for real (no resignation) is TestKilledLeaderProcess.
	for _, how := range []string{"crash", "partition"} {
		t.Run(how, func(t *testing.T) { testDeadNode(t, how) })
	}
}

// failoverBound is River's leader re-election when the dead node led (its
// elect interval, 5s, plus padding), with room for a loaded machine.
const failoverBound = 30 * time.Second

func testDeadNode(t *testing.T, how string) {
	_, url := startDB(t)
	r := newRecorder()
	r.release = make(chan struct{})
	r.requeue = true
	deadAfter := 4 * time.Second
	opts := cluster.Options{Heartbeat: 300 * time.Millisecond, DeadAfter: deadAfter, Reap: 500 * time.Millisecond}
	members := map[string]*cluster.Member{}
	for _, id := range []string{"a", "b", "c"} {
		members[id] = join(t, url, cluster.Node{ID: id, Capacity: 1, Images: []string{"img"}}, r, opts)
	}
	ctx := bg(t)
	for _, e := range []string{"e1", "e2", "e3"} {
		if err := members["a"].Enqueue(ctx, cluster.Job{Execution: e, Image: "img"}); err != nil {
			t.Fatal(err)
		}
	}
	r.waitFor(t, 60*time.Second, "3 runs going, one per node", func() bool { return len(r.runs) == 3 })
	dead := "b"
	var victim string
	r.mu.Lock()
	for e, runs := range r.runs {
		if runs[0].a.Node == dead {
			victim = e
		}
	}
	r.mu.Unlock()
	stopped := time.Now()
	switch how {
	case "crash":
		members[dead].Crash()
	case "partition":
		members[dead].PauseHeartbeats()
	}
	r.waitFor(t, deadAfter+failoverBound, "node "+dead+" declared dead", func() bool { return r.dead[dead] > 0 })
	r.mu.Lock()
	took := r.deadAt[dead].Sub(stopped)
	r.mu.Unlock()
	t.Logf("node %s declared dead %v after it stopped (DeadAfter %v)", dead, took.Round(time.Millisecond), deadAfter)
	if took < deadAfter*2/3 {
		t.Errorf("node %s declared dead after %v, before its lease could end", dead, took)
	}
	if how == "partition" {
		select {
		case <-members[dead].Fenced():
		default:
			t.Error("the partitioned node did not fence itself")
		}
	}
	close(r.release) // the survivors' runs end, making room for the requeued one
	r.waitFor(t, 60*time.Second, "e1..e3 to end well", func() bool { return ended(r) == 3 })

	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.dead) != 1 || r.dead[dead] != 1 {
		t.Errorf("NodeDead calls %v, want %s once", r.dead, dead)
	}
	if lost := r.lost[dead]; len(lost) != 1 || lost[0].Execution != victim || lost[0].Attempt != 1 {
		t.Errorf("lost on %s: %+v, want %s attempt 1", dead, lost, victim)
	}
	runs := r.runs[victim]
	if len(runs) != 2 || runs[0].err == nil || runs[1].err != nil || runs[1].a.Attempt != 2 || runs[1].a.Node == dead {
		t.Fatalf("runs of %s: %+v, want a stopped first attempt on %s and a second that ended well elsewhere", victim, runs, dead)
	}
	if runs[0].returned.IsZero() || !runs[0].returned.Before(runs[1].started) {
		t.Errorf("%s ran on two nodes at once: first returned %v, second started %v", victim, runs[0].returned, runs[1].started)
	}
	for e, rs := range r.runs {
		if e != victim && (len(rs) != 1 || rs[0].err != nil) {
			t.Errorf("%s on a survivor: %+v, want one run that ended well", e, rs)
		}
	}
	nodes, err := members["a"].Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if (n.ID == dead) == n.Dead.IsZero() {
			t.Errorf("node %s: dead at %v", n.ID, n.Dead)
		}
	}
}

// TestRestartedNodeHandsOverItsOldRuns: a node that crashed and joined
// again before it was declared dead has its old incarnation's runs handed
// to NodeDead at once, not forgotten.
func TestRestartedNodeHandsOverItsOldRuns(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	r.release = make(chan struct{})
	opts := cluster.Options{Heartbeat: 300 * time.Millisecond, DeadAfter: time.Minute}
	m := join(t, url, cluster.Node{ID: "a", Capacity: 1, Images: []string{"img"}}, r, opts)
	ctx := bg(t)
	if err := m.Enqueue(ctx, cluster.Job{Execution: "e1", Image: "img"}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, 60*time.Second, "e1 running", func() bool { return len(r.runs) == 1 })
	m.Crash()
	join(t, url, cluster.Node{ID: "a", Capacity: 1, Images: []string{"img"}}, r, opts)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead["a"] != 1 || len(r.lost["a"]) != 1 || r.lost["a"][0].Execution != "e1" {
		t.Errorf("NodeDead calls %v, lost %+v: want a's old run of e1 handed over on rejoin", r.dead, r.lost)
	}
	close(r.release)
}

// TestCloseHandsOverUnfinishedRuns: a node leaving while a run goes on
// past Close's bound stops the run and hands it to NodeDead.
func TestCloseHandsOverUnfinishedRuns(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	r.release = make(chan struct{})
	defer close(r.release)
	m := join(t, url, cluster.Node{ID: "a", Capacity: 1, Images: []string{"img"}}, r, cluster.Options{Heartbeat: 300 * time.Millisecond, DeadAfter: 3 * time.Second})
	ctx := bg(t)
	if err := m.Enqueue(ctx, cluster.Job{Execution: "e1", Image: "img"}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, 60*time.Second, "e1 running", func() bool { return len(r.runs) == 1 })
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := m.Close(short); err == nil {
		t.Error("Close returned no error though a run outlived its bound")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead["a"] != 1 || len(r.lost["a"]) != 1 || r.lost["a"][0].Execution != "e1" {
		t.Errorf("NodeDead calls %v, lost %+v: want e1 handed over on leave", r.dead, r.lost)
	}
	if runs := r.runs["e1"]; runs[0].returned.IsZero() || runs[0].err == nil {
		t.Errorf("e1's run was not stopped: %+v", runs)
	}
}

// leader is the node whose River client leads, from River's own table.
func leader(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var id string
	for ctx.Err() == nil {
		if err := pool.QueryRow(ctx, `SELECT leader_id FROM river_leader`).Scan(&id); err == nil {
			node, _, _ := strings.Cut(id, "-")
			return node
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no River leader elected in 30s")
	return ""
}
