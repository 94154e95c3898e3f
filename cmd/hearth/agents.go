package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

func agentsCmd() *command {
	return &command{name: "agents", summary: "delegate tasks to agents and follow their executions", example: `hearth agents run analyst "summarize the report" --input report.pdf
hearth agents list
hearth agents show EXECUTION`, aliases: []string{"agent"}, subs: []*command{
		{name: "run", example: `hearth agents run analyst "summarize the report in outputs/summary.md" --input report.pdf --budget 0.50
hearth agents run coder "fix the failing test" --timeout 10m --detach`, args: `AGENT "PROMPT"`, min: 2, max: 2, names: agentNames, setup: agentRun,
			summary: "delegate a task; streams it, ends with the result,\noutputs, model calls, tokens and cost"},
		{name: "list", example: "hearth agents list\nhearth agents list --tree --limit 20", aliases: []string{"ls"}, summary: "one line per execution, newest first (--tree: children\nunder their parent)", setup: agentList},
		{name: "show", example: "hearth agents show exec-4ca3193e\nhearth agents show exec-4ca3193e --json", args: "EXECUTION", min: 1, max: 1, names: executionIDs, setup: agentShow,
			summary: "an execution's details, its parent and its children"},
		{name: "execution", example: "hearth agents execution exec-4ca3193e", aliases: []string{"logs"}, args: "EXECUTION", min: 1, max: 1, names: executionIDs, setup: agentExecution,
			summary: "its event log with timestamps (logs is the same)"},
		{name: "outputs", example: "hearth agents outputs exec-4ca3193e\nhearth agents outputs exec-4ca3193e --download ./results", args: "EXECUTION", min: 1, max: 1, names: executionIDs, setup: agentOutputs,
			summary: "the session's outputs/, or a copy of them"},
		{name: "retry", example: "hearth agents retry exec-4ca3193e", args: "EXECUTION", min: 1, max: 1, names: executionIDs, setup: agentRetry, summary: "run an ended execution's task again"},
		{name: "resume", example: `hearth agents resume session-1f1e2b "now add a chart"`, args: `SESSION "PROMPT"`, min: 2, max: 2, names: agentSessionIDs, setup: agentResume,
			summary: "continue a session; the agent keeps its conversation"},
		{name: "rewind", example: "hearth agents rewind session-1f1e2b --call 3\nhearth agents rewind session-1f1e2b --call 2 --execution exec-4ca3193e\nhearth agents rewind session-1f1e2b --undo", args: "SESSION", min: 1, max: 1, names: agentSessionIDs, setup: agentRewind,
			summary: "put a session's files and conversation back as they were\nafter model call --call N (--undo: back again)"},
		{name: "branch", example: "hearth agents branch session-1f1e2b --call 3\nhearth agents branch session-1f1e2b --call 3 try-other-way", args: "SESSION [NEW]", min: 1, max: 2, names: agentSessionIDs, setup: agentBranch,
			summary: "start a new session as SESSION was after --call N"},
		{name: "cancel", example: "hearth agents cancel exec-4ca3193e", args: "EXECUTION", min: 1, max: 1, names: executionIDs, setup: agentCancel, summary: "stop it (partial outputs are kept)"},
		{name: "topup", example: "hearth agents topup exec-4ca3193e 0.25", args: "EXECUTION USD", min: 2, max: 2, names: executionIDs, setup: agentTopUp,
			summary: "raise its dollar limit; one awaiting budget goes on"},
		{name: "definitions", example: "hearth agents definitions\nhearth agents definitions --json", aliases: []string{"defs"}, setup: agentDefinitions, summary: "the agents the daemon knows"},
		{name: "reload", example: "hearth agents reload", setup: agentReload, summary: "read the agent definitions again (or SIGHUP the daemon)"},
		{name: "sessions", example: "hearth agents sessions\nhearth agents sessions --agent analyst", setup: agentSessions, summary: "agent sessions, newest first"},
	}}
}

