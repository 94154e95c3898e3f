package appliance

import (
	"context"
	"maps"
	"strings"
	"testing"

	"hearth/fs"
)

// TestSandboxFork: forks start with the source's files, outside and in
// its session, and its image, limits and labels; from then on every
// sandbox's writes are its own, the source runs on with its processes,
// and no process is carried over, nor /tmp (a tmpfs: memory).
func TestSandboxFork(t *testing.T) {
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	src, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "src", Session: "s1", Owner: "me", Env: map[string]string{"FOO": "bar"},
		Memory: 256 << 20, IdleTimeout: "0"})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, c, "src", "echo layer > /home/agent/l && echo ws > /workspace/agents/s1/outputs/w && echo mem > /tmp/m")
	if _, err := c.StartJob(ctx, "src", JobRequest{Argv: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	res, err := c.ForkSandbox(ctx, "src", 2)
	if err != nil || len(res.Sandboxes) != 2 {
		t.Fatalf("ForkSandbox(src, 2) = %+v, %v", res, err)
	}
	t.Logf("reflinked: %v", res.Reflinked)
	for _, f := range res.Sandboxes {
		if f.ForkedFrom != "src" || f.Owner != "me" || f.Memory != src.Memory || f.Disk != src.Disk || f.ImageHash != src.ImageHash ||
			!maps.Equal(f.Env, src.Env) || f.IdleTimeout != src.IdleTimeout || f.Status != "running" || f.Session == "" || f.Session == "s1" {
			t.Errorf("fork %+v: want src's image, limits and labels, forked_from src, a session of its own", f)
		}
		if got, err := c.Sandbox(ctx, f.Id); err != nil || got.ForkedFrom != "src" {
			t.Errorf("GetSandbox(%s).ForkedFrom = %q, %v; want src", f.Id, got.ForkedFrom, err)
		}
		ws := "/workspace/agents/" + f.Session + "/outputs/"
		if got := mustRun(t, c, f.Id, "cat /home/agent/l "+ws+"w; echo $FOO; ls -A /tmp"); got != "layer\nws\nbar\n" {
			t.Errorf("fork %s sees %q, want the source's files and env, and an empty /tmp", f.Id, got)
		}
		if jobs, err := c.Jobs(ctx, f.Id); err != nil || len(jobs) != 0 {
			t.Errorf("jobs of fork %s = %+v, %v; want none (processes are not carried over)", f.Id, jobs, err)
		}
		mustRun(t, c, f.Id, "echo "+f.Id+" > /home/agent/own && echo "+f.Id+" > "+ws+"own")
	}
	mustRun(t, c, "src", "echo later > /home/agent/later && echo later > /workspace/agents/s1/outputs/later")
	for _, f := range res.Sandboxes {
		ws := "/workspace/agents/" + f.Session + "/outputs/"
		if got := mustRun(t, c, f.Id, "cat /home/agent/own "+ws+"own; ls /home/agent/later "+ws+"later 2>/dev/null; true"); got != f.Id+"\n"+f.Id+"\n" {
			t.Errorf("fork %s sees %q: want its own writes only", f.Id, got)
		}
	}
	if got := mustRun(t, c, "src", "ls /home/agent/own /workspace/agents/s1/outputs/own 2>/dev/null; cat /home/agent/later"); got != "later\n" {
		t.Errorf("source sees %q: want none of the forks' writes", got)
	}
	if sb, err := c.Sandbox(ctx, "src"); err != nil || sb.Status != "running" {
		t.Errorf("source after fork = %+v, %v; want running", sb, err)
	}
	if jobs, err := c.Jobs(ctx, "src"); err != nil || len(jobs) != 1 || jobs[0].State != "running" {
		t.Errorf("source's jobs after fork = %+v, %v; want its sleep still running", jobs, err)
	}
}

// TestHostileSandboxFork: a fork request for what is not a sandbox of
// the caller's API (an execution's machine, a destroyed sandbox, a bad
// id), or for too many forks, is refused at the door and makes nothing;
// a paused source stays paused.
func TestHostileSandboxFork(t *testing.T) {
	cfg := sandboxConfig(t)
	d, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "victim", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{-1, 17, 1 << 30} {
		_, err := c.ForkSandbox(ctx, "victim", n)
		wantCode(t, err, "bad_request", 400)
	}
	_, err := c.ForkSandbox(ctx, "exec-abc", 1)
	wantCode(t, err, "not_found", 404)
	_, err = c.ForkSandbox(ctx, "../victim", 1)
	if err == nil {
		t.Fatal("ForkSandbox(../victim) = nil error")
	}
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "gone"}); err != nil {
		t.Fatal(err)
	}
	if err := c.DestroySandbox(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	_, err = c.ForkSandbox(ctx, "gone", 1)
	wantCode(t, err, "not_found", 404)
	if n := len(d.sbx.list()); n != 1 {
		t.Errorf("%d sandboxes after refused forks, want 1", n)
	}
	if _, err := c.PauseSandbox(ctx, "victim"); err != nil {
		t.Fatal(err)
	}
	res, err := c.ForkSandbox(ctx, "victim", 1)
	if err != nil {
		t.Fatal(err)
	}
	if sb, _ := c.Sandbox(ctx, "victim"); sb.Status != "paused" {
		t.Errorf("paused source after fork is %s, want paused", sb.Status)
	}
	if got := mustRun(t, c, res.Sandboxes[0].Id, "echo ok"); got != "ok\n" {
		t.Errorf("fork of a paused source: %q", got)
	}
}

func mustRun(t *testing.T, c *Client, id, script string) string {
	t.Helper()
	out, st := run(t, c, id, script)
	if st.Code != 0 {
		t.Fatalf("%q in %s: exit %d: %s", script, id, st.Code, out)
	}
	return out
}

func TestForkSessionID(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, tc := range []struct{ session, fork, want string }{
		{"s1", "sbx-abc123", "s1-sbx-abc123"},
		{long, "sbx-abc123", strings.Repeat("a", 52) + "-sbx-abc123"},
	} {
		got := forkSessionID(tc.session, tc.fork)
		if got != tc.want || fs.ValidateID("session", got) != nil {
			t.Errorf("forkSessionID(%q, %q) = %q, want %q (a valid session id)", tc.session, tc.fork, got, tc.want)
		}
	}
}
