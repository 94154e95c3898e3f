// Command hearth is the Hearth CLI: `hearth up` runs the appliance daemon,
// the other commands drive it through its API with hearth/client. The
// commands are one tree of values (tree, command.go), one file per
// command: each names its arguments, flags, example and action. cobra
// dispatches on it and answers -h, shell completion and the generated
// docs (docs/cli/) from it. Every --json prints with printJSON.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

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

// exitCodesText ends the root's help (and docs/cli/hearth.md).
const exitCodesText = `
Every command takes --config FILE to find the daemon (default
/etc/hearth/hearth.toml if it exists, else built-in defaults); with
HEARTH_ADDR=host:port and HEARTH_TOKEN set, commands use a daemon's TCP
API (api.tcp) instead. Exit codes:
0 ok, 1 failed, 2 bad command line, 3 not found, 4 daemon not running;
sandboxes exec exits with the command's own status (128+N if killed by
signal N); agents run, retry and resume exit 0 when the execution
completed and 1 when it ended otherwise (failed, budget_exceeded,
timed_out, cancelled, interrupted), 130 if Ctrl-C stopped the following
(the execution goes on in the daemon).`

// tree is every command of the CLI.
func tree() *command {
	return &command{subs: []*command{
		upCmd(),
		doctorCmd(),
		mcpCmd(),
		versionCmd(),
		workspaceCmd(),
		sandboxesCmd(),
		agentsCmd(),
		claimsCmd(),
		creditsCmd(),
		pricesCmd(),
		schedulesCmd(),
		clusterCmd(),
		imagesCmd(),
		completionCmd(),
		docsCmd(),
	}}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root, _ := rootCmd(stdin, stdout, stderr)
	root.SetArgs(args)
	return exitCode(root.Execute(), stderr)
}

// rootCmd is the cobra tree of the CLI, and the env its leaves run with.
func rootCmd(stdin io.Reader, stdout, stderr io.Writer) (*cobra.Command, *env) {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, config: new(string)}
	t := tree()
	root := &cobra.Command{
		Use:               "hearth",
		Short:             "hearth: a workspace computer for AI agents",
		Long:              "hearth: a workspace computer for AI agents. 'hearth up' runs the daemon;\nthe other commands drive it through its API.\n" + exitCodesText,
		Example:           "  hearth up --config /etc/hearth/hearth.toml\n  hearth agents run analyst \"summarize inputs/\" --input report.pdf\n  hearth version",
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		Args:              cobra.NoArgs,
	}
	root.PersistentFlags().StringVar(e.config, "config", "", "the config file that says where the daemon is (default: /etc/hearth/hearth.toml if it exists, else built-in defaults)")
	showVersion := root.Flags().Bool("version", false, "print the versions of the CLI, the daemon and the images' agent CLIs")
	root.RunE = func(cmd *cobra.Command, _ []string) error {
		if *showVersion {
			if err := printVersion(e, false); err != nil {
				return actionError{err}
			}
			return nil
		}
		return cmd.Help()
	}
	for _, s := range t.subs {
		root.AddCommand(s.build(e, noWrap))
	}
	e.root = root
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetHelpTemplate(helpTemplate)
	root.SetUsageTemplate(helpTemplate)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	return root, e
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
	var act actionError
	fmt.Fprintf(stderr, "hearth: %v\n", err)
	switch {
	case errors.As(err, &ue), !errors.As(err, &act):
		return exitUsage // cobra refused the command line, or an action did
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
