package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

// agents run, retry and resume start an execution and, unless
// --detach, stream it as it runs and end with its summary. Their exit
// status is 0 when it completed and 1 otherwise (failed, over budget,
// out of time, cancelled, interrupted); 130 when Ctrl-C stopped the
// following (the execution goes on in the daemon).

// inputFlag collects repeated --input FILE.
type inputFlag []string

func (f *inputFlag) String() string { return strings.Join(*f, ",") }
func (f *inputFlag) Type() string   { return "VALUE" }

func (f *inputFlag) Set(v string) error { *f = append(*f, v); return nil }

// runFlags are what run and resume share.
type runFlags struct {
	inputs   inputFlag
	budget   usdFlag
	onBudget onBudgetFlag
	turns    positiveInt
	// oldTurns says --max-turns, the deprecated name of --max-calls,
	// was given.
	oldTurns bool
	timeout  positiveDuration
	detach   bool
	asJSON   bool
	outputs  inputFlag
	session  string
	// What the task adds to the agent's own context.
	skills   inputFlag
	contexts inputFlag
	servers  inputFlag
}

func (rf *runFlags) add(fl *flag.FlagSet, session bool) {
	fl.Var(&rf.inputs, "input", fmt.Sprintf("a file for the agent's inputs/ (repeatable; at most %s in all, streamed)", humanize.IBytes(client.MaxInputFiles)))
	fl.Var(&rf.budget, "budget", "most dollars of model spend (only lower than the agent's; at least 0.000001)")
	fl.Var(&rf.onBudget, "on-budget", "at the dollar limit: stop, or pause and wait for 'hearth agents topup'")
	rf.addCalls(fl, "")
	fl.Var(&rf.timeout, "timeout", "most wall time, like 10m (only shorter than the agent's)")
	fl.BoolVar(&rf.detach, "detach", false, "print the execution id and leave it running")
	fl.BoolVar(&rf.asJSON, "json", false, "print the execution as JSON instead of the stream")
	fl.Var(&rf.skills, "skill", "a skill directory to add, relative to the daemon's agents directory, or session:SESSION/path (repeatable)")
	fl.Var(&rf.contexts, "context", "FILE[:TO]: place this local file for the agent, at TO in its working directory or ~/... in its home; default CLAUDE.md (repeatable)")
	fl.Var(&rf.servers, "mcp-server", "NAME=URL (an HTTP MCP server its network list allows) or 'NAME=PROGRAM ARG...' (a stdio server in the machine) to add (repeatable)")
	if session {
		fl.Var(&rf.outputs, "output", "a glob under outputs/ replacing the agent's (repeatable)")
		fl.StringVar(&rf.session, "session", "", "work in this existing session (the agent keeps its conversation)")
	}
}

// addCalls adds --max-calls, and --max-turns, its old name, which still
// works and says it is deprecated.
func (rf *runFlags) addCalls(fl *flag.FlagSet, per string) {
	fl.Var(&rf.turns, "max-calls", "most model calls"+per+" (only lower than the agent's)")
	fl.Var(&deprecatedName{&rf.turns, &rf.oldTurns}, "max-turns", "deprecated: the old name of --max-calls (it always counted model calls)")
}

// limits are the flags' limits; w is told if a deprecated flag named one.
func (rf *runFlags) limits(w io.Writer) client.Limits {
	if rf.oldTurns {
		fmt.Fprintln(w, "hearth: --max-turns is deprecated: use --max-calls (the same limit: the most model calls)")
	}
	l := client.Limits{Usd: float64(rf.budget), Turns: int(rf.turns), OnBudget: client.LimitsOnBudget(rf.onBudget)}
	if rf.timeout > 0 {
		l.WallTime = time.Duration(rf.timeout).String()
	}
	return l
}

// inputFiles checks the --input files, by base name: regular files, at
// most the daemon's limit in all, from their sizes. They are streamed to
// the daemon from disk, never held in memory.
func (rf *runFlags) inputFiles() (map[string]string, error) {
	if len(rf.inputs) == 0 {
		return nil, nil
	}
	var total int64
	out := map[string]string{}
	for _, p := range rf.inputs {
		name := filepath.Base(p)
		if _, dup := out[name]; dup {
			return nil, usageError{fmt.Sprintf("--input: two files are called %s; the agent sees inputs by name", name)}
		}
		out[name] = p
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("--input: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, usageError{fmt.Sprintf("--input %s: not a regular file", p)}
		}
		if total += fi.Size(); total > client.MaxInputFiles {
			return nil, usageError{fmt.Sprintf("--input %s: the input files come to %s or more, over the %s a task may have",
				p, humanize.IBytes(uint64(total)), humanize.IBytes(client.MaxInputFiles))}
		}
	}
	return out, nil
}

// agentContext reads --skill, --context and --mcp-server; the daemon
// checks them against the agent's definition.
func (rf *runFlags) agentContext() (servers []client.MCPServer, skills []string, files []client.ContextFile, err error) {
	for _, v := range rf.servers {
		name, spec, ok := strings.Cut(v, "=")
		if !ok || name == "" || strings.TrimSpace(spec) == "" {
			return nil, nil, nil, usageError{fmt.Sprintf("--mcp-server %q: write NAME=URL or 'NAME=PROGRAM ARG...'", v)}
		}
		if strings.HasPrefix(spec, "http://") || strings.HasPrefix(spec, "https://") {
			servers = append(servers, client.MCPServer{Name: name, Url: spec})
		} else {
			servers = append(servers, client.MCPServer{Name: name, Command: strings.Fields(spec)})
		}
	}
	for _, v := range rf.contexts {
		file, to, _ := strings.Cut(v, ":")
		fi, err := os.Stat(file)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--context: %w", err)
		}
		if !fi.Mode().IsRegular() || fi.Size() > 1<<20 {
			return nil, nil, nil, usageError{fmt.Sprintf("--context %s: give a regular file of at most 1 MiB", file)}
		}
		text, err := os.ReadFile(file)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--context: %w", err)
		}
		files = append(files, client.ContextFile{Text: string(text), To: to})
	}
	return servers, rf.skills, files, nil
}

