package guest

import (
	"context"
	"io"
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

// TestFollowJob: a follower gets a job's output as it is written, ends
// when the job does, and a second host that connects mid-way goes on
// from the offset the first reached, with nothing lost or repeated.
func TestFollowJob(t *testing.T) {
	srv := NewServer(ServerOptions{})
	first := serveOn(t, srv)
	ctx := context.Background()
	j, err := first.StartJob(ctx, ExecRequest{Argv: []string{"sh", "-c", "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	fctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(250*time.Millisecond, cancel) // the first host goes away mid-way
	off, _ := first.FollowJob(fctx, j.ID, "stdout", 0, &got)
	if off == 0 || off != int64(got.Len()) || off >= int64(len("line1\n")*6) {
		t.Fatalf("first follower reached offset %d with %q; want part of the output", off, got.String())
	}
	first.Close()
	second := serveOn(t, srv)
	end, err := second.FollowJob(ctx, j.ID, "stdout", off, &got)
	if err != nil || got.String() != "line1\nline2\nline3\nline4\nline5\nline6\n" || end != int64(got.Len()) {
		t.Fatalf("after the second follower: %q (offset %d), %v; want every line once", got.String(), end, err)
	}
	// Following an ended job returns at once with what is left.
	var rest strings.Builder
	if n, err := second.FollowJob(ctx, j.ID, "stdout", 12, &rest); err != nil || rest.String() != "line3\nline4\nline5\nline6\n" || n != end {
		t.Errorf("follow from 12 after the end = %q, %d, %v", rest.String(), n, err)
	}
	if _, err := second.FollowJob(ctx, j.ID, "stdout", -1, &rest); err == nil {
		t.Error("a negative offset was accepted")
	}
	// Bytes older than what a job keeps are refused, saying so.
	big, _ := second.StartJob(ctx, ExecRequest{Argv: []string{"sh", "-c", "head -c 1200000 /dev/zero"}})
	waitJob(t, second, big.ID)
	if _, err := second.FollowJob(ctx, big.ID, "stdout", 0, io.Discard); err == nil || !strings.Contains(err.Error(), "dropped") {
		t.Errorf("follow from a dropped offset = %v, want an error saying the bytes were dropped", err)
	}
}
