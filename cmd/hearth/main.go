// Command hearth is the Hearth CLI: `hearth up` runs the appliance daemon,
// the other commands drive it through its API with hearth/client. The
// commands are one tree of values (tree, command.go): each names its
// arguments, flags and action, and dispatch, -h, the usage text and shell
// completion are all read from it. Every --json prints with printJSON.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"hearth/appliance"
	"hearth/client"
)

// Exit codes scripts can rely on.
const (
	exitOK       = 0
	exitError    = 1 // the operation failed
	exitUsage    = 2 // bad command line
	exitNotFound = 3 // no such session, snapshot, sandbox, image, agent, execution or schedule
	exitDown     = 4 // the daemon is not running
)

// usageHead and usageFoot frame the usage text; its commands come from
// the tree.
const usageHead = `hearth: a workspace computer for AI agents

Usage:
`

const usageFoot = `
Every command but up takes --config FILE to find the daemon (default
/etc/hearth/hearth.toml if it exists, else built-in defaults); with
HEARTH_ADDR=host:port and HEARTH_TOKEN set, commands use a daemon's TCP
API (api.tcp) instead. 'hearth COMMAND -h' shows a command's flags and
their defaults. Exit codes:
0 ok, 1 failed, 2 bad command line, 3 not found, 4 daemon not running;
sandboxes exec exits with the command's own status (128+N if killed by
signal N); agents run, retry and resume exit 0 when the execution
completed and 1 when it ended otherwise (failed, budget_exceeded,
timed_out, cancelled, interrupted), 130 if Ctrl-C stopped the following
(the execution goes on in the daemon).
`

// usage is the CLI's usage text.
func usage() string {
	var b strings.Builder
	b.WriteString(usageHead)
	tree().writeUsage(&b, "")
	b.WriteString(usageFoot)
	return b.String()
}

// tree is every command of the CLI.
func tree() *command {
	return &command{subs: []*command{
		{name: "up", summary: "run the daemon (mounts the workspace)", max: -1, setup: cmdUp},
		{name: "doctor", summary: "what this host offers and the tier Hearth uses", max: -1, setup: cmdDoctor},
		{name: "mcp", summary: "serve MCP on stdin/stdout (delegate tasks to agents,\nread their outputs); the daemon also serves it at /mcp", setup: cmdMCP},
		workspaceCmd(),
		sandboxesCmd(),
		agentsCmd(),
		claimsCmd(),
		creditsCmd(),
		pricesCmd(),
		schedulesCmd(),
		imagesCmd(),
		{name: "completion", args: "bash|zsh|fish", summary: "print a shell completion script\n(bash: hearth completion bash > /etc/bash_completion.d/hearth)",
			min: 1, max: 1, noConfig: true, choices: []string{"bash", "fish", "zsh"}, setup: cmdCompletion},
		{name: "__complete", hidden: true, max: -1, raw: true, noConfig: true, setup: cmdComplete},
	}}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || isHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, usage())
		return exitOK
	}
	root := tree()
	c := root.find(args[0])
	if c == nil {
		fmt.Fprintf(stderr, "hearth: unknown command %q\n\n%s", args[0], usage())
		return exitUsage
	}
	return exitCode(c.run(c.name, args[1:], &env{stdin: stdin, stdout: stdout, stderr: stderr}), stderr)
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// statusError ends the CLI with a command's own exit status; what went
// wrong was said already.
type statusError struct{ code int }

func (e statusError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var se statusError
	if errors.As(err, &se) {
		return se.code
	}
	var ue usageError
	var ae *client.APIError
	fmt.Fprintf(stderr, "hearth: %v\n", err)
	switch {
	case errors.As(err, &ue), errors.Is(err, flag.ErrHelp):
		return exitUsage
	case errors.Is(err, client.ErrDaemonDown):
		return exitDown
	case errors.As(err, &ae) && ae.Code == "not_found":
		return exitNotFound
	}
	return exitError
}

// loadConfig reads the config named by --config, or the default file when
// it exists, or the defaults.
func loadConfig(path string) (appliance.Config, error) {
	if path == "" {
		path = "/etc/hearth/hearth.toml"
		if _, err := os.Stat(path); err != nil {
			return appliance.DefaultConfig(), nil
		}
	}
	return appliance.LoadConfig(path)
}

// flags parses args with fs, allowing flags after positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, flagError(err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// flagError is a usage error for what the flag package refused; -h stays
// flag.ErrHelp, for the tree to answer with the command's help.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err.Error()}
}
