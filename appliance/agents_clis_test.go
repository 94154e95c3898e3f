package appliance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/appliance/appliancetest"
)

// cliAgent is an agent definition running another CLI than Claude Code.
const cliAgent = `description = "Codes with %s."
image = %q
model = %q
outputs = ["outputs/*.md"]

[limits]
usd = 5.0
wall_time = "10m"
`

// startCLIDaemon is startAgentDaemon with an agent "coder" running the
// CLI of image with model, and the scripted model serving as OpenAI and
// Gemini too, with their built-in price tables.
func startCLIDaemon(t testing.TB, img, model string, script modeltest.Config, edit func(*Config)) *agentEnv {
	t.Helper()
	appliancetest.Images(t, img)
	script.SideCall = &modeltest.Turn{Blocks: []modeltest.Block{
		modeltest.Text(`{"complexity_reasoning": "simple", "complexity_score": 5}`)}} // Gemini CLI's router, OpenCode's title
	return startAgentDaemon(t, script, func(cfg *Config) {
		def := fmt.Sprintf(cliAgent, img, img, model)
		if err := os.WriteFile(filepath.Join(cfg.AgentsDir(), "coder.toml"), []byte(def), 0o644); err != nil {
			t.Fatal(err)
		}
		p := ProviderConfig{Upstream: cfg.Model.Upstream, APIKeyFile: cfg.Model.APIKeyFile}
		cfg.Providers = map[string]ProviderConfig{"openai": p, "gemini": p}
		if edit != nil {
			edit(cfg)
		}
	})
}

var toolNameRe = regexp.MustCompile(`"name": ?"[^"]*(agents|delegate)[^"]*"`)

// TestAgentsInsideCLIs: Codex, OpenCode and Gemini CLI are each started
// with the hearth MCP server as Claude Code is: the model is offered its
// tools (under each CLI's own naming; Codex's through its tool search),
// and the CLI calls list_agents through it when the model asks, the
// answer reaching the next request.
// hearth agents definitions shows each one's CLI, from its image.
func TestAgentsInsideCLIs(t *testing.T) {
	for _, c := range []struct {
		image, model, tool string
		search             bool // the tools are deferred: search first
	}{
		{"codex", "gpt-5.5", "mcp__hearth__list_agents", true},
		{"opencode", "gpt-5.5", "hearth_list_agents", false},
		{"gemini", "gemini-2.5-pro", "mcp_hearth_list_agents", false},
	} {
		t.Run(c.image, func(t *testing.T) {
			var turns []modeltest.Turn
			if c.search {
				// Codex offers MCP tools only through its tool_search:
				// the model searches, Codex answers with the matching
				// tools (the hearth server's namespace), then the model
				// calls one.
				turns = append(turns, modeltest.Turn{Blocks: []modeltest.Block{
					modeltest.ToolUse("tool_search", map[string]any{"query": "hearth list_agents"})}})
			}
			turns = append(turns,
				modeltest.Turn{Blocks: []modeltest.Block{modeltest.ToolUse(c.tool, map[string]any{})}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}},
				textTurn("The analyst can do it."))
			env := startCLIDaemon(t, c.image, c.model, modeltest.Config{Turns: turns}, nil)
			ctx := context.Background()
			defs, err := env.c.Agents(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range defs {
				if want := map[string]string{"analyst": "claude-code", "coder": c.image}[d.Name]; d.Cli != want {
					t.Errorf("agent %s: cli %q, want %q (from its image)", d.Name, d.Cli, want)
				}
			}
			e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "coder", Prompt: "Who can analyse data?", Wait: true})
			if err != nil {
				t.Fatal(err)
			}
			evs := allEvents(t, env.c, e.Id)
			if e.Status != "completed" || e.Result != "The analyst can do it." {
				t.Fatalf("execution %+v\nevents:\n%s", e, eventDump(evs))
			}
			var offered, answered bool
			for _, r := range env.model.Requests() {
				body := string(r.Body)
				offered = offered || strings.Contains(body, "delegate_task") && strings.Contains(body, "claim_path")
				answered = answered || strings.Contains(body, "Analyses data files and writes a report.")
			}
			if !offered || !answered {
				for _, r := range env.model.Requests() {
					t.Logf("request %s tools: %q", r.Path, toolNameRe.FindAllString(string(r.Body), -1))
				}
				t.Errorf("the model was offered the hearth tools: %v; list_agents' answer reached it: %v\nevents:\n%s", offered, answered, eventDump(evs))
			}
			if countEvents(evs, "tool_call", "list_agents") != 1 || countEvents(evs, "tool_result", "analyst") == 0 {
				t.Errorf("the stream lacks the MCP tool call and its result:\n%s", eventDump(evs))
			}
		})
	}
}

