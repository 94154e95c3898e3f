package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/appliance"
	"hearth/appliance/appliancetest"
	"hearth/client"
)

// agentDaemon starts a real daemon whose agents run the real claude CLI
// in jail machines, against script as the model provider, with the
// analyst agent; it returns the --config flag for the CLI. setup, if
// given, runs on the state directory before anything is put in it.
func agentDaemon(t *testing.T, script modeltest.Config, credits bool, setup ...func(stateDir string)) (configFlag string, cfg appliance.Config) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("agents need root (namespaces, mounts, cgroups, FUSE)")
	}
	dir := t.TempDir()
	cfg = appliance.DefaultConfig()
	cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	cfg.Sandbox.Agent = appliancetest.Agent(t)
	for _, f := range setup {
		os.MkdirAll(cfg.StateDir, 0o700)
		f(cfg.StateDir)
	}
	appliancetest.LinkImages(t, cfg.StateDir, appliancetest.ClaudeCodeImages(t))
	model := modeltest.New(script)
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	key := filepath.Join(dir, "api-key")
	os.WriteFile(key, []byte(model.Key()), 0o600)
	defs := filepath.Join(dir, "defs")
	os.MkdirAll(defs, 0o755)
	def := "description = \"Analyses data.\"\nimage = \"claude-code\"\nmodel = \"claude-sonnet-4-5\"\noutputs = [\"outputs/*.md\"]\n" +
		"[limits]\nusd = 5.0\nturns = 20\n"
	os.WriteFile(filepath.Join(defs, "analyst.toml"), []byte(def), 0o644)
	config := filepath.Join(dir, "hearth.toml")
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[sandbox]\nagent = %q\ntier = \"jail\"\n[agents]\ndir = %q\ngrace = \"3s\"\n"+
		"[model]\nupstream = %q\napi_key_file = %q\n[credits]\nenabled = %v\n",
		cfg.StateDir, cfg.Workspace.Mount, cfg.Sandbox.Agent, defs, model.URL(), key, credits)
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := appliance.LoadConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	d, err := appliance.Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return "--config=" + config, cfg
}

func bash(command string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.ToolUse("Bash", map[string]string{"command": command, "description": "step"})},
		Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

func say(text string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text(text)}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

var execIDRe = regexp.MustCompile(`exec-[0-9a-f]{8}`)

