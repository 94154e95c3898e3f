package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// completions runs `hearth __complete words...` and returns its lines.
func completions(t *testing.T, words ...string) []string {
	t.Helper()
	out, _, code := hearthIn(t, "", append([]string{"__complete"}, words...)...)
	if code != 0 {
		t.Fatalf("__complete %q exited %d", words, code)
	}
	var got []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, ":") { // cobra's directive ends the candidates
			break
		}
		if name, _, _ := strings.Cut(line, "\t"); name != "" {
			got = append(got, name)
		}
	}
	return got
}

func TestCompletion(t *testing.T) {
	cases := []struct {
		words []string
		want  string
	}{
		{[]string{""}, "agents claims cluster completion credits doctor help images mcp prices sandboxes schedules up version workspace"},
		{[]string{"ag"}, "agents"},
		{[]string{"agents", "r"}, "reload resume retry rewind run"},
		{[]string{"agents", "run", "analyst", "--b"}, "--budget"},
		{[]string{"agents", "run", "analyst", "--budget", ""}, ""}, // a value: the shell's own completion
		{[]string{"sandboxes", "job", ""}, "logs ls start stop"},
		{[]string{"sandboxes", "job", "stop", "x", "j", "--"}, "--config --grace"},
		{[]string{"schedules", "add", "x", "@daily", "a", "p", "--over"}, "--overlap"},
		{[]string{"completion", ""}, "bash fish zsh"},
		{[]string{"nonsense", ""}, ""},
	}
	for _, tc := range cases {
		if got := strings.Join(completions(t, tc.words...), " "); got != tc.want {
			t.Errorf("complete %q = %q, want %q", tc.words, got, tc.want)
		}
	}
	// Every command of the tree has its words completed.
	for _, cmd := range leaves(testTree()) {
		words := commandPath(cmd)
		for i, w := range words {
			prefix := words[:i:i]
			got := completions(t, append(prefix, "")...)
			if !strings.Contains(" "+strings.Join(got, " ")+" ", " "+w+" ") {
				t.Errorf("complete %q lacks %q (got %q)", prefix, w, got)
			}
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		script, _, code := hearthIn(t, "", "completion", shell)
		if code != exitOK || !strings.Contains(script, "__complete") {
			t.Errorf("completion %s = %d, %d bytes; want a script that asks hearth __complete", shell, code, len(script))
		}
	}
	if _, _, code := hearthIn(t, "", "completion", "powershell"); code != exitUsage {
		t.Errorf("completion powershell exited %d, want %d", code, exitUsage)
	}
}

// TestCompletionNames completes names from a running daemon.
func TestCompletionNames(t *testing.T) {
	config, _ := sandboxDaemon(t)
	if out, errb, code := hearthIn(t, "", "sandboxes", "create", config, "named-box"); code != 0 {
		t.Fatalf("create: %s %s", out, errb)
	}
	if got := completions(t, config, "sandboxes", "exec", "na"); strings.Join(got, " ") != "named-box" {
		t.Errorf("sandbox ids = %q, want named-box", got)
	}
	if got := completions(t, config, "images", "rm", ""); strings.Join(got, " ") != "tiny" {
		t.Errorf("image names = %q, want tiny", got)
	}
}

// TestCompletionBash loads the bash script in a real bash and completes
// as bash would, through the real binary.
func TestCompletionBash(t *testing.T) {
	bashPath, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not on PATH")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("building the hearth binary needs the go command on PATH")
	}
	bin := filepath.Join(t.TempDir(), "hearth")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// cobra's script uses the bash-completion package's helpers.
	const helpers = "/usr/share/bash-completion/bash_completion"
	if _, err := os.Stat(helpers); err != nil {
		t.Skip(helpers + ": not found (Debian package bash-completion)")
	}
	script, _, _ := hearthIn(t, "", "completion", "bash")
	path := filepath.Join(t.TempDir(), "hearth.bash")
	os.WriteFile(path, []byte(script), 0o644)
	cmd := exec.Command(bashPath, "--norc", "-c", `source "$3"; source "$1"; COMP_WORDS=("$2" agents re); COMP_CWORD=2; COMP_LINE="$2 agents re"; COMP_POINT=${#COMP_LINE}; __start_hearth; echo "${COMPREPLY[*]}"`, "bash", path, bin, helpers)
	out, err := cmd.Output() // stderr has compopt's complaint outside a real completion
	if err != nil || strings.TrimSpace(string(out)) != "reload resume retry rewind" {
		t.Fatalf("bash completion of 'hearth agents re' = %q, %v; want reload resume retry rewind", out, err)
	}
}