// printList prints list as JSON, or says empty when it has nothing, or
// prints one aligned row per item.
func printList[T any](w io.Writer, asJSON bool, list []T, empty string, row func(T) []string) error {
	if asJSON {
		return printJSON(w, list)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, empty)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, item := range list {
		cells := row(item)
		for i, c := range cells {
			cells[i] = safe(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

func agentList(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	var f client.ExecutionFilter
	var status string
	fl.StringVar(&f.Agent, "agent", "", "only this agent's executions")
	fl.StringVar(&f.Session, "session", "", "only this session's executions")
	fl.StringVar(&status, "status", "", "only these statuses (comma-separated: running,pending)")
	fl.StringVar(&f.Parent, "parent", "", "only the executions this one delegated to")
	fl.IntVar(&f.Limit, "limit", 50, "at most this many, newest first")
	tree := fl.Bool("tree", false, "print each execution's children under it, indented (those on this page)")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		if status != "" {
			f.Status = strings.Split(status, ",")
		}
		list, err := c.Executions(context.Background(), f)
		if err != nil {
			return err
		}
		indent := map[string]string{}
		if *tree && !*asJSON {
			list, indent = asTree(list)
		}
		return printList(inv.stdout, *asJSON, list, "no executions: start one with 'hearth agents run AGENT \"PROMPT\"'",
			func(e client.Execution) []string {
				return []string{indent[e.Id] + e.Id, e.Agent, e.Session, string(e.Status), turnsOf(e), spendOf(e), ranFor(e, time.Now())}
			})
	}
}

// asTree orders a page of executions (newest first) as trees: each root
// (or execution whose parent is not on the page) in the page's order,
// followed by its children, oldest first, each indented under its
// parent.
func asTree(list []client.Execution) ([]client.Execution, map[string]string) {
	on := map[string]bool{}
	for _, e := range list {
		on[e.Id] = true
	}
	kids := map[string][]client.Execution{}
	for i := len(list) - 1; i >= 0; i-- { // oldest first
		if e := list[i]; e.Parent != "" && on[e.Parent] {
			kids[e.Parent] = append(kids[e.Parent], e)
		}
	}
	out := make([]client.Execution, 0, len(list))
	indent := map[string]string{}
	var walk func(e client.Execution, depth int)
	walk = func(e client.Execution, depth int) {
		out = append(out, e)
		if depth > 0 {
			indent[e.Id] = strings.Repeat("  ", depth-1) + "└ "
		}
		for _, k := range kids[e.Id] {
			walk(k, depth+1)
		}
	}
	for _, e := range list {
		if e.Parent == "" || !on[e.Parent] {
			walk(e, 0)
		}
	}
	return out, indent
}

// turnsOf is the model calls made: "call 12/50", or "call 12" without a
// limit (limits.turns, which counts model calls).
func turnsOf(e client.Execution) string {
	if e.Limits.Turns > 0 {
		return fmt.Sprintf("call %d/%d", e.Turns, e.Limits.Turns)
	}
	return fmt.Sprintf("call %d", e.Turns)
}

// spendOf is "$1.24 of $10.00", or "$1.24" without a budget.
func spendOf(e client.Execution) string {
	if e.Limits.Usd > 0 {
		return usd(e.Usd) + " of " + usd(e.Limits.Usd)
	}
	return usd(e.Usd)
}

// ranFor is how long the execution has run (so far), or "pending".
func ranFor(e client.Execution, now time.Time) string {
	if e.Started == nil {
		return "not started"
	}
	end := now
	if e.Ended != nil {
		end = *e.Ended
	}
	return duration(end.Sub(*e.Started))
}

// usd is money for people: "$1,234.50"; under a dollar, up to four
// decimals ("$0.0045", "$0.25"), since agents' calls cost fractions of a
// cent.
func usd(v float64) string {
	if v >= 1 || v <= -1 || v == 0 {
		return "$" + humanize.FormatFloat("#,###.##", v)
	}
	s := strconv.FormatFloat(v, 'f', 4, 64)
	for strings.HasSuffix(s, "0") && len(s)-strings.IndexByte(s, '.') > 3 {
		s = s[:len(s)-1]
	}
	return "$" + s
}

// duration is a time span for people: "0.8s", "42s", "3m 42s", "1h 05m".
func duration(d time.Duration) string {
	switch {
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
}

func agentShow(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		e, err := c.Execution(context.Background(), inv.args[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(inv.stdout, e)
		}
		var kids []client.Execution
		if len(e.Children) > 0 {
			if kids, err = c.Executions(context.Background(), client.ExecutionFilter{Parent: e.Id, Limit: 10000}); err != nil {
				return err
			}
		}
		printExecution(inv.stdout, e, kids)
		return nil
	}
}

func printExecution(w io.Writer, e client.Execution, children []client.Execution) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, safe(v))
		}
	}
	kind := string(e.Kind)
	if e.Previous != "" {
		kind += " of " + e.Previous
	}
	row("execution", e.Id+" ("+kind+")")
	if e.Parent != "" {
		row("parent", fmt.Sprintf("%s (depth %d)", e.Parent, e.Depth))
	}
	row("agent", e.Agent)
	row("session", e.Session)
	row("status", string(e.Status))
	row("prompt", oneLine(e.Prompt, 200))
	row("created", e.Created.Local().Format("2006-01-02 15:04:05")+" ("+humanize.Time(e.Created)+")")
	row("ran", ranFor(e, time.Now()))
	row("limits", limitsOf(e.Limits))
	row("used", spentOf(e))
	if e.Parent != "" || len(e.Children) > 0 || e.TotalUsd != e.Usd {
		row("with children", fmt.Sprintf("%s in / %s out tokens, %s", humanize.Comma(e.TotalTokens.Input),
			humanize.Comma(e.TotalTokens.Output), usd(e.TotalUsd)))
	}
	row("result", oneLine(e.Result, 500))
	row("error", e.Error)
	row("outputs", strings.Join(e.Outputs, ", "))
	// Newest first from the list: shown oldest first, as delegated.
	for i := len(children) - 1; i >= 0; i-- {
		k := children[i]
		label := ""
		if i == len(children)-1 {
			label = "children"
		}
		row(label, fmt.Sprintf("%s  %s  %s  %s", k.Id, k.Agent, k.Status, usd(k.TotalUsd)))
	}
	tw.Flush()
}

