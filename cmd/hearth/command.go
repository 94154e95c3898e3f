package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

// The CLI is one tree of commands (tree, in main.go), declared as values
// of command and turned into a cobra tree by build: cobra does dispatch,
// -h, the usage text, shell completion and the generated docs from it, so
// none of them can drift from what the commands take.

// command is a group of subcommands (subs) or a leaf that runs (setup).
// A leaf is a small constructor in its own file: its setup declares its
// flags and returns its action.
type command struct {
	name    string
	aliases []string
	// args are its positional arguments as the usage shows them, like
	// `AGENT "PROMPT"`; summary says what it does (lines after the first
	// continue it); example is one or more command lines that use it.
	args, summary, example string
	// min and max bound its positional arguments; max < 0 is no bound.
	min, max int
	// setup declares the leaf's flags on fl (--config is the root's, for
	// every command) and returns what runs once they are parsed.
	setup func(fl *flag.FlagSet) action
	// raw leaves parse their own arguments with fl (exec: what follows
	// the command to run is its own): their action gets every argument.
	raw bool
	// choices or names complete the first positional argument: a fixed
	// list, or what the daemon has.
	choices []string
	names   func(ctx context.Context, c *client.Client) []string
	// subs are a group's commands; wrap, if set, adds to their errors.
	subs   []*command
	wrap   func(error) error
	hidden bool
}

// action is a leaf's work, run with its parsed command line.
type action func(e *env) error

// env is what a leaf runs with.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// args are the positional arguments (a raw leaf's: all of them).
	args   []string
	config *string // --config, read once the flags are parsed
	// help prints the command's help (raw leaves see -h themselves).
	help func() error
	// root is the whole tree, for completion scripts and docs.
	root *cobra.Command
}

// client connects to the daemon named by --config (or $HEARTH_ADDR).
func (e *env) client() (*client.Client, error) { return connect(e.configFile()) }

func (e *env) configFile() string {
	if e.config == nil {
		return ""
	}
	return *e.config
}

// actionError marks an error an action returned, as against one cobra
// returned for the command line (a usage error).
type actionError struct{ err error }

func (e actionError) Error() string { return e.err.Error() }
func (e actionError) Unwrap() error { return e.err }

// build turns c into a cobra command; e is shared by the whole tree and
// wrap is what the groups above add to errors.
func (c *command) build(e *env, wrap func(error) error) *cobra.Command {
	cc := &cobra.Command{
		Use: strings.TrimSpace(c.name + " " + c.args), Aliases: c.aliases, Hidden: c.hidden,
		Short: strings.ReplaceAll(c.summary, "\n", " "), Example: indent(c.example),
	}
	if c.wrap != nil {
		wrap = chainWrap(wrap, c.wrap)
	}
	if c.setup == nil {
		cc.InitDefaultHelpFlag()
		_ = cc.Flags().MarkHidden("help")
		c.buildGroup(cc, e, wrap)
		return cc
	}
	cc.InitDefaultHelpFlag()
	_ = cc.Flags().MarkHidden("help") // every command has it: the root's help says so
	act := c.setup(cc.Flags())
	cc.Args = c.checkArgs
	cc.DisableFlagParsing = c.raw
	if c.raw {
		cc.Flags().SetInterspersed(false)
	}
	cc.RunE = func(cmd *cobra.Command, args []string) error {
		e.args, e.help = args, cmd.Help
		if c.raw {
			cmd.LocalFlags() // merges the root's --config into the leaf's flags
		}
		if err := wrap(act(e)); err != nil {
			return actionError{err}
		}
		return nil
	}
	cc.ValidArgsFunction = c.completeArgs(e)
	return cc
}

