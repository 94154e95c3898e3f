package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestCrashDaemonKilledMidScheduledRun kills the daemon with SIGKILL while
// a scheduled run's agent works: after the restart the run is in the
// schedule's history, naming its execution and marked interrupted, and
// the execution is interrupted too.
func TestCrashDaemonKilledMidScheduledRun(t *testing.T) {
	e := newCrashEnv(t)
	model := e.agentEnv([]modeltest.Turn{bash("echo busy; sleep 120")}, "", "")
	e.up()
	e.mustCLI("schedules", "add", "nightly", "@daily", "analyst", "a long task")
	run := strings.Fields(e.mustCLI("schedules", "run", "nightly"))[2]
	c := client.New(e.cfg.SocketPath())
	ctx := context.Background()
	var exec string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		runs, err := c.ScheduleRuns(ctx, "nightly", 0)
		if err == nil && len(runs) == 1 && runs[0].Execution != "" {
			exec = runs[0].Execution
			if x, err := c.Execution(ctx, exec); err == nil && x.Status == "running" && len(model.MessageRequests()) > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scheduled run's agent was not working within 60s: runs %+v, %v", runs, err)
		}
	}
	e.crash()
	e.up()
	runs, err := c.ScheduleRuns(ctx, "nightly", 0)
	if err != nil || len(runs) != 1 {
		t.Fatalf("schedule history after the restart = %+v, %v; want the run that was going", runs, err)
	}
	r := runs[0]
	t.Logf("run %s after the restart: %+v", run, r)
	if r.Id != run || r.Execution != exec || !strings.Contains(r.Error, "interrupted") || r.Ended.IsZero() || r.Started.IsZero() {
		t.Errorf("run after the restart = %+v; want it naming %s, interrupted, ended", r, exec)
	}
	if x, err := c.Execution(ctx, exec); err != nil || x.Status != "interrupted" {
		t.Errorf("execution %s after the restart = %s, %v; want interrupted", exec, x.Status, err)
	}
	out := e.mustCLI("schedules", "runs", "nightly")
	if !strings.Contains(out, exec) || !strings.Contains(out, "interrupted") {
		t.Errorf("schedules runs after the restart = %q; want the run, its execution and interrupted", out)
	}
	e.stop()
}
