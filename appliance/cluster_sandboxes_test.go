package appliance

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/client"
)

// sandboxesByID lists the sandboxes c's node sees, by id.
func sandboxesByID(t *testing.T, c *Client) map[string]Sandbox {
	t.Helper()
	list, err := c.Sandboxes(context.Background())
	if err != nil {
		t.Fatalf("Sandboxes: %v", err)
	}
	out := map[string]Sandbox{}
	for _, s := range list {
		out[s.Id] = s
	}
	return out
}

// wantAPIError checks that err is the API's error of status, its
// message containing each of words.
func wantAPIError(t *testing.T, what string, err error, status int, words ...string) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != status {
		t.Errorf("%s = %v; want HTTP %d", what, err, status)
		return
	}
	for _, w := range words {
		if !strings.Contains(ae.Message, w) {
			t.Errorf("%s = %q; want it to name %q", what, ae.Message, w)
		}
	}
}

// TestClusterSandboxesLost: a sandbox on node B (a daemon in its own
// process) is listed on A with node B and B's address, and operations on
// it through A name B; B killed with SIGKILL, A lists it lost within
// dead_after (plus the reaper and River's failover); operations on it
// then say it was lost; rm through A removes it from the record. B
// started again destroys its lost sandboxes (the one removed and the one
// still lost), whose rows stay as the cluster left them.
func TestClusterSandboxesLost(t *testing.T) {
	envs, _ := clusterDaemons(t, modeltest.Config{}, map[string]int{"node-a": 1})
	a := envs["node-a"]
	bcfg := nodeConfig(t, a, "node-b")
	bcfg.Cluster.Capacity = 1
	bcfg.API.TCP = "127.0.0.1:0"
	child := startNodeProcess(t, bcfg)
	bc := NewClient(bcfg.SocketPath())
	ctx := context.Background()
	for _, id := range []string{"box-b", "box-c"} {
		if _, err := bc.CreateSandbox(ctx, CreateSandboxRequest{Id: id, Image: "claude-code", IdleTimeout: "0"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.c.CreateSandbox(ctx, CreateSandboxRequest{Id: "box-a", Image: "claude-code", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	seen := sandboxesByID(t, a.c)
	b := seen["box-b"]
	if b.Node != "node-b" || b.NodeAddr == "" || b.Status != "running" || b.Image != "claude-code" || seen["box-a"].Node != "node-a" || len(seen) != 3 {
		t.Fatalf("A lists %+v; want box-a on node-a, box-b and box-c running on node-b with its address", seen)
	}
	_, err := a.c.Exec(ctx, "box-b", ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
	wantAPIError(t, "exec in box-b through A", err, http.StatusServiceUnavailable, "node-b", b.NodeAddr)

	child.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	for deadline := killed.Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		s := sandboxesByID(t, a.c)
		if s["box-b"].Status == "lost" && s["box-c"].Status == "lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after B's kill A lists %+v; want box-b and box-c lost", s)
		}
	}
	t.Logf("B's sandboxes were listed lost on A %v after its kill (dead_after %v)", time.Since(killed).Round(time.Millisecond), time.Duration(bcfg.Cluster.DeadAfter))
	child.Wait()
	_, err = a.c.PauseSandbox(ctx, "box-b")
	wantAPIError(t, "pause of lost box-b through A", err, http.StatusConflict, "lost", "node-b", "hearth sandboxes rm box-b")
	if err := a.c.DestroySandbox(ctx, "box-b"); err != nil {
		t.Fatalf("rm of lost box-b through A: %v", err)
	}
	if s := sandboxesByID(t, a.c); s["box-b"].Id != "" || s["box-c"].Status != "lost" {
		t.Errorf("after rm of box-b A lists %+v; want box-c lost, no box-b", s)
	}
	err = a.c.DestroySandbox(ctx, "box-b")
	wantAPIError(t, "rm of box-b again", err, http.StatusNotFound)

	bd, bc2 := startSandboxDaemon(t, bcfg) // recovers box-b and box-c, then destroys both
	if bd.sbx.local("box-b") != nil || bd.sbx.local("box-c") != nil {
		t.Errorf("B restarted still has box-b or box-c; want both destroyed")
	}
	s := sandboxesByID(t, bc2)
	if s["box-b"].Id != "" || s["box-c"].Status != "lost" || s["box-c"].Node != "node-b" || s["box-a"].Node != "node-a" {
		t.Errorf("B restarted lists %+v; want box-c lost on node-b, box-a on node-a, no box-b", s)
	}
	if err := bc2.DestroySandbox(ctx, "box-c"); err != nil {
		t.Errorf("rm of lost box-c through B: %v", err)
	}
}

// TestHostileClusterSandboxes: node A's API cannot touch node B's live
// sandbox: destroy, pause, exec and files are refused naming B, and a
// create of its id on A is refused; B's row and machine are unchanged.
func TestHostileClusterSandboxes(t *testing.T) {
	envs, _ := clusterDaemons(t, modeltest.Config{}, map[string]int{"node-a": 1, "node-b": 1})
	a, b := envs["node-a"], envs["node-b"]
	ctx := context.Background()
	if _, err := b.c.CreateSandbox(ctx, CreateSandboxRequest{Id: "box-b", Image: "claude-code", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	err := a.c.DestroySandbox(ctx, "box-b")
	wantAPIError(t, "destroy of B's box-b through A", err, http.StatusServiceUnavailable, "node-b")
	_, err = a.c.PauseSandbox(ctx, "box-b")
	wantAPIError(t, "pause of B's box-b through A", err, http.StatusServiceUnavailable, "node-b")
	_, err = a.c.Exec(ctx, "box-b", ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
	wantAPIError(t, "exec in B's box-b through A", err, http.StatusServiceUnavailable, "node-b")
	_, err = a.c.CreateSandbox(ctx, CreateSandboxRequest{Id: "box-b", Image: "claude-code", IdleTimeout: "0"})
	wantAPIError(t, "create of box-b on A", err, http.StatusConflict, "node-b")
	if a.d.sbx.local("box-b") != nil {
		t.Errorf("A has a box-b after its create was refused")
	}
	s := sandboxesByID(t, a.c)["box-b"]
	if s.Node != "node-b" || s.Status != "running" {
		t.Errorf("box-b as A lists it after the attempts: %+v; want running on node-b", s)
	}
	st, err := b.c.Exec(ctx, "box-b", ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
	if err != nil || st.Code != 0 {
		t.Errorf("exec in box-b through B after A's attempts = %+v, %v; want exit 0", st, err)
	}
}

// TestClusterSandboxStateAndRestart: a pause on B shows on A; B stopped
// and started again (it leaves, it is not declared dead) keeps its
// sandbox, which A lists on B again, never lost.
func TestClusterSandboxStateAndRestart(t *testing.T) {
	envs, _ := clusterDaemons(t, modeltest.Config{}, map[string]int{"node-a": 1, "node-b": 1})
	a, b := envs["node-a"], envs["node-b"]
	ctx := context.Background()
	if _, err := b.c.CreateSandbox(ctx, CreateSandboxRequest{Id: "box-b", Image: "claude-code", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.PauseSandbox(ctx, "box-b"); err != nil {
		t.Fatal(err)
	}
	waitListed(t, a.c, "box-b", "paused")
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	if s := sandboxesByID(t, a.c)["box-b"]; s.Status == "lost" {
		t.Errorf("box-b after B left: %+v; want not lost", s)
	}
	bd, bc := startSandboxDaemon(t, b.cfg)
	if bd.sbx.local("box-b") == nil {
		t.Fatalf("B restarted lost box-b; want it kept")
	}
	if _, err := bc.ResumeSandbox(ctx, "box-b"); err != nil {
		t.Fatal(err)
	}
	waitListed(t, a.c, "box-b", "running")
}

// waitListed waits (a minute at most) until c lists sandbox id with status.
func waitListed(t *testing.T, c *Client, id, status string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		s := sandboxesByID(t, c)[id]
		if string(s.Status) == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is listed %+v after a minute; want %s", id, s, status)
		}
	}
}
