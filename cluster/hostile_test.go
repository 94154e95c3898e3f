package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hearth/cluster"
)

// TestHostileJobFields: an execution's id, image and payload reach SQL and
// River as data. Ids and images with quotes, SQL and path syntax run like
// any other; a payload of arbitrary bytes (NUL, invalid UTF-8) comes back
// byte for byte; ids PostgreSQL cannot hold or no id needs are refused at
// the door; a dispatch job forged in the database with arguments that are
// no execution is cancelled unrun, and the node goes on.
func TestHostileJobFields(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	hostileImage := `img'); DROP TABLE hearth_cluster_node; --/../../étoile`
	m := join(t, url, cluster.Node{ID: "a", Capacity: 2, Images: []string{hostileImage}}, r, cluster.Options{})
	ctx := bg(t)
	payload := []byte{0, 0xff, 0xfe, '"', '\\', '\n', 'x'}
	exec := `e"'; DELETE FROM river_job; --`
	if err := m.Enqueue(ctx, cluster.Job{Execution: exec, Image: hostileImage, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []cluster.Job{
		{Execution: "e\x00", Image: hostileImage},
		{Execution: "e\xff", Image: hostileImage},
		{Execution: strings.Repeat("e", 513), Image: hostileImage},
		{Execution: "e", Image: ""},
	} {
		if err := m.Enqueue(ctx, bad); !errors.Is(err, cluster.ErrBadJob) {
			t.Errorf("enqueue %q of image %q: %v, want ErrBadJob", bad.Execution, bad.Image, err)
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Forged: the right kind and queue, arguments that name nothing.
	var queue string
	if err := pool.QueryRow(ctx, `SELECT queue FROM river_job WHERE kind = 'hearth_dispatch' LIMIT 1`).Scan(&queue); err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, priority)
		VALUES ('{"execution":"","image":"","attempt":0}', 'hearth_dispatch', 1, $1, 'available', 1)`, queue)
	if err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, 60*time.Second, "the hostile execution to run", func() bool { return ended(r) == 1 })
	var forged string
	for range 100 {
		if err := pool.QueryRow(ctx, `SELECT state FROM river_job WHERE args->>'execution' = ''`).Scan(&forged); err != nil {
			t.Fatal(err)
		}
		if forged == "cancelled" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if forged != "cancelled" {
		t.Errorf("forged job is %s, want cancelled", forged)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.runs) != 1 {
		t.Fatalf("runs: %v, want only the hostile-named execution", r.runs)
	}
	got := r.runs[exec]
	if len(got) != 1 || got[0].a.Image != hostileImage || !bytes.Equal(got[0].a.Payload, payload) {
		t.Errorf("run %+v: want image %q and payload %q back as sent", got, hostileImage, payload)
	}
	nodes, err := m.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Errorf("nodes after hostile names: %v, %v", nodes, err)
	}
}

// TestHostileRequeueAnswer: a NodeDead answer naming an execution that was
// not lost (the hook is the appliance's, but a bug there must not queue
// arbitrary work) fails the declaration as a whole, nothing of it is
// kept, and the next attempt hands the same lost run over again.
func TestHostileRequeueAnswer(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	r.release = make(chan struct{})
	defer close(r.release)
	hooks := r.hooks()
	var mu sync.Mutex
	calls := 0
	hooks.NodeDead = func(ctx context.Context, node string, lost []cluster.Assignment) ([]string, error) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			return []string{"not-lost"}, nil
		}
		return r.nodeDead(ctx, node, lost)
	}
	n := cluster.Node{ID: "a", Capacity: 1, Images: []string{"img"}}
	opts := cluster.Options{DeadAfter: time.Minute}
	m := joinWith(t, url, n, r, hooks, opts)
	ctx := bg(t)
	if err := m.Enqueue(ctx, cluster.Job{Execution: "e1", Image: "img"}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, 60*time.Second, "e1 running", func() bool { return len(r.runs) == 1 })
	m.Crash()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := cluster.Join(ctx, pool, n, hooks, opts); !errors.Is(err, cluster.ErrBadJob) {
		t.Fatalf("rejoin with a bad NodeDead answer: %v, want ErrBadJob", err)
	}
	var requeued int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE args->>'execution' = 'not-lost'`).Scan(&requeued); err != nil || requeued != 0 {
		t.Errorf("jobs for the execution never lost: %d, %v", requeued, err)
	}
	joinWith(t, url, n, r, hooks, opts)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead["a"] != 1 || len(r.lost["a"]) != 1 || r.lost["a"][0].Execution != "e1" || r.lost["a"][0].Image != "img" {
		t.Errorf("NodeDead calls %v, lost %+v: want e1 handed over on the second try", r.dead, r.lost)
	}
}
