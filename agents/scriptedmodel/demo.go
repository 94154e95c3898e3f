package scriptedmodel

import "encoding/json"

// demoReport is the shell command of the demo's second turn: a Markdown
// report on every CSV file in inputs/ (rows, and the total and mean of
// each numeric column), computed by awk in the agent's machine.
const demoReport = `mkdir -p outputs && {
  echo "# Report on the input files"; echo
  found=
  for f in inputs/*.csv; do
    [ -e "$f" ] || continue
    found=1
    echo "## $(basename "$f")"; echo
    awk -F, 'NR==1 { for (i = 1; i <= NF; i++) h[i] = $i; n = NF; next }
      { rows++; for (i = 1; i <= NF; i++) if ($i ~ /^-?[0-9]+([.][0-9]+)?$/) { s[i] += $i; c[i]++ } }
      END { printf "- %d rows\n", rows
            for (i = 1; i <= n; i++) if (rows > 0 && c[i] == rows) printf "- %s: total %g, mean %g\n", h[i], s[i], s[i] / rows }' "$f"
    echo
  done
  [ -n "$found" ] || echo "No CSV file was given in inputs/."; echo
  echo "_Computed by awk in the agent's machine; the steps were scripted by hearth-scripted-model, not chosen by a model._"
} > outputs/report.md && cat outputs/report.md`

// Demo is the built-in demo script: in each conversation the "agent"
// looks at its input files, writes outputs/report.md with the rows and
// column totals of each CSV file (computed for real, by awk, in its
// machine), and answers with a summary. Its usage figures are plausible
// for a small task, so that metering and budgets have something to
// show; its answers arrive a little at a time, so that streaming does.
func Demo() ScriptFile {
	tool := func(command, description string) BlockFile {
		input, _ := json.Marshal(map[string]string{"command": command, "description": description})
		return BlockFile{Type: "tool_use", Name: "Bash", Input: input}
	}
	return ScriptFile{PerConversation: true, Turns: []TurnFile{
		{Blocks: []BlockFile{{Type: "text", Text: "Let me look at the input files first."},
			tool("ls -l inputs/ && head -n 5 inputs/*.csv", "Look at the input files")},
			Usage: Usage{InputTokens: 2400, OutputTokens: 120}, Delay: "100ms"},
		{Blocks: []BlockFile{{Type: "text", Text: "I'll compute the totals and write the report."},
			tool(demoReport, "Write outputs/report.md")},
			Usage: Usage{InputTokens: 2900, OutputTokens: 380}, Delay: "100ms"},
		{Blocks: []BlockFile{{Type: "text", Text: "I wrote outputs/report.md: the number of rows and the total and mean " +
			"of every numeric column of each CSV file in inputs/. (This is hearth-scripted-model's demo script, not a model's answer.)"}},
			Usage: Usage{InputTokens: 3400, OutputTokens: 90}, Delay: "100ms"},
	}, Final: &TurnFile{Blocks: []BlockFile{{Type: "text", Text: "The demo script has nothing more to say in this conversation: " +
		"hearth-scripted-model plays a fixed script, it is not a model."}}, Usage: Usage{InputTokens: 3800, OutputTokens: 40}}}
}