// TestAgentsRunCommand runs a task with the CLI: the stream shows the
// tool call, its result, the file written, the model calls with tokens
// and dollars and the answer; the summary the status, the result, the
// outputs, model calls, tokens and cost; the exit status says whether it
// completed. Then the read commands, retry, resume, credits.
func TestAgentsRunCommand(t *testing.T) {
	c, cfg := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bash("mkdir -p outputs && wc -l < inputs/q2.csv > outputs/report.md && cat outputs/report.md"),
		say("Wrote outputs/report.md"),
		// A 403, which the CLI does not retry: claude 2.1.332 tries a 400
		// it does not recognise five more times.
		{Error: &modeltest.APIError{Status: 403, Type: "permission_error", Message: "scripted failure"}},
		say("retried fine"),
		say("resumed fine"),
	}}, false)
	input := filepath.Join(t.TempDir(), "q2.csv")
	os.WriteFile(input, []byte("region,revenue\nnorth,10\nsouth,20\n"), 0o644)

	out, errOut, code := hearthIn(t, "", "agents", "run", "analyst", "Analyze Q2 sales", "--input", input, "--budget", "2", c)
	t.Logf("agents run:\n%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("agents run = %d, stderr %q; want 0", code, errOut)
	}
	for _, want := range []string{
		"agent analyst in session session-",
		"tool    Bash: mkdir -p outputs && wc -l < inputs/q2.csv",
		"result  3",
		"file    created outputs/report.md",
		"model   claude-sonnet-4-5: 1,000 in / 100 out tokens, $0.0045, ",
		"text    Wrote outputs/report.md",
		"status  completed",
		"\ncompleted after ",
		"2 model calls, 2,000 in / 200 out tokens, $0.009 of $2.00",
		"result: Wrote outputs/report.md",
		"outputs:\n  outputs/report.md (2 B)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agents run output lacks %q", want)
		}
	}
	first := execIDRe.FindString(out)
	session := regexp.MustCompile(`session-[0-9a-f]{6}`).FindString(out)

	out, errOut, code = hearthIn(t, "", "agents", "run", "analyst", "This one fails", "--max-calls", "4", c)
	t.Logf("failing run:\n%s%s", out, errOut)
	if code != exitError || !strings.Contains(out, "\nfailed after ") || !strings.Contains(out, "scripted failure") {
		t.Errorf("a failing run = %d, stdout %q; want exit 1 and the failure", code, out)
	}
	failed := execIDRe.FindString(out)

	dl := t.TempDir()
	runSteps(t, []step{
		{args: []string{"agents", "list", c}, wantOut: first + "  analyst  " + session + "  completed  call 2/20  $0.009 of $2.00"},
		{args: []string{"agents", "show", first, c}, wantOut: "result     Wrote outputs/report.md"},
		{args: []string{"agents", "show", first, c}, wantOut: "limits     $2.00 (stop at the limit), 20 model calls"},
		{args: []string{"agents", "execution", first, c}, wantOut: "  tool    Bash: mkdir -p outputs"},
		{args: []string{"agents", "logs", first, "--follow", c}, wantOut: "  status  completed"},
		{args: []string{"agents", "outputs", first, c}, wantOut: "outputs/report.md  2 B"},
		{args: []string{"agents", "outputs", first, "--download", dl, c}, wantErr: "downloaded 1 file (2 B) to " + dl},
		{args: []string{"agents", "definitions", c}, wantOut: "analyst  claude-sonnet-4-5  claude-code  claude-code  $5.00, 20 model calls  Analyses data."},
		{args: []string{"agents", "sessions", c}, wantOut: session},
		{args: []string{"agents", "retry", failed, c}, wantOut: "result: retried fine"},
		{args: []string{"agents", "resume", session, "And a summary", "--max-turns", "3", c}, wantOut: "result: resumed fine",
			wantErr: "--max-turns is deprecated: use --max-calls"},
		{args: []string{"agents", "cancel", first, c}, wantCode: exitError, wantErr: "already ended"},
		{args: []string{"agents", "topup", first, "2", c}, wantCode: exitError, wantErr: "already ended"},
		{args: []string{"agents", "topup", first, "lots", c}, wantCode: exitError, wantErr: "not a number of dollars"},
		{args: []string{"agents", "run", "analyst", "go", "--on-budget", "later", c}, wantCode: exitUsage},
		{args: []string{"agents", "run", "nobody", "go", c}, wantCode: exitNotFound, wantErr: `no agent "nobody"`},
		{args: []string{"agents", "run", "analyst", "go", "--budget", "50", c}, wantCode: exitError, wantErr: "may only tighten"},
		{args: []string{"agents", "run", "analyst", c}, wantCode: exitUsage},
		{args: []string{"agents", "show", "exec-00000000", c}, wantCode: exitNotFound},
		{args: []string{"agents", "frobnicate", c}, wantCode: exitUsage},
		{args: []string{"credits", "add", "12.5", "--note", "test", c}, wantOut: "added $12.50; $12.50 available\nnote: credits are off"},
		{args: []string{"credits", "show", c}, wantOut: "available  $12.50"},
		{args: []string{"credits", "add", "-3", c}, wantCode: exitUsage},
	})
	if b, err := os.ReadFile(filepath.Join(dl, "report.md")); err != nil || string(b) != "3\n" {
		t.Errorf("downloaded report = %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(cfg.Workspace.Mount, session, "outputs", "report.md")); err != nil || string(b) != "3\n" {
		t.Errorf("report in the workspace = %q, %v", b, err)
	}
	out, _, code = hearthIn(t, "", "agents", "show", first, "--json", c)
	var e client.Execution
	if code != 0 || json.Unmarshal([]byte(out), &e) != nil || e.Id != first || e.Status != "completed" || e.Turns != 2 {
		t.Errorf("agents show --json = %d %q", code, out)
	}
}

// TestAgentsDetachAndCredits: --detach prints the id at once; with
// credits on, a task over the balance is refused and says what to do.
func TestAgentsDetachAndCredits(t *testing.T) {
	c, _ := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{say("done")}}, true)
	runSteps(t, []step{
		{args: []string{"agents", "run", "analyst", "go", "--budget", "1", c}, wantCode: exitError, wantErr: "hearth credits add"},
		{args: []string{"credits", "add", "2", c}, wantOut: "added $2.00; $2.00 available\n", exactOut: true},
	})
	out, errOut, code := hearthIn(t, "", "agents", "run", "analyst", "go", "--budget", "1", "--detach", c)
	id := strings.TrimSpace(out)
	if code != 0 || !execIDRe.MatchString(id) || !strings.Contains(errOut, "hearth agents execution "+id+" --follow") {
		t.Fatalf("agents run --detach = %d, %q, %q", code, out, errOut)
	}
	runSteps(t, []step{
		{args: []string{"agents", "execution", id, "--follow", c}, wantOut: "status  completed"},
		{args: []string{"credits", "show", c}, wantOut: "credits are on"},
	})
}

// TestAgentsReloadCommand: hearth agents reload lists the agents and
// fails, naming the file, when one does not load.
func TestAgentsReloadCommand(t *testing.T) {
	c, cfg := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{say("done")}}, false)
	os.WriteFile(filepath.Join(cfg.Agents.Dir, "broken.toml"), []byte("image = \"claude-code\"\nmodle = \"x\"\n"), 0o644)
	runSteps(t, []step{
		{args: []string{"agents", "reload", c}, wantCode: exitError, wantOut: "1 agents: analyst\n", exactOut: true, wantErr: "broken.toml"},
	})
	os.WriteFile(filepath.Join(cfg.Agents.Dir, "broken.toml"), []byte("image = \"claude-code\"\nmodel = \"claude-sonnet-4-5\"\n"), 0o644)
	runSteps(t, []step{
		{args: []string{"agents", "reload", c}, wantOut: "2 agents: analyst, broken\n", exactOut: true},
		{args: []string{"agents", "definitions", c}, wantOut: "broken"},
	})
}