func limitsOf(l client.Limits) string {
	var parts []string
	if l.Usd > 0 {
		if l.OnBudget != "" {
			parts = append(parts, usd(l.Usd)+" ("+string(l.OnBudget)+" at the limit)")
		} else {
			parts = append(parts, usd(l.Usd))
		}
	}
	if l.Turns > 0 {
		parts = append(parts, plural(l.Turns, "model call"))
	}
	if l.WallTime != "" {
		parts = append(parts, shortDuration(l.WallTime))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// shortDuration writes a Go duration without its zero tail: "30m" for
// 30m0s, "2h" for 2h0m0s.
func shortDuration(s string) string {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil || d <= 0:
		return s
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return strings.TrimSuffix(d.String(), "0s")
	}
	return d.String()
}

func spentOf(e client.Execution) string {
	s := fmt.Sprintf("%s, %s in / %s out tokens", plural(e.Turns, "model call"), humanize.Comma(e.Tokens.Input), humanize.Comma(e.Tokens.Output))
	if e.Tokens.CacheRead > 0 || e.Tokens.CacheCreation > 0 {
		s += fmt.Sprintf(" (cache: %s read, %s written)", humanize.Comma(e.Tokens.CacheRead), humanize.Comma(e.Tokens.CacheCreation))
	}
	return s + ", " + usd(e.Usd)
}

// plural is "1 model call", "2 model calls".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// oneLine puts text on one line of at most max runes, its control
// characters escaped.
func oneLine(s string, max int) string {
	s = safe(strings.Join(strings.Fields(s), " "))
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

func agentCancel(*flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		e, err := c.Cancel(context.Background(), inv.args[0])
		if err != nil {
			return err
		}
		if !client.Ended(e) {
			fmt.Fprintf(inv.stdout, "%s is still stopping (its agent gets KILL after the grace period); check with 'hearth agents show %s'\n", e.Id, e.Id)
			return nil
		}
		fmt.Fprintf(inv.stdout, "%s %s", e.Id, e.Status)
		if len(e.Outputs) > 0 {
			fmt.Fprintf(inv.stdout, "; partial outputs kept: %s", safe(strings.Join(e.Outputs, ", ")))
		}
		fmt.Fprintln(inv.stdout)
		return nil
	}
}

func agentTopUp(*flag.FlagSet) action {
	return func(inv *env) error {
		amount, err := parseUSD(inv.args[1])
		if err != nil {
			return err
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		e, err := c.TopUp(context.Background(), inv.args[0], amount)
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "%s %s: limit now %s (%s spent)\n", e.Id, e.Status, usd(e.Limits.Usd), usd(e.Usd))
		return nil
	}
}

func agentOutputs(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	dir := fl.String("download", "", "copy every output into this directory")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		ctx := context.Background()
		files, err := c.Outputs(ctx, inv.args[0])
		if err != nil {
			return err
		}
		if *dir != "" {
			return downloadOutputs(ctx, c, inv.args[0], files, *dir, inv.stderr)
		}
		return printList(inv.stdout, *asJSON, files, "no files in the session's outputs/ yet", func(f client.OutputFile) []string {
			mark := ""
			if f.Matched {
				mark = "matched"
			}
			return []string{f.Path, humanize.IBytes(uint64(f.Size)), humanize.Time(f.Modified), mark}
		})
	}
}

