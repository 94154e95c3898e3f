package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

// Shell completion is cobra's: its scripts call the hidden
// `hearth __complete WORDS...`, which walks the same tree as dispatch.
// Commands and flags come from the tree, so completion cannot drift from
// what the CLI takes; names (agents, executions, sandboxes, ...) come
// from the daemon when it is running.

func completionCmd() *command {
	return &command{name: "completion", args: "bash|zsh|fish", min: 1, max: 1, choices: []string{"bash", "fish", "zsh"}, setup: cmdCompletion,
		summary: "print a shell completion script\n(bash: hearth completion bash > /etc/bash_completion.d/hearth)",
		example: "hearth completion bash > /etc/bash_completion.d/hearth\nhearth completion zsh > \"${fpath[1]}/_hearth\"\nhearth completion fish > ~/.config/fish/completions/hearth.fish"}
}

func cmdCompletion(*flag.FlagSet) action {
	return func(inv *env) error {
		root := inv.root
		switch inv.args[0] {
		case "bash":
			return root.GenBashCompletionV2(inv.stdout, true)
		case "zsh":
			return root.GenZshCompletion(inv.stdout)
		case "fish":
			return root.GenFishCompletion(inv.stdout, true)
		}
		return usageError{"usage: hearth completion bash|zsh|fish (e.g. hearth completion bash > /etc/bash_completion.d/hearth)"}
	}
}

// completeArgs completes a leaf's first positional argument from its
// choices and, when the daemon answers, its names.
func (c *command) completeArgs(e *env) cobra.CompletionFunc {
	if c.choices == nil && c.names == nil {
		return cobra.NoFileCompletions
	}
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if c.raw {
			args = rawPositional(cmd, args)
		}
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveDefault
		}
		out := append([]string(nil), c.choices...)
		if c.names != nil {
			out = append(out, daemonNames(c.names, e.configFile())...)
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// rawPositional is what a raw leaf's words are once its flags are set
// aside (cobra hands it every word, --config too).
func rawPositional(cmd *cobra.Command, args []string) []string {
	fl := cmd.Flags()
	cmd.LocalFlags()
	fl.SetInterspersed(true)
	defer fl.SetInterspersed(false)
	if fl.Parse(args) != nil {
		return args
	}
	return fl.Args()
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