// TestAgentCLIsInQEMU runs a two-call task with each other CLI in a real
// VM, as TestAgentInQEMU does with Claude Code: QEMU (under TCG here),
// the gateway through a port forwarded to the VM's loopback, the output
// written through virtio-fs into the session.
func TestAgentCLIsInQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not on PATH: apt-get install qemu-system-x86 (scripts/test.sh does)")
	}
	for _, c := range []struct{ image, model, tool string }{
		{"codex", "gpt-5.5", "exec_command"},
		{"opencode", "gpt-5.5", "bash"},
		{"gemini", "gemini-2.5-pro", "run_shell_command"},
	} {
		t.Run(c.image, func(t *testing.T) {
			command := "mkdir -p outputs; id > outputs/who.md; uname -r >> outputs/who.md"
			input := map[string]string{"command": command, "description": "step"}
			if c.tool == "exec_command" {
				input = map[string]string{"cmd": command}
			}
			env := startCLIDaemon(t, c.image, c.model, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
				{Blocks: []modeltest.Block{modeltest.ToolUse(c.tool, input)}, Usage: modeltest.Usage{InputTokens: 100}},
				textTurn("done")}},
				func(cfg *Config) { cfg.Sandbox.Tier = TierQEMU; cfg.Sandbox.AllowTCG = true })
			ctx := context.Background()
			start := time.Now()
			e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "coder", Prompt: "go"})
			if err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(8 * time.Minute); !Ended(e) && time.Now().Before(deadline); time.Sleep(time.Second) {
				if e, err = env.c.Execution(ctx, e.Id); err != nil {
					t.Fatal(err)
				}
			}
			if e.Status != "completed" || !slices.Contains(e.Outputs, "outputs/who.md") {
				t.Fatalf("execution in a VM = %+v\n%s", e, eventDump(allEvents(t, env.c, e.Id)))
			}
			t.Logf("%s in a VM under TCG: created to completed in %v", c.image, time.Since(start).Round(time.Second))
			var who strings.Builder
			if _, err := env.c.DownloadOutput(ctx, e.Id, "outputs/who.md", &who); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(who.String(), "uid=1000(agent)") || !strings.Contains(who.String(), "cloud-amd64") {
				t.Errorf("who.md = %q: want the agent user and the VM's own cloud kernel", who.String())
			}
		})
	}
}

// BenchmarkAgentCLIs runs the same two-call task (a shell tool call that
// writes outputs/report.md, then an answer) with each CLI, Claude Code as
// the baseline, interleaved in every iteration: each in its own daemon on
// the jail tier against its own scripted model, one at a time. It
// reports, per CLI, the median time from creating the execution to its
// completion (ms-NAME), the host memory it took at its peak (MiB-NAME:
// the largest fall of MemAvailable, sampled every 50 ms, from just
// before), and its time against Claude Code's (x-NAME-vs-claude).
func BenchmarkAgentCLIs(b *testing.B) {
	command := "mkdir -p outputs && echo done > outputs/report.md"
	shell := map[string]modeltest.Block{
		"claude-code": modeltest.ToolUse("Bash", map[string]string{"command": command, "description": "step"}),
		"codex":       modeltest.ToolUse("exec_command", map[string]string{"cmd": command}),
		"opencode":    modeltest.ToolUse("bash", map[string]string{"command": command, "description": "step"}),
		"gemini":      modeltest.ToolUse("run_shell_command", map[string]string{"command": command, "description": "step"}),
	}
	models := map[string]string{"codex": "gpt-5.5", "opencode": "gpt-5.5", "gemini": "gemini-2.5-pro"}
	names := []string{"claude-code", "codex", "opencode", "gemini"}
	envs := map[string]*agentEnv{}
	for _, name := range names {
		script := modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
			{Blocks: []modeltest.Block{shell[name]}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 50}},
			textTurn("done")}}
		if name == "claude-code" {
			envs[name] = startAgentDaemon(b, script, nil)
		} else {
			envs[name] = startCLIDaemon(b, name, models[name], script, nil)
		}
	}
	agent := func(name string) string {
		if name == "claude-code" {
			return "analyst"
		}
		return "coder"
	}
	ctx := context.Background()
	run := func(name string) (time.Duration, int64) {
		runtime.GC()
		free0 := memAvailable(b)
		stop, peak := sampleMemory(b)
		t0 := time.Now()
		e, err := envs[name].c.Delegate(ctx, DelegateRequest{Agent: agent(name), Prompt: "go", Wait: true})
		took := time.Since(t0)
		stop()
		if err != nil {
			b.Fatal(err)
		}
		if e.Status != "completed" || e.Turns < 2 || !slices.Contains(e.Outputs, "outputs/report.md") {
			b.Fatalf("%s: execution %+v", name, e)
		}
		return took, free0 - peak()
	}
	for _, name := range names {
		run(name) // warm: the image's files in the page cache, the daemon's first run done
	}
	took := map[string][]time.Duration{}
	mem := map[string]int64{}
	for b.Loop() {
		for _, name := range names {
			d, m := run(name)
			took[name] = append(took[name], d)
			mem[name] = max(mem[name], m)
		}
	}
	base := median(took["claude-code"])
	for _, name := range names {
		b.ReportMetric(float64(median(took[name]).Milliseconds()), "ms-"+name)
		b.ReportMetric(float64(mem[name])/(1<<20), "MiB-"+name)
		if name != "claude-code" {
			b.ReportMetric(float64(median(took[name]))/float64(base), "x-"+name+"-vs-claude")
		}
	}
}
