package guest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func waitJob(t *testing.T, c *Client, id string) JobStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Job(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != JobRunning {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still running after 10s", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestJobs(t *testing.T) {
	c := pair(t, ServerOptions{})
	ctx := context.Background()
	ok, err := c.StartJob(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2"}})
	if err != nil || ok.State != JobRunning {
		t.Fatalf("StartJob = %+v, %v", ok, err)
	}
	if st := waitJob(t, c, ok.ID); st.State != JobCompleted || st.Exit.Code != 0 || st.Ended == nil {
		t.Errorf("finished job = %+v, want completed", st)
	}
	if out, _ := c.JobOutput(ctx, ok.ID, "stdout"); string(out) != "out\n" {
		t.Errorf("stdout kept = %q", out)
	}
	if out, _ := c.JobOutput(ctx, ok.ID, "stderr"); string(out) != "err\n" {
		t.Errorf("stderr kept = %q", out)
	}
	bad, _ := c.StartJob(ctx, ExecRequest{Argv: []string{"sh", "-c", "exit 4"}})
	if st := waitJob(t, c, bad.ID); st.State != JobFailed || st.Exit.Code != 4 {
		t.Errorf("failing job = %+v, want failed with 4", st)
	}
	missing, _ := c.StartJob(ctx, ExecRequest{Argv: []string{"/no/such/tool"}})
	if missing.State != JobFailed || missing.Exit.Error == "" {
		t.Errorf("job of a missing binary = %+v, want failed with the reason", missing)
	}
	// A job that ignores TERM is killed after the grace period.
	stubborn, _ := c.StartJob(ctx, ExecRequest{Argv: []string{"sh", "-c", "trap '' TERM; echo ready; while true; do sleep 0.05; done"}})
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	st, err := c.StopJob(ctx, stubborn.ID, 300*time.Millisecond)
	if err != nil || st.State != JobCancelled || st.Exit.Signal != "killed" || time.Since(start) > 5*time.Second {
		t.Errorf("StopJob = %+v, %v after %v; want cancelled, killed after the grace period", st, err, time.Since(start))
	}
	list, err := c.Jobs(ctx)
	if err != nil || len(list) != 4 || list[0].ID != ok.ID {
		t.Errorf("Jobs = %d jobs, %v; want 4, oldest first", len(list), err)
	}
	if _, err := c.Job(ctx, "job-999"); err == nil || !strings.Contains(err.Error(), "no job") {
		t.Errorf("Job(unknown) = %v, want not found", err)
	}
}

// TestJobOutlivesSession: a job keeps running, and keeps its output, when
// the host that started it goes away and another connects.
func TestJobOutlivesSession(t *testing.T) {
	srv := NewServer(ServerOptions{})
	first := serveOn(t, srv)
	j, err := first.StartJob(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "sleep 0.3; echo survived"}})
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	second := serveOn(t, srv)
	if st := waitJob(t, second, j.ID); st.State != JobCompleted {
		t.Fatalf("job after the first host left = %+v", st)
	}
	if out, _ := second.JobOutput(context.Background(), j.ID, "stdout"); string(out) != "survived\n" {
		t.Errorf("output = %q", out)
	}
}
