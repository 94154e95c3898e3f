package appliance

import (
	"context"
	"testing"
	"time"
)

// TestSandboxLongPause: a sandbox paused for longer than the host
// channel's keepalive allows an unanswered ping (30 s, then 10 s) still
// answers at once when resumed, its processes and its agent session
// intact.
func TestSandboxLongPause(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses a sandbox for 45 s")
	}
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "long", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartJob(ctx, "long", JobRequest{Argv: []string{"sh", "-c", "while :; do date +%s >> /tmp/ticks; sleep 1; done"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PauseSandbox(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(45 * time.Second)
	if _, err := c.ResumeSandbox(ctx, "long"); err != nil {
		t.Fatalf("resume after 45 s paused: %v", err)
	}
	if out, st := run(t, c, "long", "echo awake"); out != "awake\n" || st.Code != 0 {
		t.Fatalf("exec after a 45 s pause = %q, %+v", out, st)
	}
	jobs, err := c.Jobs(ctx, "long")
	if err != nil || len(jobs) != 1 || jobs[0].State != "running" {
		t.Fatalf("jobs after a 45 s pause = %+v, %v; want the ticker still running", jobs, err)
	}
}