// buildGroup makes cc the group of c's subcommands: bare or with an
// unknown verb it is a usage error that lists them.
func (c *command) buildGroup(cc *cobra.Command, e *env, wrap func(error) error) {
	for _, s := range c.subs {
		cc.AddCommand(s.build(e, wrap))
	}
	cc.Args = cobra.ArbitraryArgs
	cc.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usageError{fmt.Sprintf("%s: say what to do: %s", cmd.CommandPath(), verbs(cmd))}
		}
		return usageError{fmt.Sprintf("%s: unknown command %q: use %s", cmd.CommandPath(), args[0], verbs(cmd))}
	}
}

func chainWrap(outer, inner func(error) error) func(error) error {
	return func(err error) error { return outer(inner(err)) }
}

// noWrap leaves errors as they are; it keeps nil nil.
func noWrap(err error) error { return err }

// checkArgs bounds a leaf's positional arguments by min and max.
func (c *command) checkArgs(cmd *cobra.Command, args []string) error {
	if c.raw || (len(args) >= c.min && (c.max < 0 || len(args) <= c.max)) {
		return nil
	}
	return usageError{"usage: " + cmd.UseLine()}
}

// verbs lists the subcommands for a usage error: "add, ls, rm or run".
func verbs(cmd *cobra.Command) string {
	var names []string
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func indent(example string) string {
	if example == "" {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(example), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return strings.Join(lines, "\n")
}

// parseRaw parses a raw leaf's flags from args up to the first argument
// that is not one (or --), and says whether -h asked for its help.
func parseRaw(fl *flag.FlagSet, args []string) (rest []string, help bool, err error) {
	if err := fl.Parse(args); err != nil {
		return nil, false, usageError{err.Error()}
	}
	help, _ = fl.GetBool("help")
	return fl.Args(), help, nil
}

// helpOr is a raw leaf's answer to a flag error, or to -h: its help.
func helpOr(e *env, err error, help bool) error {
	if help {
		return e.help()
	}
	return err
}

// flagUsages is the flags part of -h: every flag, its value's kind and
// its default, "none" when it has none.
func flagUsages(fs *flag.FlagSet) string {
	var b strings.Builder
	fs.VisitAll(func(f *flag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		b.WriteString("  ")
		if f.Shorthand != "" {
			fmt.Fprintf(&b, "-%s, ", f.Shorthand)
		}
		kind, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, "--%s", f.Name)
		if kind != "" && kind != "bool" {
			b.WriteString(" " + kind)
		}
		def := f.DefValue
		if def == "" || def == "[]" {
			def = "none"
		}
		if !strings.Contains(usage, "(default: ") { // some say what the default is better
			usage += " (default: " + def + ")"
		}
		fmt.Fprintf(&b, "\n      %s\n", usage)
	})
	return b.String()
}

// helpTemplate is cobra's, with flagUsages for the flags.
const helpTemplate = `{{with (or .Long .Short)}}{{. | trimTrailingWhitespaces}}

{{end}}Usage:{{if and .Runnable (not .HasAvailableSubCommands)}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} COMMAND{{end}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}

Commands:{{range .Commands}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{flagUsages .LocalFlags | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableInheritedFlags}}

Global flags:
{{flagUsages .InheritedFlags | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableSubCommands}}

'{{.CommandPath}} COMMAND -h' shows a command's usage, flags and examples.{{end}}
`

func init() { cobra.AddTemplateFunc("flagUsages", flagUsages) }

// jsonFlag declares --json, which every command that prints something
// takes: its action then prints with printJSON.
func jsonFlag(fl *flag.FlagSet) *bool { return fl.Bool("json", false, "print JSON") }

// printJSON is what every --json prints: v as JSON, indented by two
// spaces, one value per command.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// leaves lists the path of every command that runs under cmd, for tests
// and the docs check.
func leaves(cmd *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, s := range cmd.Commands() {
		if !s.IsAvailableCommand() {
			continue
		}
		if s.HasSubCommands() {
			out = append(out, leaves(s)...)
		} else {
			out = append(out, s)
		}
	}
	return slices.Clip(out)
}