// TestAgentsDemoScript runs the scripted model's built-in demo (what the
// README's offline path and hearth-scripted-model play) through the real
// claude CLI, twice: each run gets the whole script, and the report holds
// the input's real totals.
func TestAgentsDemoScript(t *testing.T) {
	demo, _ := json.Marshal(modeltest.Demo())
	script, err := modeltest.ParseScript(demo)
	if err != nil {
		t.Fatal(err)
	}
	c, cfg := agentDaemon(t, script, false)
	input := filepath.Join(t.TempDir(), "q2.csv")
	os.WriteFile(input, []byte("region,revenue,units\nnorth,10,3\nsouth,20.5,4\n"), 0o644)
	for i := range 2 {
		out, errOut, code := hearthIn(t, "", "agents", "run", "analyst", "Analyze Q2 sales", "--input", input, c)
		if i == 0 {
			t.Logf("the demo:\n%s%s", out, errOut)
		}
		session := regexp.MustCompile(`session-[0-9a-f]{6}`).FindString(out)
		report, err := os.ReadFile(filepath.Join(cfg.Workspace.Mount, session, "outputs", "report.md"))
		if code != 0 || !strings.Contains(out, "outputs/report.md") || !strings.Contains(out, "3 model calls") || err != nil ||
			!strings.Contains(string(report), "## q2.csv\n\n- 2 rows\n- revenue: total 30.5, mean 15.25\n- units: total 7, mean 3.5\n") {
			t.Fatalf("demo run %d = %d, stdout %q, stderr %q; report %q, %v", i, code, out, errOut, report, err)
		}
	}
}

func TestUSD(t *testing.T) {
	for v, want := range map[float64]string{0: "$0.00", 0.0045: "$0.0045", 0.009: "$0.009", 0.25: "$0.25", 0.0144: "$0.0144",
		1: "$1.00", 1.245: "$1.25", 1234.5: "$1,234.50", 0.00001: "$0.00"} {
		if got := usd(v); got != want {
			t.Errorf("usd(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for in, want := range map[string]string{"30m0s": "30m", "2h0m0s": "2h", "1h30m0s": "1h30m", "90s": "1m30s", "": "", "x": "x"} {
		if got := shortDuration(in); got != want {
			t.Errorf("shortDuration(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAgentsRunContextFlags: --skill, --context and --mcp-server add to
// the agent's own for one task; a bad flag is a usage error, and a server
// the agent's network list does not allow is refused by the daemon.
func TestAgentsRunContextFlags(t *testing.T) {
	c, cfg := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bash("ls ~/.claude/skills | tr '\\n' ' '; grep -o 'tools/quits.js' ~/.hearth/mcp-agent.json | tr -d '\\n'; cat CLAUDE.md ~/.claude/NOTES.md | tr -d '\\n'"), say("done")}}, false)
	skill := filepath.Join(cfg.Agents.Dir, "skills", "probe")
	os.MkdirAll(skill, 0o755)
	os.WriteFile(filepath.Join(skill, "SKILL.md"), []byte("---\nname: flag-skill\ndescription: Given by a flag.\n---\n"), 0o644)
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "team.md"), []byte("Team rule from a flag.\n"), 0o644)
	os.WriteFile(filepath.Join(local, "notes.md"), []byte("Notes from a flag.\n"), 0o644)
	// A stdio MCP server (that quits at once), placed by a --context flag.
	os.WriteFile(filepath.Join(local, "quits.js"), []byte("process.exit(0);\n"), 0o644)
	out, errOut, code := hearthIn(t, "", "agents", "run", "analyst", "go", "--skill", "skills/probe",
		"--context", filepath.Join(local, "team.md"), "--context", filepath.Join(local, "notes.md")+":~/.claude/NOTES.md",
		"--context", filepath.Join(local, "quits.js")+":tools/quits.js", "--mcp-server", "quits=node tools/quits.js --stdio", c)
	if code != 0 {
		t.Fatalf("agents run with the flags = %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"flag-skill", "tools/quits.js", "Team rule from a flag.Notes from a flag."} {
		if !strings.Contains(out, want) {
			t.Errorf("agents run output lacks %q:\n%s", want, out)
		}
	}
	runSteps(t, []step{
		{args: []string{"agents", "run", "analyst", "go", "--mcp-server", "web=https://mcp.example.com/mcp", c}, wantCode: exitError, wantErr: "add mcp.example.com to network"},
		{args: []string{"agents", "run", "analyst", "go", "--mcp-server", "novalue", c}, wantCode: exitUsage, wantErr: "NAME=URL"},
		{args: []string{"agents", "run", "analyst", "go", "--context", filepath.Join(local, "none.md"), c}, wantCode: exitError, wantErr: "none.md"},
		{args: []string{"agents", "run", "analyst", "go", "--context", local + "/team.md:outputs/x.md", c}, wantCode: exitError, wantErr: "not in outputs/"},
	})
}