func agentRun(fl *flag.FlagSet) action {
	var rf runFlags
	rf.add(fl, true)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		files, err := rf.inputFiles()
		if err != nil {
			return err
		}
		req := client.DelegateRequest{Agent: inv.args[0], Prompt: inv.args[1], Limits: rf.limits(inv.stderr), Outputs: rf.outputs, Session: rf.session}
		if req.McpServers, req.Skills, req.Context, err = rf.agentContext(); err != nil {
			return err
		}
		return startAndFollow(c, rf, inv.stdout, inv.stderr, func(ctx context.Context) (client.Execution, error) {
			if len(files) > 0 {
				return c.DelegateFiles(ctx, req, files)
			}
			return c.Delegate(ctx, req)
		})
	}
}

func agentResume(fl *flag.FlagSet) action {
	var rf runFlags
	rf.add(fl, false)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		files, err := rf.inputFiles()
		if err != nil {
			return err
		}
		req := client.ResumeRequest{Prompt: inv.args[1], Limits: rf.limits(inv.stderr)}
		if req.McpServers, req.Skills, req.Context, err = rf.agentContext(); err != nil {
			return err
		}
		return startAndFollow(c, rf, inv.stdout, inv.stderr, func(ctx context.Context) (client.Execution, error) {
			if len(files) > 0 {
				return c.ResumeFiles(ctx, inv.args[0], req, files)
			}
			return c.Resume(ctx, inv.args[0], req)
		})
	}
}

func agentRetry(fl *flag.FlagSet) action {
	var rf runFlags
	fl.BoolVar(&rf.detach, "detach", false, "print the execution id and leave it running")
	fl.BoolVar(&rf.asJSON, "json", false, "print the execution as JSON instead of the stream")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		return startAndFollow(c, rf, inv.stdout, inv.stderr, func(ctx context.Context) (client.Execution, error) { return c.Retry(ctx, inv.args[0], false) })
	}
}

// startAndFollow starts the execution and, unless detached, streams its
// events to stdout until it ends, then prints its summary.
func startAndFollow(c *client.Client, rf runFlags, stdout, stderr io.Writer, start func(context.Context) (client.Execution, error)) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	e, err := start(ctx)
	if err != nil {
		return err
	}
	if rf.detach {
		if rf.asJSON {
			return printJSON(stdout, e)
		}
		fmt.Fprintln(stdout, e.Id)
		fmt.Fprintf(stderr, "%s runs in session %s: follow it with 'hearth agents execution %s --follow'\n", e.Id, e.Session, e.Id)
		return nil
	}
	if !rf.asJSON {
		fmt.Fprintf(stdout, "%s: agent %s in session %s\n", e.Id, e.Agent, e.Session)
	}
	p := eventPrinter{w: stdout, start: time.Now()}
	err = c.FollowEvents(ctx, e.Id, 0, func(ev client.Event) error {
		if !rf.asJSON {
			p.print(ev)
		}
		return nil
	})
	if errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "\nstopped following %s; it goes on in the daemon: watch it with 'hearth agents execution %s --follow', stop it with 'hearth agents cancel %s'\n",
			e.Id, e.Id, e.Id)
		return statusError{130}
	}
	if err != nil {
		return err
	}
	if e, err = c.Execution(context.Background(), e.Id); err != nil {
		return err
	}
	if rf.asJSON {
		printJSON(stdout, e)
	} else {
		printSummary(context.Background(), c, stdout, e)
	}
	if e.Status != "completed" {
		return statusError{exitError}
	}
	return nil
}

// printSummary ends a followed execution: how it ended, what it used,
// its answer and its outputs.
func printSummary(ctx context.Context, c *client.Client, w io.Writer, e client.Execution) {
	fmt.Fprintf(w, "\n%s after %s: %s\n", e.Status, ranFor(e, time.Now()), spentOf(e)+budgetNote(e))
	if e.Error != "" {
		fmt.Fprintf(w, "error: %s\n", safeLines(e.Error))
	}
	if e.Result != "" {
		fmt.Fprintf(w, "result: %s\n", safeLines(strings.TrimSpace(e.Result)))
	}
	if len(e.Outputs) > 0 {
		sizes := map[string]int64{}
		if files, err := c.Outputs(ctx, e.Id); err == nil {
			for _, f := range files {
				sizes[f.Path] = f.Size
			}
		}
		fmt.Fprintln(w, "outputs:")
		for _, o := range e.Outputs {
			fmt.Fprintf(w, "  %s (%s)\n", safe(o), humanize.IBytes(uint64(sizes[o])))
		}
		fmt.Fprintf(w, "download them with 'hearth agents outputs %s --download DIR'\n", e.Id)
	}
	fmt.Fprintf(w, "continue with 'hearth agents resume %s \"...\"'\n", e.Session)
}

func budgetNote(e client.Execution) string {
	if e.Limits.Usd > 0 {
		return " of " + usd(e.Limits.Usd)
	}
	return ""
}
