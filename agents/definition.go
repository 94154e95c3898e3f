package agents

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/dustin/go-humanize"
	"github.com/robfig/cron/v3"

	"hearth/agents/store"
	"hearth/internal/duration"
	"hearth/internal/ids"
	"hearth/internal/tomlerr"
)

// Definition is an agent: what it runs, how it is told its task, and what
// it may spend. One TOML file each, named after the agent.
type Definition struct {
	Name        string `toml:"name"`
	Description string `toml:"description"`
	// Image is the runtime image the agent's machine boots (e.g.
	// "claude-code").
	Image string `toml:"image"`
	// CLI is the agent CLI that runs the task (CLIs: "claude-code",
	// "codex", "opencode", "gemini" or "command"); empty means the one
	// the image names.
	CLI string `toml:"cli"`
	// Command is the argv of cli = "command": a program in the image or
	// the session, the prompt on its stdin.
	Command []string `toml:"command"`
	// Model is the model the agent asks for; the gateway prices it.
	Model string `toml:"model"`
	// Prompt is a text/template rendered with a Task: {{.Prompt}},
	// {{.Inputs}} (the input files' paths), {{.Session}}, {{.Outputs}}.
	Prompt string `toml:"prompt"`
	// Outputs are globs under outputs/ naming what the task produces.
	Outputs []string `toml:"outputs"`
	// Network is the domains the agent may reach through the egress
	// proxy, besides the model gateway; "*.example.com" matches
	// subdomains, and "host:8443" allows a port other than 80 and 443.
	Network []string          `toml:"network"`
	Env     map[string]string `toml:"env"`
	// Schedule is an optional cron schedule ("0 9 * * *", "@daily",
	// "CRON_TZ=Europe/Paris 0 9 * * *") for runs of Prompt on their own.
	Schedule string `toml:"schedule"`
	Limits   Limits `toml:"limits"`
	// MCPServers are the MCP servers the agent's CLI is started with,
	// besides Hearth's own (see agentctx.go).
	MCPServers []MCPServer `toml:"mcp_servers"`
	// Skills are directories, each with a SKILL.md, placed where the CLI
	// loads skills: relative to the agents directory ("skills/review"),
	// or "session:SESSION/path" in a session's files.
	Skills []string `toml:"skills"`
	// Context are files placed in the working directory or the home
	// before the CLI starts, such as a CLAUDE.md.
	Context []ContextFile `toml:"context"`

	prompt *template.Template
	file   string
	dir    string // the agents directory, where relative paths start
}

// Limits bound one execution; zero means no limit of that kind.
type Limits struct {
	USD      float64  `toml:"usd" json:"usd,omitempty"`
	Turns    int      `toml:"turns" json:"turns,omitempty"` // model calls (the name is kept for compatibility)
	WallTime Duration `toml:"wall_time" json:"wall_time,omitempty"`
	// WorkspaceBytes ("2GiB") and WorkspaceFiles are the quota of the
	// agent's session; zero means the appliance's default
	// (workspace.session_bytes, workspace.session_files). A task cannot
	// change them.
	WorkspaceBytes Bytes `toml:"workspace_bytes" json:"workspace_bytes,omitempty"`
	WorkspaceFiles int64 `toml:"workspace_files" json:"workspace_files,omitempty"`
	// OnBudget is what reaching the USD limit does: OnBudgetStop (the
	// agent is stopped, budget_exceeded) or OnBudgetPause (the execution
	// waits, awaiting_budget, its agent stopped and its model call held,
	// for a top-up); empty means the runner's default. A task may set
	// either.
	OnBudget string `toml:"on_budget" json:"on_budget,omitempty"`
}

// What reaching the USD limit does (Limits.OnBudget).
const (
	OnBudgetStop  = store.OnBudgetStop
	OnBudgetPause = store.OnBudgetPause
)

// CheckOnBudget checks an on_budget value: empty, stop or pause.
func CheckOnBudget(v string) error {
	switch v {
	case "", OnBudgetStop, OnBudgetPause:
		return nil
	}
	return fmt.Errorf("on_budget = %q: use %q (stop the agent at the limit) or %q (pause it and wait for a top-up)", v, OnBudgetStop, OnBudgetPause)
}

// Bytes is a size written for people in TOML: "512MiB", "2GB", or with a
// bare K, M, G or T as powers of 1024 ("512M" is 512 MiB).
type Bytes int64

func (b *Bytes) UnmarshalText(text []byte) error {
	t := strings.TrimSpace(string(text))
	if n := len(t); n > 0 && strings.ContainsRune("kKmMgGtT", rune(t[n-1])) {
		t += "iB"
	}
	n, err := humanize.ParseBytes(t)
	if err != nil || n > 1<<62 {
		return fmt.Errorf("%q is not a size: write it like 512M, 2GiB or 1.5GB", text)
	}
	*b = Bytes(n)
	return nil
}

