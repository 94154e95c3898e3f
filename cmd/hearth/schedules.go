package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

func schedulesCmd() *command {
	return &command{name: "schedules", summary: "run agents on a schedule", example: `hearth schedules add nightly "@daily" analyst "summarize the day"
hearth schedules ls`, aliases: []string{"schedule"}, subs: []*command{
		{name: "add", example: `hearth schedules add nightly "@daily" analyst "summarize the day" --budget 1
hearth schedules add hourly "0 * * * *" watcher "check the feeds" --overlap skip`, args: `ID "SPEC" AGENT "PROMPT"`, min: 4, max: 4, setup: scheduleAdd,
			summary: "run a task on a cron schedule (\"0 9 * * 1-5\",\n\"@daily\", \"@every 1h\", \"CRON_TZ=Europe/Paris ...\")"},
		{name: "ls", example: "hearth schedules ls", aliases: []string{"list"}, setup: scheduleList, summary: "schedules with their next and last runs"},
		{name: "rm", example: "hearth schedules rm nightly", args: "ID", min: 1, max: 1, names: scheduleIDs, setup: scheduleRemove, summary: "delete a schedule (its history stays)"},
		{name: "run", example: "hearth schedules run nightly", args: "ID", min: 1, max: 1, names: scheduleIDs, setup: scheduleRun, summary: "start a run now"},
		{name: "runs", example: "hearth schedules runs nightly --json", args: "ID", min: 1, max: 1, names: scheduleIDs, setup: scheduleRuns, summary: "a schedule's runs and their executions"},
	}}
}

func scheduleAdd(fl *flag.FlagSet) action {
	var rf runFlags
	fl.Var(&rf.budget, "budget", "most dollars of model spend per run (only lower than the agent's; at least 0.000001)")
	rf.addCalls(fl, " per run")
	fl.Var(&rf.timeout, "timeout", "most wall time per run, like 10m (only shorter than the agent's)")
	overlap := fl.String("overlap", "skip", "when a run is due while one is going: skip, queue or allow")
	catchUp := fl.String("catch-up", "none", "runs missed while the daemon was down: none or once")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		s, err := c.AddSchedule(context.Background(), client.ScheduleRequest{Id: inv.args[0], Spec: inv.args[1], Agent: inv.args[2], Prompt: inv.args[3],
			Limits: rf.limits(inv.stderr), Overlap: *overlap, CatchUp: *catchUp})
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "added schedule %s: agent %s, %s; next run %s\n", s.Id, s.Agent, s.Spec, when(s.Next))
		return nil
	}
}

func scheduleList(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		list, err := c.Schedules(context.Background())
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(inv.stdout, list)
		}
		if len(list) == 0 {
			fmt.Fprintln(inv.stdout, `no schedules: add one with 'hearth schedules add ID "SPEC" AGENT "PROMPT"' or a schedule in an agent's definition`)
			return nil
		}
		tw := tabwriter.NewWriter(inv.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSPEC\tAGENT\tNEXT\tLAST")
		for _, s := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Id, s.Spec, s.Agent, when(s.Next), lastRun(s))
		}
		return tw.Flush()
	}
}

// when says when t is for people: "in 59 minutes", "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return humanize.Time(t)
}

// lastRun sums up a schedule's latest run: running, when and how it went.
func lastRun(s client.Schedule) string {
	r := s.Last
	switch {
	case s.Running > 0:
		return "running"
	case r.Id == "":
		return "-"
	case r.Skipped != "":
		return when(r.Scheduled) + " (skipped)"
	case r.Error != "":
		return when(r.Ended) + " (failed, " + orDash(r.Execution) + ")"
	}
	return when(r.Ended) + " (" + orDash(r.Execution) + ")"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func scheduleRemove(*flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		if err := c.RemoveSchedule(context.Background(), inv.args[0]); err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "removed schedule %s (its history stays)\n", inv.args[0])
		return nil
	}
}

func scheduleRun(*flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		run, err := c.RunSchedule(context.Background(), inv.args[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "started run %s of schedule %s: see it with 'hearth schedules runs %s'\n", run, inv.args[0], inv.args[0])
		return nil
	}
}

func scheduleRuns(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		runs, err := c.ScheduleRuns(context.Background(), inv.args[0], 0)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(inv.stdout, runs)
		}
		if len(runs) == 0 {
			fmt.Fprintf(inv.stdout, "schedule %s has not run yet: start a run with 'hearth schedules run %s'\n", inv.args[0], inv.args[0])
			return nil
		}
		tw := tabwriter.NewWriter(inv.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "RUN\tSCHEDULED\tEXECUTION\tOUTCOME")
		for _, r := range runs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Id, when(r.Scheduled), orDash(r.Execution), runOutcome(r))
		}
		return tw.Flush()
	}
}

func runOutcome(r client.ScheduleRun) string {
	kind := ""
	if r.Manual {
		kind = " (manual)"
	} else if r.CatchUp {
		kind = " (catch-up)"
	}
	switch {
	case r.Skipped != "":
		return "skipped: " + r.Skipped + kind
	case r.Ended.IsZero():
		return "running since " + when(r.Started) + kind
	case r.Error != "":
		return "failed: " + safe(r.Error) + kind
	}
	return "ok after " + r.Ended.Sub(r.Started).Round(time.Second).String() + kind
}
