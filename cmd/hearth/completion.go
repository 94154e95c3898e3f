package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"hearth/client"
)

// Shell completion. The scripts are thin: they hand the words typed so far
// to the hidden command `hearth __complete`, which answers one candidate
// per line. Commands, subcommands and flags come from the usage text, so
// completion cannot drift from what the CLI says it takes; names (agents,
// executions, sandboxes, ...) come from the daemon when it is running.

const bashCompletion = `# hearth completion for bash: source it, or put it in /etc/bash_completion.d/hearth
_hearth() {
	local IFS=$'\n'
	COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null)" -- "${COMP_WORDS[COMP_CWORD]}"))
}
complete -o default -F _hearth hearth
`

const zshCompletion = `#compdef hearth
# hearth completion for zsh: put it on $fpath as _hearth, or source it
_hearth() {
	local -a candidates
	candidates=("${(@f)$(${words[1]} __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	compadd -a candidates
}
compdef _hearth hearth
`

const fishCompletion = `# hearth completion for fish: put it in ~/.config/fish/completions/hearth.fish
complete -c hearth -f -a '(hearth __complete (commandline -opc)[2..-1] (commandline -ct) 2>/dev/null)'
`

func cmdCompletion(args []string, stdout io.Writer) error {
	scripts := map[string]string{"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}
	if len(args) != 1 || scripts[args[0]] == "" {
		return usageError{"usage: hearth completion bash|zsh|fish (e.g. hearth completion bash > /etc/bash_completion.d/hearth)"}
	}
	_, err := io.WriteString(stdout, scripts[args[0]])
	return err
}

// command is one line of the usage text: its words and the flags it takes.
type command struct {
	words []string // "agents", "run"
	flags []string // "--budget", ...
}

var flagRe = regexp.MustCompile(`--[a-z][a-z-]*`)

// commands reads the command table out of the usage text. An entry starts
// with "  hearth "; indented lines after it that start with '[' continue
// its flags.
func commands() []command {
	var out []command
	for _, line := range strings.Split(usage, "\n") {
		trimmed := strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "  hearth "); ok {
			c := command{}
			rest, _, _ = strings.Cut(rest, "  ") // the description follows a double space
			for _, w := range strings.Fields(rest) {
				if !isWord(w) {
					break
				}
				c.words = append(c.words, w)
			}
			c.flags = flagRe.FindAllString(rest, -1)
			out = append(out, c)
			continue
		}
		if len(out) > 0 && strings.HasPrefix(trimmed, "[") {
			last := &out[len(out)-1]
			spec, _, _ := strings.Cut(trimmed, "  ")
			last.flags = append(last.flags, flagRe.FindAllString(spec, -1)...)
		}
	}
	return out
}

// isWord says whether w is a literal command word ("agents", "ls|create"
// split later) rather than a placeholder, flag or argument.
func isWord(w string) bool {
	for _, part := range strings.Split(w, "|") {
		if part == "" || !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(part) {
			return false
		}
	}
	return true
}

// complete answers the candidates for the last of args, the words typed
// after "hearth" (the last may be empty: a new word).
func complete(args []string, stdout io.Writer) {
	if len(args) == 0 {
		args = []string{""}
	}
	done, cur := args[:len(args)-1], args[len(args)-1]
	config := ""
	for i, w := range done {
		if w == "--config" && i+1 < len(done) {
			config = done[i+1]
		} else if v, ok := strings.CutPrefix(w, "--config="); ok {
			config = v
		}
	}
	var out []string
	cmds := commands()
	if strings.HasPrefix(cur, "-") {
		for _, c := range matching(cmds, done) {
			out = append(out, c.flags...)
		}
		out = append(out, "--config")
	} else if len(done) > 0 && strings.HasPrefix(done[len(done)-1], "--") && takesValue(done[len(done)-1]) {
		out = nil // a flag's value: let the shell complete files
	} else {
		pos := positional(done)
		for _, c := range cmds {
			if len(c.words) > len(pos) && prefixOf(c.words, pos) {
				out = append(out, strings.Split(c.words[len(pos)], "|")...)
			}
		}
		if len(out) == 0 {
			out = names(pos, config)
		}
		if len(pos) == 0 {
			out = append(out, "completion", "help")
		}
	}
	slices.Sort(out)
	for _, w := range slices.Compact(out) {
		if strings.HasPrefix(w, cur) {
			fmt.Fprintln(stdout, w)
		}
	}
}

// takesValue says whether a flag is followed by a value (not a switch).
func takesValue(flag string) bool {
	switch flag {
	case "--json", "--detach", "--follow", "--all", "--stderr", "-n":
		return false
	}
	return true
}

// positional drops flags and their values from words.
func positional(words []string) []string {
	var pos []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		if strings.HasPrefix(w, "-") {
			if !strings.Contains(w, "=") && takesValue(w) {
				i++
			}
			continue
		}
		pos = append(pos, w)
	}
	return pos
}

// matching are the commands whose words are all typed in done.
func matching(cmds []command, done []string) []command {
	pos := positional(done)
	var out []command
	for _, c := range cmds {
		if len(pos) >= len(c.words) && prefixOf(c.words, pos) {
			out = append(out, c)
		}
	}
	return out
}

func prefixOf(words, typed []string) bool {
	for i, t := range typed {
		if i >= len(words) {
			return true
		}
		if !slices.Contains(strings.Split(words[i], "|"), t) {
			return false
		}
	}
	return true
}

// names asks the daemon for what may come next after pos: an agent,
// execution, session, sandbox, schedule or image. It answers nothing when
// the daemon does not.
func names(pos []string, config string) []string {
	if len(pos) < 2 {
		return nil
	}
	c, err := connect(config)
	if err != nil {
		return nil
	}
	c.Timeout = 2 * time.Second
	ctx := context.Background()
	cmd := pos[0] + " " + pos[1]
	first := len(pos) == 2
	var out []string
	switch {
	case cmd == "agents run" && first:
		defs, _ := c.Agents(ctx)
		for _, d := range defs {
			out = append(out, d.Name)
		}
	case cmd == "agents resume" && first:
		ss, _ := c.AgentSessions(ctx, client.AgentSessionFilter{})
		for _, s := range ss {
			out = append(out, s.Id)
		}
	case slices.Contains([]string{"agents show", "agents execution", "agents logs", "agents outputs", "agents retry", "agents cancel"}, cmd) && first:
		es, _ := c.Executions(ctx, client.ExecutionFilter{})
		for _, e := range es {
			out = append(out, e.Id)
		}
	case strings.HasPrefix(cmd, "sandboxes ") && first && cmd != "sandboxes create" && cmd != "sandboxes ls" && cmd != "sandboxes cp":
		sbs, _ := c.Sandboxes(ctx)
		for _, s := range sbs {
			out = append(out, s.Id)
		}
	case slices.Contains([]string{"schedules rm", "schedules run", "schedules runs"}, cmd) && first:
		ss, _ := c.Schedules(ctx)
		for _, s := range ss {
			out = append(out, s.Id)
		}
	case slices.Contains([]string{"images build", "images inspect", "images rm"}, cmd) && first:
		l, _ := c.Images(ctx)
		for _, im := range l.Images {
			out = append(out, im.Name)
		}
		if cmd == "images build" {
			out = append(out[:0], l.Recipes...)
		}
	}
	return out
}
