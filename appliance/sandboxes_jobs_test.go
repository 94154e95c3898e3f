package appliance

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// waitJob polls until the job has ended.
func waitJob(t *testing.T, c *Client, id, job string) Job {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		j, err := c.Job(context.Background(), id, job)
		if err != nil {
			t.Fatalf("Job(%s) = %v", job, err)
		}
		if j.State != "running" {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still running: %+v", job, j)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func jobOutput(t *testing.T, c *Client, id, job, stream string) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := c.JobOutput(context.Background(), id, job, stream, &b); err != nil {
		t.Fatalf("JobOutput(%s, %s) = %v", job, stream, err)
	}
	return b.String()
}

// TestSandboxJobs: a job outlives the request that started it, its
// output stays readable after it ended, and stop ends it.
func TestSandboxJobs(t *testing.T) {
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "jobs", Env: map[string]string{"FOO": "bar"}, IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	script := "echo out $FOO $A; pwd; echo err >&2; sleep 1; echo done; exit 4"
	j, err := c.StartJob(ctx, "jobs", JobRequest{Argv: []string{"sh", "-c", script}, Env: map[string]string{"A": "1"}, Cwd: "/tmp"})
	if err != nil || j.State != "running" || j.Pid <= 0 || j.Id == "" || j.Exit != nil {
		t.Fatalf("StartJob = %+v, %v", j, err)
	}
	// The request has ended; the job goes on.
	if got, err := c.Job(ctx, "jobs", j.Id); err != nil || got.State != "running" {
		t.Errorf("right after the start: %+v, %v; want running", got, err)
	}
	ended := waitJob(t, c, "jobs", j.Id)
	if ended.State != "failed" || ended.Exit == nil || ended.Exit.Code != 4 || ended.Ended == nil {
		t.Errorf("ended job = %+v, want failed with exit 4", ended)
	}
	if got := jobOutput(t, c, "jobs", j.Id, "stdout"); got != "out bar 1\n/tmp\ndone\n" {
		t.Errorf("stdout = %q", got)
	}
	if got := jobOutput(t, c, "jobs", j.Id, "stderr"); got != "err\n" {
		t.Errorf("stderr = %q", got)
	}

	root, err := c.StartJob(ctx, "jobs", JobRequest{Argv: []string{"id", "-u"}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	if waitJob(t, c, "jobs", root.Id); jobOutput(t, c, "jobs", root.Id, "stdout") != "0\n" {
		t.Errorf("a job as root ran as %q", jobOutput(t, c, "jobs", root.Id, "stdout"))
	}

	long, _ := c.StartJob(ctx, "jobs", JobRequest{Argv: []string{"sleep", "100"}})
	stubborn, _ := c.StartJob(ctx, "jobs", JobRequest{Argv: []string{"sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"}})
	for jobOutput(t, c, "jobs", stubborn.Id, "stdout") == "" {
		time.Sleep(20 * time.Millisecond) // the trap is set
	}
	if st, err := c.StopJob(ctx, "jobs", long.Id, time.Second); err != nil || st.State != "cancelled" || st.Exit == nil || st.Exit.Signal != "terminated" {
		t.Errorf("StopJob(sleep) = %+v, %v; want cancelled by TERM", st, err)
	}
	start := time.Now()
	st, err := c.StopJob(ctx, "jobs", stubborn.Id, 300*time.Millisecond)
	if err != nil || st.State != "cancelled" || st.Exit == nil || st.Exit.Signal != "killed" || time.Since(start) < 300*time.Millisecond {
		t.Errorf("StopJob(ignores TERM) = %+v, %v after %v; want killed after the grace period", st, err, time.Since(start))
	}
	if again, err := c.StopJob(ctx, "jobs", stubborn.Id, 0); err != nil || again.State != "cancelled" {
		t.Errorf("StopJob again = %+v, %v; want the same ended job", again, err)
	}
	list, err := c.Jobs(ctx, "jobs")
	if err != nil || len(list) != 4 || list[0].Id != j.Id || list[3].Id != stubborn.Id {
		t.Errorf("Jobs = %+v, %v; want the 4 jobs, oldest first", list, err)
	}

	runErrorCases(t, []errorCase{
		{"unknown job", func() error { _, err := c.Job(ctx, "jobs", "job-99"); return err }, "not_found", 404, "hearth sandboxes job ls jobs"},
		{"output of unknown job", func() error { _, err := c.JobOutput(ctx, "jobs", "job-99", "stdout", &bytes.Buffer{}); return err }, "not_found", 404, ""},
		{"stop unknown job", func() error { _, err := c.StopJob(ctx, "jobs", "job-99", 0); return err }, "not_found", 404, ""},
		{"bad job id", func() error { _, err := c.Job(ctx, "jobs", "Job_1"); return err }, "bad_request", 400, "job-1"},
		{"bad stream", func() error { _, err := c.JobOutput(ctx, "jobs", j.Id, "stdin", &bytes.Buffer{}); return err }, "bad_request", 400, "stdout or stderr"},
		{"negative grace", func() error { _, err := c.StopJob(ctx, "jobs", j.Id, -time.Second); return err }, "bad_request", 400, "grace"},
		{"no such command", func() error {
			_, err := c.StartJob(ctx, "jobs", JobRequest{Argv: []string{"/no/such/cmd"}})
			return err
		}, "bad_request", 400, "/no/such/cmd"},
		{"empty argv", func() error { _, err := c.StartJob(ctx, "jobs", JobRequest{Argv: []string{}}); return err }, "bad_request", 400, "argv"},
		{"relative cwd", func() error {
			_, err := c.StartJob(ctx, "jobs", JobRequest{Argv: []string{"true"}, Cwd: "tmp"})
			return err
		}, "bad_request", 400, "absolute"},
		{"unknown sandbox", func() error { _, err := c.Jobs(ctx, "nope"); return err }, "not_found", 404, ""},
	})
}
