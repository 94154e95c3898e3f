package appliance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
)

// reporterTOML is an agent with a schedule of its own.
const reporterTOML = `image = "claude-code"
model = "claude-sonnet-4-5"
schedule = "@daily"
prompt = "Write the daily report. {{.Prompt}}"
`

// waitRuns polls a schedule's history until it has a run that ended.
func waitRuns(t *testing.T, c *Client, id string) []ScheduleRun {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		runs, err := c.ScheduleRuns(context.Background(), id, 0)
		if err != nil {
			t.Fatalf("ScheduleRuns(%s) = %v", id, err)
		}
		if len(runs) > 0 && (!runs[0].Ended.IsZero() || runs[0].Skipped != "") {
			return runs
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule %s: no run recorded after 2 minutes", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSchedules adds a schedule through the API and runs it now: the run
// delegates a real execution, which completes and is named in the run's
// history. Bad requests are 4xx; an agent definition's schedule shows as
// agent-NAME, and is re-synced at the next start while API ones stay.
func TestSchedules(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{textTurn("report written")}}, func(cfg *Config) {
		os.WriteFile(filepath.Join(cfg.AgentsDir(), "reporter.toml"), []byte(reporterTOML), 0o644)
	})
	ctx := context.Background()
	c := env.c

	list, err := c.Schedules(ctx)
	if err != nil || len(list) != 1 || list[0].Id != "agent-reporter" || list[0].Agent != "reporter" || list[0].Spec != "@daily" ||
		list[0].Source != "agent" || list[0].Overlap != "skip" || list[0].CatchUp != "none" || list[0].Prompt != "Scheduled run" ||
		time.Until(list[0].Next) <= 0 || time.Until(list[0].Next) > 24*time.Hour {
		t.Fatalf("Schedules at start = %+v, %v; want agent-reporter, @daily, due within a day", list, err)
	}

	s, err := c.AddSchedule(ctx, ScheduleRequest{Id: "hourly", Spec: "@every 1h", Agent: "analyst", Prompt: "Summarise", Limits: Limits{Usd: 1}})
	if err != nil || s.Id != "hourly" || s.Source != "api" || s.Limits.Usd != 1 || time.Until(s.Next) < 59*time.Minute {
		t.Fatalf("AddSchedule = %+v, %v", s, err)
	}
	run, err := c.RunSchedule(ctx, "hourly")
	if err != nil || run == "" {
		t.Fatalf("RunSchedule = %q, %v", run, err)
	}
	runs := waitRuns(t, c, "hourly")
	r := runs[0]
	if len(runs) != 1 || r.Id != run || !r.Manual || r.Error != "" || !strings.HasPrefix(r.Execution, "exec-") || r.Ended.IsZero() {
		t.Fatalf("runs = %+v, want one manual run naming its execution", runs)
	}
	e, err := c.Execution(ctx, r.Execution)
	if err != nil || e.Status != "completed" || e.Agent != "analyst" || e.Prompt != "Summarise" || e.Limits.Usd != 1 || e.Result != "report written" {
		t.Errorf("Execution(%s) = %+v, %v; want completed with the schedule's prompt and budget", r.Execution, e, err)
	}
	list, _ = c.Schedules(ctx)
	if len(list) != 2 || list[1].Id != "hourly" || list[1].Last.Execution != r.Execution || list[1].Running != 0 {
		t.Errorf("Schedules after the run = %+v, want hourly's last run with execution %s", list, r.Execution)
	}

	runErrorCases(t, []errorCase{
		{"bad spec", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "bad", Spec: "every day", Agent: "analyst", Prompt: "x"})
			return err
		}, "bad_request", 400, "@daily"},
		{"bad id", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "a b", Spec: "@daily", Agent: "analyst", Prompt: "x"})
			return err
		}, "bad_request", 400, "letters, digits"},
		{"bad overlap", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "o", Spec: "@daily", Agent: "analyst", Prompt: "x", Overlap: "sometimes"})
			return err
		}, "bad_request", 400, "skip, queue or allow"},
		{"unknown agent", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "u", Spec: "@daily", Agent: "nobody", Prompt: "x"})
			return err
		}, "not_found", 404, "analyst"},
		{"looser limit", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "l", Spec: "@daily", Agent: "analyst", Prompt: "x", Limits: Limits{Usd: 50}})
			return err
		}, "bad_request", 400, "only tighten"},
		{"empty prompt", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "p", Spec: "@daily", Agent: "analyst", Prompt: " "})
			return err
		}, "bad_request", 400, "prompt"},
		{"run unknown", func() error { _, err := c.RunSchedule(ctx, "nope"); return err }, "not_found", 404, "nope"},
		{"runs unknown", func() error { _, err := c.ScheduleRuns(ctx, "nope", 0); return err }, "not_found", 404, "nope"},
		{"delete unknown", func() error { return c.RemoveSchedule(ctx, "nope") }, "not_found", 404, "nope"},
	})

	// The definition loses its schedule: the next start removes
	// agent-reporter and keeps hourly, with its history.
	env.d.Close()
	os.WriteFile(filepath.Join(env.cfg.AgentsDir(), "reporter.toml"), []byte(strings.Replace(reporterTOML, `schedule = "@daily"`, "", 1)), 0o644)
	_, c = startSandboxDaemon(t, env.cfg)
	list, err = c.Schedules(ctx)
	if err != nil || len(list) != 1 || list[0].Id != "hourly" || list[0].Last.Execution != r.Execution {
		t.Fatalf("Schedules after restart = %+v, %v; want hourly alone, with its last run", list, err)
	}
	if err := c.RemoveSchedule(ctx, "hourly"); err != nil {
		t.Fatalf("RemoveSchedule = %v", err)
	}
	if list, err = c.Schedules(ctx); err != nil || len(list) != 0 {
		t.Errorf("Schedules after delete = %+v, %v", list, err)
	}
	if runs, err := c.ScheduleRuns(ctx, "hourly", 0); err != nil || len(runs) != 1 {
		t.Errorf("ScheduleRuns of the deleted schedule = %+v, %v; want its history kept", runs, err)
	}
}

// TestScheduleRunBusy: under overlap skip a manual run while one is going
// is refused with 409.
func TestScheduleRunBusy(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{bashTurn("echo busy; sleep 30", modeltest.Usage{InputTokens: 10, OutputTokens: 10}), textTurn("done")}}, nil)
	ctx := context.Background()
	c := env.c
	if _, err := c.AddSchedule(ctx, ScheduleRequest{Id: "slow", Spec: "@daily", Agent: "analyst", Prompt: "go"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunSchedule(ctx, "slow"); err != nil {
		t.Fatalf("RunSchedule = %v", err)
	}
	_, err := c.RunSchedule(ctx, "slow")
	wantCode(t, err, "conflict", 409)
	list, _ := c.Schedules(ctx)
	if len(list) != 1 || list[0].Running != 1 {
		t.Errorf("Schedules = %+v, want slow running", list)
	}
}