func (b Bytes) MarshalText() ([]byte, error) { return []byte(humanize.IBytes(uint64(b))), nil }

// Duration is a time.Duration written as "30m" in TOML and JSON.
type Duration = duration.Duration

// Tighten applies a task's override: each limit set in o replaces the
// definition's only if it is lower (or the definition had none). A
// looser one is an error naming the limit: an override may only tighten.
func (l Limits) Tighten(o Limits) (Limits, error) {
	var errs []error
	if o.USD < 0 || o.Turns < 0 || o.WallTime < 0 {
		return l, errors.New("limits must not be negative")
	}
	if err := store.CheckUSD(o.USD); err != nil {
		return l, fmt.Errorf("budget: %w", err)
	}
	if err := CheckOnBudget(o.OnBudget); err != nil {
		return l, err
	}
	out := l
	if o.OnBudget != "" {
		out.OnBudget = o.OnBudget
	}
	if o.USD > 0 {
		if l.USD > 0 && o.USD > l.USD {
			errs = append(errs, fmt.Errorf("budget $%.2f is more than the agent's $%.2f", o.USD, l.USD))
		}
		out.USD = o.USD
	}
	if o.Turns > 0 {
		if l.Turns > 0 && o.Turns > l.Turns {
			errs = append(errs, fmt.Errorf("max model calls %d is more than the agent's %d", o.Turns, l.Turns))
		}
		out.Turns = o.Turns
	}
	if o.WallTime > 0 {
		if l.WallTime > 0 && o.WallTime > l.WallTime {
			errs = append(errs, fmt.Errorf("timeout %v is more than the agent's %v", time.Duration(o.WallTime), time.Duration(l.WallTime)))
		}
		out.WallTime = o.WallTime
	}
	if len(errs) > 0 {
		return l, fmt.Errorf("a task may only tighten its agent's limits: %w", errors.Join(errs...))
	}
	return out, nil
}

// Task is what a prompt template is rendered with.
type Task struct {
	Prompt  string
	Inputs  []string // paths of the input files, relative to the session
	Session string
	Outputs []string // the output patterns
}

// Render makes the prompt the agent is given for t.
func (d *Definition) Render(t Task) (string, error) {
	var b bytes.Buffer
	if err := d.prompt.Execute(&b, t); err != nil {
		return "", fmt.Errorf("agent %s: prompt: %w", d.Name, err)
	}
	return b.String(), nil
}

