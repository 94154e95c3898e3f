package main

import (
	"encoding/json"
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/client"
)

func TestSafe(t *testing.T) {
	for _, tc := range []struct{ in, one, lines string }{
		{"plain café ✓ \\n", "plain café ✓ \\n", "plain café ✓ \\n"},
		{"a\x1b[2Jb", `a\x1b[2Jb`, `a\x1b[2Jb`},
		{"t\x1b]0;pwned\a", `t\x1b]0;pwned\a`, `t\x1b]0;pwned\a`},
		{"x\ny\tz\r", `x\ny\tz\r`, "x\ny\tz\\r"},
		{"c1 \u009b31m", `c1 \u009b31m`, `c1 \u009b31m`},
		{"bidi \u202eevil", `bidi \u202eevil`, `bidi \u202eevil`},
		{"bad \xff utf8", `bad \xff utf8`, `bad \xff utf8`},
		{"del\x7f", `del\x7f`, `del\x7f`},
	} {
		if got := safe(tc.in); got != tc.one {
			t.Errorf("safe(%q) = %q, want %q", tc.in, got, tc.one)
		}
		if got := safeLines(tc.in); got != tc.lines {
			t.Errorf("safeLines(%q) = %q, want %q", tc.in, got, tc.lines)
		}
	}
}

// TestHostileTerminalEscapes: an agent writes an output file whose name
// has an escape sequence and a newline, prints escape sequences as tool
// output, and answers with some: what 'hearth agents run', 'show',
// 'execution' and 'outputs' print for people has no control character
// but newlines, while --json keeps the bytes exact.
func TestHostileTerminalEscapes(t *testing.T) {
	const answer = "done \x1b[31mRED\x1b[0m \x1b]0;pwned\a\u009b2J"
	c, _ := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bash(`mkdir -p outputs && echo x > "outputs/$(printf 'evil\033[2J\nfake.md')" && printf '\033]0;owned\007\033[2Jcleared\r\n'`),
		say(answer),
	}}, false)
	out, errOut, code := hearthIn(t, "", "agents", "run", "analyst", "go", c)
	if code != 0 {
		t.Fatalf("agents run = %d, %q, %q", code, out, errOut)
	}
	id := execIDRe.FindString(out)
	for _, want := range []string{`file    created outputs/evil\x1b[2J\nfake.md`, `result  \x1b]0;owned\a\x1b[2Jcleared`, `result: done \x1b[31mRED\x1b[0m \x1b]0;pwned\a\u009b2J`} {
		if !strings.Contains(out, want) {
			t.Errorf("agents run output lacks %q:\n%s", want, out)
		}
	}
	noControls(t, "agents run", out)
	for _, args := range [][]string{{"show", id}, {"execution", id}, {"outputs", id}} {
		out, errOut, code := hearth(t, append(append([]string{"agents"}, args...), c)...)
		if code != 0 || !strings.Contains(out, `\x1b`) {
			t.Errorf("agents %s = %d, %q, %q; want the escapes shown escaped", args, code, out, errOut)
		}
		noControls(t, "agents "+strings.Join(args, " "), out)
	}
	out, _, code = hearth(t, "agents", "show", id, "--json", c)
	var e client.Execution
	if code != 0 || json.Unmarshal([]byte(out), &e) != nil || e.Result != answer || len(e.Outputs) != 1 || e.Outputs[0] != "outputs/evil\x1b[2J\nfake.md" {
		t.Errorf("agents show --json = %d, %q; want the exact bytes", code, out)
	}
}

// noControls fails if text has a control character other than newline,
// or a C1 control.
func noControls(t *testing.T, what, text string) {
	t.Helper()
	for i, r := range text {
		if (r < 0x20 && r != '\n') || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			t.Errorf("%s printed control character %U at byte %d: %q", what, r, i, text[max(0, i-20):min(len(text), i+20)])
			return
		}
	}
}