// downloadOutputs copies each file to dir, under its path below
// outputs/; each file appears whole or not at all.
func downloadOutputs(ctx context.Context, c *client.Client, id string, files []client.OutputFile, dir string, stderr io.Writer) error {
	var total int64
	for _, f := range files {
		rel := strings.TrimPrefix(f.Path, "outputs/")
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("the daemon listed %q, which is not a path under outputs/: not downloaded", f.Path)
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		n, err := downloadTo(ctx, c, id, f.Path, dst)
		if err != nil {
			return fmt.Errorf("download %s: %w", f.Path, err)
		}
		total += n
	}
	fmt.Fprintf(stderr, "downloaded %s (%s) to %s\n", plural(len(files), "file"), humanize.IBytes(uint64(total)), dir)
	return nil
}

func downloadTo(ctx context.Context, c *client.Client, id, p, dst string) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return 0, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".hearth-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	n, err := c.DownloadOutput(ctx, id, p, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	return n, err
}

func agentDefinitions(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		defs, err := c.Agents(context.Background())
		if err != nil {
			return err
		}
		return printList(inv.stdout, *asJSON, defs, "no agents: put one TOML file per agent in the daemon's agents.dir, then hearth agents reload",
			func(d client.AgentDefinition) []string {
				return []string{d.Name, d.Model, d.Image, cliOf(d.Cli), limitsOf(d.Limits), oneLine(d.Description, 60)}
			})
	}
}

// cliOf is a definition's CLI for a table.
func cliOf(cli string) string {
	if cli == "" {
		return "(no cli)"
	}
	return cli
}

// agentReload has the daemon read its agent definitions again. It fails
// (exit 1) when a file did not load, after saying which and why.
func agentReload(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		r, err := c.ReloadAgents(context.Background())
		if err != nil {
			return err
		}
		if *asJSON {
			if err := printJSON(inv.stdout, r); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(inv.stdout, "%d agents: %s\n", len(r.Agents), strings.Join(r.Agents, ", "))
		}
		if len(r.Problems) > 0 {
			return fmt.Errorf("some definitions did not load:\n  %s", strings.Join(r.Problems, "\n  "))
		}
		return nil
	}
}

func agentSessions(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	var f client.AgentSessionFilter
	fl.StringVar(&f.Agent, "agent", "", "only this agent's sessions")
	fl.IntVar(&f.Limit, "limit", 50, "at most this many, newest first")
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		list, err := c.AgentSessions(context.Background(), f)
		if err != nil {
			return err
		}
		return printList(inv.stdout, *asJSON, list, "no sessions yet", func(s client.AgentSession) []string {
			from := ""
			if s.BranchedFrom != "" {
				from = "branch of " + s.BranchedFrom + " at " + s.BranchedAt
			}
			return []string{s.Id, s.Agent, humanize.Time(s.Created), s.LastExecution, from}
		})
	}
}
