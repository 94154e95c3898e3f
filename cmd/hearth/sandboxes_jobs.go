package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"hearth/client"
)

// sbxJob runs the job commands: background commands in a sandbox that
// outlive the CLI.
func sbxJob(args []string, stdout, stderr io.Writer) error {
	verb, args := splitVerb(args)
	switch verb {
	case "":
		return usageError{"sandboxes job: say what to do: start, ls, logs or stop"}
	case "start":
		return jobStart(args, stdout, stderr)
	case "ls", "list":
		return jobList(args, stdout)
	case "logs", "output":
		return jobLogs(args, stdout)
	case "stop":
		return jobStop(args, stdout)
	}
	return usageError{fmt.Sprintf("sandboxes job: unknown command %q: use start, ls, logs or stop", verb)}
}

// splitVerb finds the command among args, which --config FILE may come
// before (hearth sandboxes job --config F start ...), and returns the
// other arguments in their order.
func splitVerb(args []string) (verb string, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--config" || a == "-config" {
			i++ // its value
			continue
		}
		if !strings.HasPrefix(a, "-") {
			return a, append(args[:i:i], args[i+1:]...)
		}
	}
	return "", args
}

func jobStart(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("sandboxes job start", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	config := fl.String("config", "", "config file")
	var req client.JobRequest
	env := envFlag{}
	fl.StringVar(&req.User, "user", "", "user to run as: a name, UID or UID:GID")
	fl.StringVar(&req.Cwd, "cwd", "", "directory to run in")
	fl.Var(env, "env", "NAME=VALUE (repeatable)")
	// As for exec: flags go before or right after the id; the command
	// starts at the first argument that is not one, or after --.
	const form = "usage: hearth sandboxes job start ID [--user U] [--cwd D] [--env K=V]... -- CMD ARGS..."
	if err := fl.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	rest := fl.Args()
	if len(rest) == 0 {
		return usageError{form}
	}
	id := rest[0]
	if err := fl.Parse(rest[1:]); err != nil {
		return usageError{err.Error()}
	}
	req.Argv, req.Env = fl.Args(), env
	if len(req.Argv) == 0 {
		return usageError{form + ": name the command to run"}
	}
	c, err := connect(*config)
	if err != nil {
		return err
	}
	j, err := c.StartJob(context.Background(), id, req)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, j.Id)
	fmt.Fprintf(stderr, "started job %s (pid %d) in sandbox %s: see its output with 'hearth sandboxes job logs %s %s'\n", j.Id, j.Pid, id, id, j.Id)
	return nil
}

func jobList(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("sandboxes job ls", flag.ContinueOnError)
	asJSON := fl.Bool("json", false, "print JSON")
	c, pos, err := sbxArgs(fl, args, 1, 1, "job ls ID [--json]")
	if err != nil {
		return err
	}
	list, err := c.Jobs(context.Background(), pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		if list == nil {
			list = []client.Job{}
		}
		return json.NewEncoder(stdout).Encode(list)
	}
	if len(list) == 0 {
		fmt.Fprintf(stdout, "no jobs in sandbox %s: start one with 'hearth sandboxes job start %s -- CMD'\n", pos[0], pos[0])
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATE\tEXIT\tPID\tSTARTED\tTOOK\tCOMMAND")
	for _, j := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", j.Id, j.State, exitText(j), j.Pid, humanize.Time(j.Started), took(j), commandText(j.Argv))
	}
	return tw.Flush()
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

func jobLogs(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("sandboxes job logs", flag.ContinueOnError)
	stderrStream := fl.Bool("stderr", false, "show standard error instead of standard output")
	c, pos, err := sbxArgs(fl, args, 2, 2, "job logs ID JOB [--stderr]")
	if err != nil {
		return err
	}
	stream := "stdout"
	if *stderrStream {
		stream = "stderr"
	}
	_, err = c.JobOutput(context.Background(), pos[0], pos[1], stream, stdout)
	return err
}

func jobStop(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("sandboxes job stop", flag.ContinueOnError)
	grace := fl.Duration("grace", 5*time.Second, "time between TERM and KILL")
	c, pos, err := sbxArgs(fl, args, 2, 2, "job stop ID JOB [--grace 5s]")
	if err != nil {
		return err
	}
	j, err := c.StopJob(context.Background(), pos[0], pos[1], *grace)
	if err != nil {
		return err
	}
	if j.State != "cancelled" {
		fmt.Fprintf(stdout, "job %s in sandbox %s had already ended: %s (exit %s)\n", j.Id, pos[0], j.State, exitText(j))
		return nil
	}
	fmt.Fprintf(stdout, "stopped job %s in sandbox %s (%s)\n", j.Id, pos[0], exitText(j))
	return nil
}
