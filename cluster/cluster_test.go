package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hearth/cluster"
	"hearth/internal/pgtest"
)

// recorder is the appliance's side in these tests: it runs executions
// (as long as told), and records everything the cluster asks of it.
type recorder struct {
	mu       sync.Mutex
	runs     map[string][]run // by execution
	running  map[string]int   // by node
	maxRun   map[string]int   // by node
	dead     map[string]int   // NodeDead calls by node
	deadAt   map[string]time.Time
	lost     map[string][]cluster.Assignment
	fired    []cluster.Fired
	changed  chan struct{}
	hold     time.Duration // how long a run lasts unless release is set
	release  chan struct{} // when set, runs last until it is closed or ctx ends
	requeue  bool
	images   map[string][]string // node -> images, to check placement
	problems []string
}

type run struct {
	a                 cluster.Assignment
	started, returned time.Time
	err               error
}

func newRecorder() *recorder {
	return &recorder{runs: map[string][]run{}, running: map[string]int{}, maxRun: map[string]int{},
		dead: map[string]int{}, deadAt: map[string]time.Time{}, lost: map[string][]cluster.Assignment{},
		changed: make(chan struct{}, 1), images: map[string][]string{}}
}

func (r *recorder) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) hooks() cluster.Hooks {
	return cluster.Hooks{Run: r.run, NodeDead: r.nodeDead, Schedule: r.schedule}
}

func (r *recorder) run(ctx context.Context, a cluster.Assignment) error {
	r.mu.Lock()
	i := len(r.runs[a.Execution])
	r.runs[a.Execution] = append(r.runs[a.Execution], run{a: a, started: time.Now()})
	r.running[a.Node]++
	r.maxRun[a.Node] = max(r.maxRun[a.Node], r.running[a.Node])
	ok := false
	for _, im := range r.images[a.Node] {
		ok = ok || im == a.Image
	}
	if !ok {
		r.problems = append(r.problems, fmt.Sprintf("execution %s of image %s ran on %s, which has %v", a.Execution, a.Image, a.Node, r.images[a.Node]))
	}
	release := r.release
	r.mu.Unlock()
	r.poke()
	var err error
	if release != nil {
		select {
		case <-release:
		case <-ctx.Done():
			err = ctx.Err()
		}
	} else {
		select {
		case <-time.After(r.hold):
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	r.mu.Lock()
	r.running[a.Node]--
	r.runs[a.Execution][i].returned = time.Now()
	r.runs[a.Execution][i].err = err
	r.mu.Unlock()
	r.poke()
	return err
}

func (r *recorder) nodeDead(ctx context.Context, node string, lost []cluster.Assignment) ([]string, error) {
	r.mu.Lock()
	defer r.poke()
	defer r.mu.Unlock()
	r.dead[node]++
	r.deadAt[node] = time.Now()
	r.lost[node] = append(r.lost[node], lost...)
	var again []string
	for _, a := range lost {
		if r.requeue {
			again = append(again, a.Execution)
		}
	}
	return again, nil
}

func (r *recorder) schedule(ctx context.Context, f cluster.Fired) error {
	r.mu.Lock()
	r.fired = append(r.fired, f)
	r.mu.Unlock()
	r.poke()
	return nil
}

// waitFor polls cond (under the recorder's lock) until it holds or the
// bound passes.
func (r *recorder) waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(bound)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("waited %v for %s", bound, what)
		}
	}
}

// quietLogger drops River's and the cluster's logs (a database restart
// makes pages of them) unless HEARTH_CLUSTER_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("HEARTH_CLUSTER_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// join makes one cluster member with its own pool, as a separate daemon
// would be, and leaves at cleanup.
func join(t *testing.T, url string, n cluster.Node, r *recorder, opts cluster.Options) *cluster.Member {
	t.Helper()
	return joinWith(t, url, n, r, r.hooks(), opts)
}

func joinWith(t *testing.T, url string, n cluster.Node, r *recorder, hooks cluster.Hooks, opts cluster.Options) *cluster.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.images[n.ID] = n.Images
	r.mu.Unlock()
	opts.Logger = quietLogger()
	m, err := cluster.Join(ctx, pool, n, hooks, opts)
	if err != nil {
		pool.Close()
		t.Fatalf("join %s: %v", n.ID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Logf("close %s: %v", n.ID, err)
		}
		pool.Close()
	})
	return m
}