var (
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	domain  = regexp.MustCompile(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(:[0-9]{1,5})?$`)
	// cronParser reads standard five-field schedules, descriptors such as
	// @daily, and a CRON_TZ= prefix, as the scheduler does.
	cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
)

// MinEvery is the shortest "@every" interval a schedule may have; the
// scheduler has the same bound. Each run boots a machine and spends
// model credits, and robfig/cron fires anything under a second every
// second: an interval under a minute is a mistake (a typo such as "@every
// 1ns" or "@every 0s") or a loop, never a schedule.
const MinEvery = time.Minute

// parseSchedule is cronParser.Parse, which panics on some malformed
// specs (such as "TZ=" alone): a bad schedule is an error, as in
// scheduler.ParseSpec.
func parseSchedule(spec string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("%v", r)
		}
	}()
	return cronParser.Parse(spec)
}

// CheckEvery refuses an "@every" schedule shorter than MinEvery.
func CheckEvery(s cron.Schedule) error {
	if every, ok := s.(cron.ConstantDelaySchedule); ok && every.Delay < MinEvery {
		return fmt.Errorf("too often: runs must be at least %v apart (like @every 5m, or a cron spec)", MinEvery)
	}
	return nil
}

// LoadDefinition reads one agent's TOML file. Unknown keys and bad values
// are errors that name the file and the key.
func LoadDefinition(file string) (*Definition, error) {
	d := &Definition{Prompt: "{{.Prompt}}", file: file}
	md, err := toml.DecodeFile(file, d)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return nil, fmt.Errorf("agent file %s: %s", file, tomlerr.Describe(perr))
		}
		return nil, fmt.Errorf("agent file %s: %w", file, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("agent file %s: unknown key %s (known: name, description, image, model, prompt, outputs, network, env, schedule, limits.usd, limits.turns, limits.wall_time, limits.workspace_bytes, limits.workspace_files, mcp_servers (name, command, env, url, headers), skills, context (file, to))",
			file, strings.Join(keys, ", "))
	}
	if d.Name == "" {
		d.Name = strings.TrimSuffix(filepath.Base(file), ".toml")
	}
	d.dir = filepath.Dir(file)
	if err := d.validate(); err != nil {
		return nil, fmt.Errorf("agent file %s: %w", file, err)
	}
	if err := d.checkFiles(); err != nil {
		return nil, fmt.Errorf("agent file %s: %w", file, err)
	}
	return d, nil
}

func (d *Definition) validate() error {
	if !ids.Valid(d.Name) {
		return fmt.Errorf("name = %q: use %s", d.Name, ids.Rule)
	}
	if base := strings.TrimSuffix(filepath.Base(d.file), ".toml"); d.file != "" && base != d.Name {
		return fmt.Errorf("name = %q: the file must be called %s.toml", d.Name, d.Name)
	}
	if d.Image == "" {
		return errors.New("image: missing (e.g. image = \"claude-code\")")
	}
	if d.Model == "" {
		return errors.New("model: missing (e.g. model = \"claude-sonnet-4-5\")")
	}
	if err := CheckCLI(d.CLI); err != nil {
		return err
	}
	switch {
	case d.CLI == CLICommand && len(d.Command) == 0:
		return errors.New("command: missing: cli = \"command\" runs it (e.g. command = [\"python3\", \"/opt/agent.py\"])")
	case d.CLI != CLICommand && len(d.Command) > 0:
		return errors.New("command: only cli = \"command\" runs one: set that, or remove command")
	case len(d.Command) > 0 && strings.TrimSpace(d.Command[0]) == "":
		return errors.New("command: its first element is the program to run, and is empty")
	case len(d.Skills) > 0 && d.CLI != "" && d.CLI != CLIClaudeCode:
		return fmt.Errorf("skills: cli = %q loads no skills Hearth can place (only claude-code does): remove skills", d.CLI)
	}
	for _, a := range d.Command {
		if strings.ContainsRune(a, 0) {
			return errors.New("command: an argument holds a NUL byte")
		}
	}
	if err := store.CheckUSD(d.Limits.USD); err != nil {
		return fmt.Errorf("limits.usd = %v: %w (0 or no key for no limit)", d.Limits.USD, err)
	}
	if err := CheckOnBudget(d.Limits.OnBudget); err != nil {
		return fmt.Errorf("limits.%w", err)
	}
	if d.Limits.Turns < 0 || d.Limits.WallTime < 0 || d.Limits.WorkspaceBytes < 0 || d.Limits.WorkspaceFiles < 0 {
		return errors.New("limits: must not be negative")
	}
	for _, o := range d.Outputs {
		clean := path.Clean(o)
		if _, err := path.Match(o, ""); err != nil || !strings.HasPrefix(clean, "outputs/") || clean != o {
			return fmt.Errorf("outputs: %q must be a glob under outputs/, like outputs/*.md", o)
		}
	}
	for _, n := range d.Network {
		if !domain.MatchString(n) {
			return fmt.Errorf("network: %q is not a domain name (like api.example.com, *.example.com or host.example.com:8443)", n)
		}
	}
	for k := range d.Env {
		if !envName.MatchString(k) {
			return fmt.Errorf("env: %q is not a variable name", k)
		}
	}
	if err := checkMCPServers("mcp_servers", d.MCPServers, d.Network, nil); err != nil {
		return err
	}
	if len(d.Skills) > MaxSkills {
		return fmt.Errorf("skills: %d, more than the %d an agent may have", len(d.Skills), MaxSkills)
	}
	for _, sk := range d.Skills {
		if _, err := parseSkill(sk); err != nil {
			return fmt.Errorf("skills: %w", err)
		}
	}
	if err := checkContext("context", d.Context, false, map[string]bool{}); err != nil {
		return err
	}
	if d.Schedule != "" {
		sched, err := parseSchedule(d.Schedule)
		if err != nil {
			return fmt.Errorf("schedule = %q: %v", d.Schedule, err)
		}
		if err := CheckEvery(sched); err != nil {
			return fmt.Errorf("schedule = %q: %w", d.Schedule, err)
		}
	}
	t, err := template.New(d.Name).Option("missingkey=error").Parse(d.Prompt)
	if err != nil {
		return fmt.Errorf("prompt: %w", err)
	}
	d.prompt = t
	// A template that names a field a Task lacks fails only when run:
	// try it now.
	if _, err := d.Render(Task{Prompt: "p", Inputs: []string{"inputs/x"}, Session: "session-x", Outputs: d.Outputs}); err != nil {
		return err
	}
	return nil
}

// LoadDefinitions reads every *.toml file in dir. An empty or missing dir
// has no agents.
func LoadDefinitions(dir string) (map[string]*Definition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.toml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	defs := map[string]*Definition{}
	var errs []error
	for _, f := range files {
		d, err := LoadDefinition(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		defs[d.Name] = d
	}
	if _, err := os.Stat(dir); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	return defs, errors.Join(errs...)
}
