package cluster_test

import (
	"errors"
	"testing"
	"time"

	"hearth/cluster"
)

// TestSandboxesLostWithTheirNode: b's sandboxes are listed on a with
// node b; a cannot overwrite or remove them while b lives; b stopping
// its heartbeats gets them marked lost within DeadAfter plus the reap
// period and the leader's failover; b's own writes do not revive them;
// a removes a lost one; b syncing again is told which it must destroy.
// A node leaving (Close) does not lose its sandboxes.
func TestSandboxesLostWithTheirNode(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	opts := cluster.Options{Heartbeat: 300 * time.Millisecond, DeadAfter: 3 * time.Second, Reap: 500 * time.Millisecond}
	a := join(t, url, cluster.Node{ID: "a", Capacity: 1, Images: []string{"img"}, Addr: "10.0.0.1:7700"}, r, opts)
	b := join(t, url, cluster.Node{ID: "b", Capacity: 1, Images: []string{"img"}, Addr: "10.0.0.2:7700"}, r, opts)
	ctx := bg(t)
	created := time.Now().UTC().Truncate(time.Microsecond)
	for _, id := range []string{"sbx-1", "sbx-2"} {
		if err := b.PutSandbox(ctx, cluster.Sandbox{ID: id, Image: "img", State: "running", Created: created}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := a.Sandbox(ctx, "sbx-1")
	if err != nil || got.Node != "b" || got.Addr != "10.0.0.2:7700" || got.State != "running" || got.NodeDead {
		t.Fatalf("a.Sandbox(sbx-1) = %+v, %v; want on live node b at 10.0.0.2:7700, running", got, err)
	}
	if err := a.PutSandbox(ctx, cluster.Sandbox{ID: "sbx-1", Image: "img", State: "stopped", Created: created}); !errors.Is(err, cluster.ErrSandboxTaken) {
		t.Errorf("a.PutSandbox(b's sbx-1) = %v; want ErrSandboxTaken", err)
	}
	if _, err := a.RemoveSandbox(ctx, "sbx-1"); !errors.Is(err, cluster.ErrSandboxLive) {
		t.Errorf("a.RemoveSandbox(b's sbx-1) = %v; want ErrSandboxLive", err)
	}
	if err := b.PutSandbox(ctx, cluster.Sandbox{ID: "sbx-1", Image: "img", State: cluster.SandboxLost, Created: created}); err == nil {
		t.Errorf("b.PutSandbox(state lost) = nil; want refused")
	}
	if got, _ := a.Sandbox(ctx, "sbx-1"); got.Node != "b" || got.State != "running" {
		t.Fatalf("after a's attempts: %+v; want b's, running", got)
	}

	b.PauseHeartbeats()
	stopped := time.Now()
	r.waitFor(t, failoverBound, "b's sandboxes lost", func() bool {
		list, err := a.Sandboxes(ctx)
		return err == nil && len(list) == 2 && list[0].State == cluster.SandboxLost && list[1].State == cluster.SandboxLost && list[0].NodeDead
	})
	t.Logf("b's sandboxes were lost %v after its last heartbeat", time.Since(stopped).Round(time.Millisecond))
	if err := b.PutSandbox(ctx, cluster.Sandbox{ID: "sbx-2", Image: "img", State: "paused", Created: created}); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Sandbox(ctx, "sbx-2"); got.State != cluster.SandboxLost {
		t.Errorf("b wrote its lost sbx-2: %+v; want it still lost", got)
	}
	if rm, err := a.RemoveSandbox(ctx, "sbx-1"); err != nil || rm.Node != "b" {
		t.Fatalf("a.RemoveSandbox(lost sbx-1) = %+v, %v", rm, err)
	}
	if _, err := a.Sandbox(ctx, "sbx-1"); !errors.Is(err, cluster.ErrSandboxNotFound) {
		t.Errorf("sbx-1 after its removal: %v; want ErrSandboxNotFound", err)
	}
	lost, taken, err := b.SyncSandboxes(ctx, []cluster.Sandbox{{ID: "sbx-2", Image: "img", State: "running", Created: created}}, nil)
	if err != nil || len(lost) != 1 || lost[0] != "sbx-2" || len(taken) != 0 {
		t.Errorf("b.SyncSandboxes = lost %v, taken %v, %v; want sbx-2 lost", lost, taken, err)
	}

	// A node leaving keeps its sandboxes' rows as they are.
	c := join(t, url, cluster.Node{ID: "c", Capacity: 1, Images: []string{"img"}}, r, opts)
	if err := c.PutSandbox(ctx, cluster.Sandbox{ID: "sbx-c", Image: "img", State: "paused", Session: "s1", Created: created}); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got, err = a.Sandbox(ctx, "sbx-c")
	if err != nil || got.State != "paused" || !got.NodeDead || got.Session != "s1" {
		t.Errorf("sbx-c after c left: %+v, %v; want paused, on a dead node", got, err)
	}
	if _, err := a.RemoveSandbox(ctx, "sbx-c"); err != nil {
		t.Errorf("a.RemoveSandbox(sbx-c of a node that left) = %v", err)
	}
}

// TestSandboxSyncForgetsStale: a node's rows of sandboxes it no longer
// has are deleted when it syncs; what it has is written.
func TestSandboxSyncForgetsStale(t *testing.T) {
	_, url := startDB(t)
	r := newRecorder()
	a := join(t, url, cluster.Node{ID: "a", Capacity: 1, Images: []string{"img"}}, r, cluster.Options{})
	ctx := bg(t)
	now := time.Now()
	if err := a.PutSandbox(ctx, cluster.Sandbox{ID: "old", Image: "img", State: "running", Created: now}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.SyncSandboxes(ctx, []cluster.Sandbox{{ID: "new", Image: "img", State: "stopped", Created: now}}, nil); err != nil {
		t.Fatal(err)
	}
	list, err := a.Sandboxes(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "new" || list[0].State != "stopped" || list[0].Node != "a" {
		t.Errorf("Sandboxes after sync = %+v, %v; want only new, stopped, on a", list, err)
	}
}