func startDB(t *testing.T) (*pgtest.Server, string) {
	t.Helper()
	return pgtest.Start(t, pgtest.Options{})
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestDispatchSpreadsByCapacityAndImage: 12 executions of two images over
// three nodes run once each, only where the image is, never more at once
// on a node than its capacity, and every node takes some.
func TestDispatchSpreadsByCapacityAndImage(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	r.hold = 700 * time.Millisecond
	opts := cluster.Options{Heartbeat: 500 * time.Millisecond, DeadAfter: 10 * time.Second}
	a := join(t, url, cluster.Node{ID: "a", Addr: "10.0.0.1:8080", Tier: "jail", Capacity: 2, Images: []string{"img-x"}}, r, opts)
	join(t, url, cluster.Node{ID: "b", Addr: "10.0.0.2:8080", Tier: "jail", Capacity: 3, Images: []string{"img-x", "img-y"}}, r, opts)
	join(t, url, cluster.Node{ID: "c", Addr: "10.0.0.3:8080", Tier: "qemu", Capacity: 1, Images: []string{"img-y"}}, r, opts)
	ctx := bg(t)
	for i := range 12 {
		im := []string{"img-x", "img-y"}[i%2]
		if err := a.Enqueue(ctx, cluster.Job{Execution: fmt.Sprintf("e%02d", i), Image: im, Payload: []byte(`{"n":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	// Enqueueing the same execution again is a no-op.
	if err := a.Enqueue(ctx, cluster.Job{Execution: "e00", Image: "img-x"}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, 90*time.Second, "12 executions to end", func() bool { return ended(r) == 12 })
	r.mu.Lock()
	defer r.mu.Unlock()
	for e, runs := range r.runs {
		if len(runs) != 1 || runs[0].err != nil || runs[0].a.Attempt != 1 {
			t.Errorf("execution %s: runs %+v, want one successful first attempt", e, runs)
		}
	}
	for _, p := range r.problems {
		t.Error(p)
	}
	caps := map[string]int{"a": 2, "b": 3, "c": 1}
	perNode := map[string]int{}
	for _, runs := range r.runs {
		perNode[runs[0].a.Node]++
	}
	for n, c := range caps {
		if r.maxRun[n] > c {
			t.Errorf("node %s ran %d at once, capacity %d", n, r.maxRun[n], c)
		}
		if perNode[n] == 0 {
			t.Errorf("node %s ran nothing: %v", n, perNode)
		}
	}
	t.Logf("executions per node: %v; most at once: %v", perNode, r.maxRun)
	nodes, err := a.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 3 || nodes[2].Tier != "qemu" || nodes[1].Capacity != 3 || !nodes[0].Dead.IsZero() || nodes[0].LastSeen.IsZero() {
		t.Errorf("nodes: %+v", nodes)
	}
}

func ended(r *recorder) int {
	n := 0
	for _, runs := range r.runs {
		for _, x := range runs {
			if !x.returned.IsZero() && x.err == nil {
				n++
			}
		}
	}
	return n
}

// TestBadInputRefusedAtTheDoor: a node or a job the cluster cannot use is
// refused with an error saying what to give.
func TestBadInputRefusedAtTheDoor(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	ctx := bg(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, n := range []cluster.Node{
		{ID: "", Capacity: 1, Images: []string{"x"}},
		{ID: "a b", Capacity: 1, Images: []string{"x"}},
		{ID: "a", Capacity: 0, Images: []string{"x"}},
		{ID: "a", Capacity: 1},
		{ID: "a", Capacity: 1, Images: []string{""}},
	} {
		if _, err := cluster.Join(ctx, pool, n, r.hooks(), cluster.Options{}); !errors.Is(err, cluster.ErrBadNode) {
			t.Errorf("join %+v: %v, want ErrBadNode", n, err)
		}
	}
	m := join(t, url, cluster.Node{ID: "a", Capacity: 1, Images: []string{"x"}}, r, cluster.Options{})
	if err := m.Enqueue(ctx, cluster.Job{Execution: "e", Image: "y"}); !errors.Is(err, cluster.ErrNoNode) {
		t.Errorf("enqueue for an image no node has: %v, want ErrNoNode", err)
	}
	if err := m.Enqueue(ctx, cluster.Job{Image: "x"}); !errors.Is(err, cluster.ErrBadJob) {
		t.Errorf("enqueue without an execution: %v, want ErrBadJob", err)
	}
	if _, err := m.Fire(ctx, "", time.Now(), nil); !errors.Is(err, cluster.ErrBadJob) {
		t.Errorf("fire without a schedule: %v, want ErrBadJob", err)
	}
}
