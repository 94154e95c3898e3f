package agents

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadDefinition(t *testing.T) {
	d, err := LoadDefinition("testdata/agents/data-analyzer.toml")
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "data-analyzer" || d.Image != "claude-code" || d.Limits.USD != 10 || d.Limits.Turns != 50 ||
		time.Duration(d.Limits.WallTime) != 30*time.Minute || len(d.Outputs) != 2 || d.Env["LANG"] != "C.UTF-8" {
		t.Errorf("LoadDefinition = %+v", d)
	}
	got, err := d.Render(Task{Prompt: "Analyze Q2 sales", Inputs: []string{"inputs/q2.csv", "inputs/q1.csv"}, Outputs: d.Outputs})
	if err != nil {
		t.Fatal(err)
	}
	want := "Analyze Q2 sales\n\nYour inputs are in inputs/q2.csv, inputs/q1.csv.\nWrite what you find to outputs/*.md.\n"
	if got != want {
		t.Errorf("Render = %q, want %q", got, want)
	}
}

func TestLoadDefinitionErrors(t *testing.T) {
	const good = "image = \"claude-code\"\nmodel = \"m\"\n"
	tests := []struct{ name, body, want string }{
		{"unknown key", good + "modle = \"x\"\n", "unknown key modle"},
		{"unknown limit", good + "[limits]\nusd = 1\ndollars = 2\n", "unknown key limits.dollars"},
		{"no image", "model = \"m\"\n", "image: missing"},
		{"no model", "image = \"i\"\n", "model: missing"},
		{"unknown cli", good + "cli = \"aider\"\n", `cli = "aider": use one of claude-code, codex, opencode, gemini, command`},
		{"command without cli", good + "command = [\"run\"]\n", `only cli = "command" runs one`},
		{"cli command without command", good + "cli = \"command\"\n", "command: missing"},
		{"empty program", good + "cli = \"command\"\ncommand = [\" \", \"x\"]\n", "first element is the program"},
		{"NUL in command", good + "cli = \"command\"\ncommand = [\"a\\u0000b\"]\n", "NUL"},
		{"skills for codex", good + "cli = \"codex\"\nskills = [\"skills/x\"]\n", `cli = "codex" loads no skills`},
		{"name differs from file", good + "name = \"other\"\n", "must be called other.toml"},
		{"bad name", good + "name = \"Bad_Name\"\n", "name = \"Bad_Name\""},
		{"negative limit", good + "[limits]\nusd = -1\n", "limits.usd = -1: -1 is negative"},
		{"negative turns", good + "[limits]\nturns = -1\n", "must not be negative"},
		{"NaN budget", good + "[limits]\nusd = nan\n", "limits.usd = NaN"},
		{"infinite budget", good + "[limits]\nusd = inf\n", "limits.usd = +Inf"},
		{"budget under the ledger's unit", good + "[limits]\nusd = 1e-9\n", "less than the ledger's unit"},
		{"zone alone (robfig/cron panicked)", good + "schedule = \"TZ=\"\n", "schedule = \"TZ=\""},
		{"every 0s", good + "schedule = \"@every 0s\"\n", "at least 1m0s apart"},
		{"every -5s", good + "schedule = \"@every -5s\"\n", "at least 1m0s apart"},
		{"every 1ns", good + "schedule = \"@every 1ns\"\n", "at least 1m0s apart"},
		{"every 59s", good + "schedule = \"CRON_TZ=UTC @every 59s\"\n", "at least 1m0s apart"},
		{"bad wall time", good + "[limits]\nwall_time = \"soon\"\n", "not a duration"},
		{"output outside outputs", good + "outputs = [\"../x\"]\n", "must be a glob under outputs/"},
		{"output escaping", good + "outputs = [\"outputs/../../etc\"]\n", "must be a glob under outputs/"},
		{"bad glob", good + "outputs = [\"outputs/[\"]\n", "must be a glob under outputs/"},
		{"bad domain", good + "network = [\"http://x\"]\n", "not a domain name"},
		{"bad port", good + "network = [\"x.com:http\"]\n", "not a domain name"},
		{"bad env", good + "[env]\n\"1X\" = \"v\"\n", "not a variable name"},
		{"bad schedule", good + "schedule = \"every day\"\n", "schedule = \"every day\""},
		{"bad template", good + "prompt = \"{{.Prompt\"\n", "prompt:"},
		{"unknown template field", good + "prompt = \"{{.Budget}}\"\n", "prompt"},
		{"syntax", "image = \n", "line 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "agent.toml")
			if tc.name == "name differs from file" {
				file = filepath.Join(t.TempDir(), "mine.toml")
			}
			os.WriteFile(file, []byte(tc.body), 0o644)
			_, err := LoadDefinition(file)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), file) {
				t.Errorf("LoadDefinition(%q) = %v, want an error naming %s and containing %q", tc.body, err, file, tc.want)
			}
		})
	}
}

func TestLoadDefinitions(t *testing.T) {
	defs, err := LoadDefinitions("testdata/agents")
	if err != nil || len(defs) != 1 || defs["data-analyzer"] == nil {
		t.Errorf("LoadDefinitions = %v, %v; want data-analyzer", defs, err)
	}
	if defs, err := LoadDefinitions(filepath.Join(t.TempDir(), "none")); err != nil || len(defs) != 0 {
		t.Errorf("LoadDefinitions(missing dir) = %v, %v; want none", defs, err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "good.toml"), []byte("image = \"i\"\nmodel = \"m\"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "bad.toml"), []byte("image = \"i\"\n"), 0o644)
	defs, err = LoadDefinitions(dir)
	if err == nil || !strings.Contains(err.Error(), "bad.toml") || defs["good"] == nil {
		t.Errorf("LoadDefinitions with one bad file = %v, %v; want good loaded and bad.toml named", defs, err)
	}
}

func TestLimitsTighten(t *testing.T) {
	agent := Limits{USD: 10, Turns: 50, WallTime: Duration(30 * time.Minute)}
	tests := []struct {
		name     string
		override Limits
		want     Limits
		err      string
	}{
		{"none", Limits{}, agent, ""},
		{"tighter", Limits{USD: 5, Turns: 10, WallTime: Duration(time.Minute)}, Limits{USD: 5, Turns: 10, WallTime: Duration(time.Minute)}, ""},
		{"equal", agent, agent, ""},
		{"looser budget", Limits{USD: 20}, agent, "budget $20.00 is more than the agent's $10.00"},
		{"looser turns and time", Limits{Turns: 60, WallTime: Duration(time.Hour)}, agent, "max model calls 60"},
		{"negative", Limits{USD: -1}, agent, "negative"},
		{"NaN budget", Limits{USD: math.NaN()}, agent, "NaN is not a number of dollars"},
		{"budget under the ledger's unit", Limits{USD: 1e-7}, agent, "less than the ledger's unit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := agent.Tighten(tc.override)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("Tighten(%+v) = %v, want error containing %q", tc.override, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("Tighten(%+v) = %+v, %v; want %+v", tc.override, got, err, tc.want)
			}
		})
	}
	// An agent without a limit takes the task's.
	if got, err := (Limits{}).Tighten(Limits{USD: 3}); err != nil || got.USD != 3 {
		t.Errorf("Limits{}.Tighten(usd 3) = %+v, %v", got, err)
	}
}
