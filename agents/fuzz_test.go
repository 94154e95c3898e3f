package agents

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/robfig/cron/v3"

	"hearth/agents/store"
)

// FuzzAgentDefinition loads arbitrary bytes as an agent file: no panic,
// and what loads is valid: money the ledger holds (no NaN or Inf), no
// negative limit, a schedule the scheduler takes, a prompt that renders.
func FuzzAgentDefinition(f *testing.F) {
	files, _ := filepath.Glob("testdata/agents/*.toml")
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		"image = \"i\"\nmodel = \"m\"\n",
		"image = \"i\"\nmodel = \"m\"\n[limits]\nusd = nan\n",
		"image = \"i\"\nmodel = \"m\"\n[limits]\nusd = -inf\nturns = -1\nwall_time = \"-1s\"\n",
		"image = \"i\"\nmodel = \"m\"\n[limits]\nusd = 1e-9\n",
		"image = \"i\"\nmodel = \"m\"\nschedule = \"@every 1ns\"\n",
		"image = \"i\"\nmodel = \"m\"\nschedule = \"CRON_TZ=UTC @every 90s\"\nprompt = \"{{.Prompt}} {{range .Inputs}}{{.}}{{end}}\"\n",
		"image = \"i\"\nmodel = \"m\"\noutputs = [\"outputs/*.md\"]\nnetwork = [\"*.example.com:8443\"]\n[env]\nA = \"b\"\n",
		"image = \"i\"\nmodel = \"m\"\nnetwork = [\"x.com\"]\nskills = [\"session:s/k\"]\n[[mcp_servers]]\nname = \"a\"\nurl = \"https://x.com/m\"\nheaders = { H = \"v\" }\n" +
			"[[mcp_servers]]\nname = \"b\"\ncommand = [\"node\", \"s.js\"]\nenv = { K = \"v\" }\n[[context]]\nfile = \"fuzz.toml\"\nto = \"~/.claude/CLAUDE.md\"\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(dir, "fuzz.toml")
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		d, err := LoadDefinition(file)
		if err != nil {
			return
		}
		if err := store.CheckUSD(d.Limits.USD); err != nil {
			t.Errorf("accepted limits.usd = %v: %v", d.Limits.USD, err)
		}
		if d.Limits.Turns < 0 || d.Limits.WallTime < 0 {
			t.Errorf("accepted negative limits %+v", d.Limits)
		}
		if d.Schedule != "" {
			s, err := parseSchedule(d.Schedule)
			if err != nil {
				t.Fatalf("accepted schedule %q does not parse: %v", d.Schedule, err)
			}
			if err := CheckEvery(s); err != nil {
				t.Errorf("accepted schedule %q: %v", d.Schedule, err)
			}
			if every, ok := s.(cron.ConstantDelaySchedule); ok && every.Delay < MinEvery {
				t.Errorf("accepted schedule %q fires every %v", d.Schedule, every.Delay)
			}
		}
		if err := d.validate(); err != nil {
			t.Errorf("accepted definition fails validate again: %v", err)
		}
		for _, m := range d.MCPServers {
			if m.Name == ReservedMCPServer || (len(m.Command) > 0) == (m.URL != "") {
				t.Errorf("accepted MCP server %+v", m)
			}
		}
		for _, c := range d.Context {
			if to, err := contextTarget(c.To); err != nil || strings.HasPrefix(to, "outputs/") || strings.HasPrefix(to, skillsDir) {
				t.Errorf("accepted context %+v going to %q, %v", c, to, err)
			}
		}
		if _, err := d.Render(Task{Prompt: "p", Inputs: []string{"inputs/a"}, Session: "s", Outputs: d.Outputs}); err != nil {
			t.Errorf("accepted definition does not render: %v", err)
		}
	})
}
