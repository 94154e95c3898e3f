package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

// jobCmd is the job commands: background commands in a sandbox that
// outlive the CLI.
func jobCmd() *command {
	return &command{name: "job", summary: "background commands in a sandbox that outlive the CLI", example: "hearth sandboxes job start box1 -- python3 -m http.server 8080\nhearth sandboxes job ls box1", aliases: []string{"jobs"}, subs: []*command{
		{name: "start", example: "hearth sandboxes job start box1 --cwd /srv -- python3 -m http.server 8080", args: "ID [flags] -- CMD ARGS...", raw: true, names: sandboxIDs, setup: jobStart, summary: "start a background job"},
		{name: "ls", example: "hearth sandboxes job ls box1", aliases: []string{"list"}, args: "ID", min: 1, max: 1, names: sandboxIDs, setup: jobList, summary: "a sandbox's jobs"},
		{name: "logs", example: "hearth sandboxes job logs box1 j-1\nhearth sandboxes job logs box1 j-1 --stderr", aliases: []string{"output"}, args: "ID JOB", min: 2, max: 2, names: sandboxIDs, setup: jobLogs, summary: "a job's output so far"},
		{name: "stop", example: "hearth sandboxes job stop box1 j-1 --grace 5s", args: "ID JOB", min: 2, max: 2, names: sandboxIDs, setup: jobStop, summary: "stop a job (TERM, then KILL after the grace)"},
	}}
}

func jobStart(fl *flag.FlagSet) action {
	var req client.JobRequest
	envs := envFlag{}
	fl.StringVar(&req.User, "user", "", "user to run as: a name, UID or UID:GID")
	fl.StringVar(&req.Cwd, "cwd", "", "directory to run in")
	fl.Var(envs, "env", "NAME=VALUE (repeatable)")
	// As for exec: flags go before or right after the id; the command
	// starts at the first argument that is not one, or after --.
	const form = "usage: hearth sandboxes job start ID [--user U] [--cwd D] [--env K=V]... -- CMD ARGS..."
	return func(inv *env) error {
		args := inv.args
		rest, help, err := parseRaw(fl, args)
		if err != nil || help {
			return helpOr(inv, err, help)
		}
		if len(rest) == 0 {
			return usageError{form}
		}
		id := rest[0]
		if req.Argv, help, err = parseRaw(fl, rest[1:]); err != nil || help {
			return helpOr(inv, err, help)
		}
		req.Env = envs
		if len(req.Argv) == 0 {
			return usageError{form + ": name the command to run"}
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		j, err := c.StartJob(context.Background(), id, req)
		if err != nil {
			return err
		}
		fmt.Fprintln(inv.stdout, j.Id)
		fmt.Fprintf(inv.stderr, "started job %s (pid %d) in sandbox %s: see its output with 'hearth sandboxes job logs %s %s'\n", j.Id, j.Pid, id, id, j.Id)
		return nil
	}
}

func jobList(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		list, err := c.Jobs(context.Background(), inv.args[0])
		if err != nil {
			return err
		}
		if *asJSON {
			if list == nil {
				list = []client.Job{}
			}
			return printJSON(inv.stdout, list)
		}
		if len(list) == 0 {
			fmt.Fprintf(inv.stdout, "no jobs in sandbox %s: start one with 'hearth sandboxes job start %s -- CMD'\n", inv.args[0], inv.args[0])
			return nil
		}
		tw := tabwriter.NewWriter(inv.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tSTATE\tEXIT\tPID\tSTARTED\tTOOK\tCOMMAND")
		for _, j := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", j.Id, j.State, exitText(j), j.Pid, humanize.Time(j.Started), took(j), commandText(j.Argv))
		}
		return tw.Flush()
	}
}

// exitText says how a job ended: its status, the signal that killed it,
// or "-" while it runs.
func exitText(j client.Job) string {
	switch {
	case j.Exit == nil:
		return "-"
	case j.Exit.Error != "":
		return "did not start"
	case j.Exit.Signal != "":
		return j.Exit.Signal
	}
	return fmt.Sprint(j.Exit.Code)
}

// took is how long a job ran, or has run so far.
func took(j client.Job) string {
	end := time.Now()
	if j.Ended != nil {
		end = *j.Ended
	}
	return end.Sub(j.Started).Round(100 * time.Millisecond).String()
}

// commandText shows argv shortened to fit a table row.
func commandText(argv []string) string {
	s := strings.Join(argv, " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

func jobLogs(fl *flag.FlagSet) action {
	stderrStream := fl.Bool("stderr", false, "show standard error instead of standard output")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		stream := "stdout"
		if *stderrStream {
			stream = "stderr"
		}
		_, err = c.JobOutput(context.Background(), inv.args[0], inv.args[1], stream, inv.stdout)
		return err
	}
}

func jobStop(fl *flag.FlagSet) action {
	grace := fl.Duration("grace", 5*time.Second, "time between TERM and KILL")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		j, err := c.StopJob(context.Background(), inv.args[0], inv.args[1], *grace)
		if err != nil {
			return err
		}
		if j.State != "cancelled" {
			fmt.Fprintf(inv.stdout, "job %s in sandbox %s had already ended: %s (exit %s)\n", j.Id, inv.args[0], j.State, exitText(j))
			return nil
		}
		fmt.Fprintf(inv.stdout, "stopped job %s in sandbox %s (%s)\n", j.Id, inv.args[0], exitText(j))
		return nil
	}
}
