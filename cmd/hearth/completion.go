package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"hearth/client"
)

// Shell completion. The scripts are thin: they hand the words typed so far
// to the hidden command `hearth __complete`, which answers one candidate
// per line. Commands, subcommands and flags come from the command tree, so
// completion cannot drift from what the CLI takes; names (agents,
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

func cmdCompletion(*flag.FlagSet) action {
	return func(inv *env) error {
		scripts := map[string]string{"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}
		if scripts[inv.args[0]] == "" {
			return usageError{"usage: hearth completion bash|zsh|fish (e.g. hearth completion bash > /etc/bash_completion.d/hearth)"}
		}
		_, err := io.WriteString(inv.stdout, scripts[inv.args[0]])
		return err
	}
}

// cmdComplete is the hidden `hearth __complete WORDS...`.
func cmdComplete(*flag.FlagSet) action {
	return func(inv *env) error {
		complete(inv.args, inv.stdout)
		return nil
	}
}

// complete answers the candidates for the last of args, the words typed
// after "hearth" (the last may be empty: a new word). It walks the
// command tree along the words typed: a group offers its commands, a
// leaf its flags, and names from the daemon for its first argument.
func complete(args []string, stdout io.Writer) {
	if len(args) == 0 {
		args = []string{""}
	}
	done, cur := args[:len(args)-1], args[len(args)-1]
	root := tree()
	node, path, config := root, []string{}, ""
	var fl *flag.FlagSet
	pos, valueNext := 0, false
	for i, w := range done {
		if valueNext {
			valueNext = false
			continue
		}
		if strings.HasPrefix(w, "-") {
			name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if name == "config" && !hasValue && i+1 < len(done) {
				config = done[i+1]
			} else if v, ok := strings.CutPrefix(w, "--config="); ok {
				config = v
			}
			valueNext = !hasValue && takesValue(fl, name)
			continue
		}
		if node == nil {
			continue
		}
		if node.setup != nil {
			pos++
			continue
		}
		node = node.find(w)
		if node != nil {
			path = append(path, node.name)
			if node.setup != nil {
				fl, _ = node.flags(strings.Join(path, " "))
			}
		}
	}
	var out []string
	switch {
	case node == nil:
	case strings.HasPrefix(cur, "-"):
		out = append(out, "--config")
		if fl != nil {
			out = nil
			fl.VisitAll(func(f *flag.Flag) { out = append(out, flagName(f.Name)) })
		}
	case valueNext:
		// a flag's value: let the shell complete files
	case node.setup == nil:
		for _, s := range node.subs {
			if !s.hidden {
				out = append(out, s.name)
			}
		}
		if node == root {
			out = append(out, "help")
		}
	case pos == 0:
		out = append(out, node.choices...)
		if node.names != nil {
			out = append(out, daemonNames(node.names, config)...)
		}
	}
	slices.Sort(out)
	for _, w := range slices.Compact(out) {
		if strings.HasPrefix(w, cur) {
			fmt.Fprintln(stdout, w)
		}
	}
}

// takesValue says whether flag name of fl is followed by a value (not a
// switch); outside a leaf only --config is.
func takesValue(fl *flag.FlagSet, name string) bool {
	if fl == nil {
		return name == "config"
	}
	f := fl.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// daemonNames asks the daemon for names to complete; nothing when it does
// not answer within two seconds.
func daemonNames(names func(context.Context, *client.Client) []string, config string) []string {
	c, err := connect(config)
	if err != nil {
		return nil
	}
	c.Timeout = 2 * time.Second
	return names(context.Background(), c)
}

// Names the daemon has, for completion.

func agentNames(ctx context.Context, c *client.Client) []string {
	defs, _ := c.Agents(ctx)
	return collect(defs, func(d client.AgentDefinition) string { return d.Name })
}

func agentSessionIDs(ctx context.Context, c *client.Client) []string {
	ss, _ := c.AgentSessions(ctx, client.AgentSessionFilter{})
	return collect(ss, func(s client.AgentSession) string { return s.Id })
}

func executionIDs(ctx context.Context, c *client.Client) []string {
	es, _ := c.Executions(ctx, client.ExecutionFilter{})
	return collect(es, func(e client.Execution) string { return e.Id })
}

func sandboxIDs(ctx context.Context, c *client.Client) []string {
	sbs, _ := c.Sandboxes(ctx)
	return collect(sbs, func(s client.Sandbox) string { return s.Id })
}

func scheduleIDs(ctx context.Context, c *client.Client) []string {
	ss, _ := c.Schedules(ctx)
	return collect(ss, func(s client.Schedule) string { return s.Id })
}

func imageNames(ctx context.Context, c *client.Client) []string {
	l, _ := c.Images(ctx)
	return collect(l.Images, func(im client.Image) string { return im.Name })
}

func recipeNames(ctx context.Context, c *client.Client) []string {
	l, _ := c.Images(ctx)
	return l.Recipes
}

func collect[T any](list []T, name func(T) string) []string {
	out := make([]string, 0, len(list))
	for _, x := range list {
		out = append(out, name(x))
	}
	return out
}
