package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"hearth/client"
)

const scheduleVerbs = "add, ls, rm, run or runs"

func cmdSchedules(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageError{"schedules: say what to do: " + scheduleVerbs}
	}
	verb, args := args[0], args[1:]
	switch verb {
	case "add":
		return scheduleAdd(args, stdout)
	case "ls", "list":
		return scheduleList(args, stdout)
	case "rm":
		return scheduleRemove(args, stdout)
	case "run":
		return scheduleRun(args, stdout)
	case "runs":
		return scheduleRuns(args, stdout)
	}
	return usageError{fmt.Sprintf("schedules: unknown command %q: use %s", verb, scheduleVerbs)}
}

// scheduleArgs parses the flags of a schedules command, --config and what
// fl has, and wants n positional arguments; form is its usage.
func scheduleArgs(fl *flag.FlagSet, args []string, n int, form string) (*client.Client, []string, error) {
	config := fl.String("config", "", "config file")
	pos, err := parseFlags(fl, args)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) != n {
		return nil, nil, usageError{"usage: hearth schedules " + form}
	}
	c, err := connect(*config)
	return c, pos, err
}

func scheduleAdd(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("schedules add", flag.ContinueOnError)
	var rf runFlags
	fl.Var(&rf.budget, "budget", "most dollars of model spend per run (only lower than the agent's; at least 0.000001)")
	fl.Var(&rf.turns, "max-turns", "most model answers per run (only lower than the agent's)")
	fl.Var(&rf.timeout, "timeout", "most wall time per run, like 10m (only shorter than the agent's)")
	overlap := fl.String("overlap", "skip", "when a run is due while one is going: skip, queue or allow")
	catchUp := fl.String("catch-up", "none", "runs missed while the daemon was down: none or once")
	c, pos, err := scheduleArgs(fl, args, 4, `add ID "SPEC" AGENT "PROMPT" [--budget USD] [--max-turns N] [--timeout D] [--overlap skip|queue|allow] [--catch-up none|once]`)
	if err != nil {
		return err
	}
	s, err := c.AddSchedule(context.Background(), client.ScheduleRequest{Id: pos[0], Spec: pos[1], Agent: pos[2], Prompt: pos[3],
		Limits: rf.limits(), Overlap: *overlap, CatchUp: *catchUp})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "added schedule %s: agent %s, %s; next run %s\n", s.Id, s.Agent, s.Spec, when(s.Next))
	return nil
}

func scheduleList(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("schedules ls", flag.ContinueOnError)
	asJSON := fl.Bool("json", false, "print JSON")
	c, _, err := scheduleArgs(fl, args, 0, "ls [--json]")
	if err != nil {
		return err
	}
	list, err := c.Schedules(context.Background())
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(stdout, `no schedules: add one with 'hearth schedules add ID "SPEC" AGENT "PROMPT"' or a schedule in an agent's definition`)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSPEC\tAGENT\tNEXT\tLAST")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Id, s.Spec, s.Agent, when(s.Next), lastRun(s))
	}
	return tw.Flush()
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

func scheduleRemove(args []string, stdout io.Writer) error {
	c, pos, err := scheduleArgs(flag.NewFlagSet("schedules rm", flag.ContinueOnError), args, 1, "rm ID")
	if err != nil {
		return err
	}
	if err := c.RemoveSchedule(context.Background(), pos[0]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed schedule %s (its history stays)\n", pos[0])
	return nil
}

func scheduleRun(args []string, stdout io.Writer) error {
	c, pos, err := scheduleArgs(flag.NewFlagSet("schedules run", flag.ContinueOnError), args, 1, "run ID")
	if err != nil {
		return err
	}
	run, err := c.RunSchedule(context.Background(), pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "started run %s of schedule %s: see it with 'hearth schedules runs %s'\n", run, pos[0], pos[0])
	return nil
}

func scheduleRuns(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("schedules runs", flag.ContinueOnError)
	asJSON := fl.Bool("json", false, "print JSON")
	c, pos, err := scheduleArgs(fl, args, 1, "runs ID [--json]")
	if err != nil {
		return err
	}
	runs, err := c.ScheduleRuns(context.Background(), pos[0], 0)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, runs)
	}
	if len(runs) == 0 {
		fmt.Fprintf(stdout, "schedule %s has not run yet: start a run with 'hearth schedules run %s'\n", pos[0], pos[0])
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSCHEDULED\tEXECUTION\tOUTCOME")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Id, when(r.Scheduled), orDash(r.Execution), runOutcome(r))
	}
	return tw.Flush()
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
