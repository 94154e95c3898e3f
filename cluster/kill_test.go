package cluster_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hearth/cluster"
)

const childURLEnv = "HEARTH_CLUSTER_CHILD_URL"

// TestKilledLeaderProcess: the node River elected leader runs in a child
// process killed with SIGKILL mid-run, so it neither resigns nor records
// anything. Another node must be elected, declare it dead within
// DeadAfter plus River's leader failover, and requeue its run, which ends
// well on a survivor.
func TestKilledLeaderProcess(t *testing.T) {
	if url := os.Getenv(childURLEnv); url != "" {
		leaderChild(t, url)
		return
	}
	_, url := startDB(t)
	child := exec.Command(os.Args[0], "-test.run", "^TestKilledLeaderProcess$", "-test.timeout", "3m")
	child.Env = append(os.Environ(), childURLEnv+"="+url)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Wait()
	defer child.Process.Kill()
	joined := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "joined" {
				joined <- true
			}
		}
		joined <- false
	}()
	select {
	case ok := <-joined:
		if !ok {
			t.Fatal("the child process ended before it joined")
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the child process did not join in 90s")
	}
	if l := leader(t, url); l != "b" {
		t.Fatalf("leader is %s, want the child b (it joined first)", l)
	}
	r := newRecorder()
	r.release = make(chan struct{})
	r.requeue = true
	deadAfter := 4 * time.Second
	opts := cluster.Options{Heartbeat: 300 * time.Millisecond, DeadAfter: deadAfter, Reap: 500 * time.Millisecond}
	a := join(t, url, cluster.Node{ID: "a", Capacity: 1, Images: []string{"img"}}, r, opts)
	join(t, url, cluster.Node{ID: "c", Capacity: 1, Images: []string{"img"}}, r, opts)
	ctx := bg(t)
	for _, e := range []string{"e1", "e2", "e3"} {
		if err := a.Enqueue(ctx, cluster.Job{Execution: e, Image: "img"}); err != nil {
			t.Fatal(err)
		}
	}
	r.waitFor(t, 60*time.Second, "a run on each of a and c", func() bool { return len(r.runs) == 2 })
	victim := runningOn(t, ctx, url, "b")
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	r.waitFor(t, deadAfter+failoverBound, "the killed leader declared dead", func() bool { return r.dead["b"] > 0 })
	r.mu.Lock()
	t.Logf("killed leader b declared dead %v after SIGKILL (DeadAfter %v, River's leader TTL 15s)", r.deadAt["b"].Sub(killed).Round(time.Millisecond), deadAfter)
	lost := r.lost["b"]
	r.mu.Unlock()
	if len(lost) != 1 || lost[0].Execution != victim {
		t.Fatalf("lost on b: %+v, want %s", lost, victim)
	}
	close(r.release)
	r.waitFor(t, 60*time.Second, "all three executions to end well", func() bool { return ended(r) == 3 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if runs := r.runs[victim]; len(runs) != 1 || runs[0].a.Attempt != 2 {
		t.Errorf("survivor runs of %s: %+v, want its second attempt once", victim, runs)
	}
}

// runningOn waits for the execution the node runs, from the run table.
func runningOn(t *testing.T, ctx context.Context, url, node string) string {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for range 600 {
		var e string
		if pool.QueryRow(ctx, `SELECT execution FROM hearth_cluster_run WHERE node = $1 AND ended_at IS NULL`, node).Scan(&e) == nil {
			return e
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("node %s ran nothing in 60s", node)
	return ""
}

// leaderChild is node b, in its own process: it joins alone (so River
// elects it), says so, runs whatever it is given until killed.
func leaderChild(t *testing.T, url string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	hooks := cluster.Hooks{
		Run: func(ctx context.Context, a cluster.Assignment) error { <-ctx.Done(); return ctx.Err() },
		NodeDead: func(ctx context.Context, node string, lost []cluster.Assignment) ([]string, error) {
			t.Errorf("the child was asked to handle %s's death", node)
			return nil, nil
		},
		Schedule: func(context.Context, cluster.Fired) error { return nil },
	}
	_, err = cluster.Join(ctx, pool, cluster.Node{ID: "b", Capacity: 1, Images: []string{"img"}}, hooks,
		cluster.Options{Heartbeat: 300 * time.Millisecond, DeadAfter: 4 * time.Second, Reap: 500 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil {
		var id string
		if pool.QueryRow(ctx, `SELECT leader_id FROM river_leader`).Scan(&id) == nil && strings.HasPrefix(id, "b-") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	os.Stdout.WriteString("joined\n")
	<-ctx.Done() // until killed
}
