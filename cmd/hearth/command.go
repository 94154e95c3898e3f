package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"hearth/client"
)

// The CLI is one tree of commands (tree, in main.go). Dispatch, -h, the
// usage text and shell completion all walk it, so none of them can drift
// from what the commands take.

// command is a group of subcommands (subs) or a leaf that runs (setup).
type command struct {
	name    string
	aliases []string
	// args are its positional arguments as the usage shows them, like
	// `AGENT "PROMPT"`; summary says what it does (lines after the first
	// continue it).
	args, summary string
	// min and max bound its positional arguments; max < 0 is no bound.
	min, max int
	// setup declares the leaf's flags on fl (--config is declared for
	// it) and returns what runs once they are parsed.
	setup func(fl *flag.FlagSet) action
	// raw leaves parse their own arguments with fl (exec: what follows
	// the command to run is its own): their action gets every argument.
	raw bool
	// noConfig leaves take no --config.
	noConfig bool
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
}

// client connects to the daemon named by --config (or $HEARTH_ADDR).
func (e *env) client() (*client.Client, error) { return connect(e.configFile()) }

func (e *env) configFile() string {
	if e.config == nil {
		return ""
	}
	return *e.config
}

// run runs the command c names with args; path is how the user named it
// ("agents run"), for messages.
func (c *command) run(path string, args []string, e *env) error {
	if c.setup == nil {
		return c.runGroup(path, args, e)
	}
	fl, act := c.flags(path)
	if f := fl.Lookup("config"); f != nil {
		e.config = f.Value.(*configFlag).ptr()
	}
	var err error
	if c.raw {
		e.args = args
		err = act(e)
	} else if e.args, err = parseFlags(fl, args); err == nil {
		if len(e.args) < c.min || (c.max >= 0 && len(e.args) > c.max) {
			err = usageError{"usage: " + c.usageLine(path)}
		} else {
			err = act(e)
		}
	}
	if errors.Is(err, flag.ErrHelp) {
		return c.help(path, e.stdout)
	}
	return err
}

func (c *command) runGroup(path string, args []string, e *env) error {
	verb, rest := splitVerb(args)
	sub := c.find(verb)
	switch {
	case verb == "" && slices.ContainsFunc(args, isHelp):
		return c.help(path, e.stdout)
	case verb == "":
		return usageError{fmt.Sprintf("%s: say what to do: %s", path, c.verbs())}
	case sub == nil:
		return usageError{fmt.Sprintf("%s: unknown command %q: use %s", path, verb, c.verbs())}
	}
	err := sub.run(path+" "+sub.name, rest, e)
	if c.wrap != nil && err != nil {
		err = c.wrap(err)
	}
	return err
}

func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "-help" }

// splitVerb finds the command among args, which flags may come before
// (hearth sandboxes job --config F start ...), and returns the other
// arguments in their order.
func splitVerb(args []string) (verb string, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--config" || a == "-config" {
			i++ // its value
			continue
		}
		if !strings.HasPrefix(a, "-") {
			return a, append(args[:i:i], args[i+1:]...)
		}
	}
	return "", args
}

// find returns the subcommand called name (or one of its aliases).
func (c *command) find(name string) *command {
	for _, s := range c.subs {
		if s.name == name || slices.Contains(s.aliases, name) {
			return s
		}
	}
	return nil
}

// verbs lists the subcommands for a usage error: "add, ls, rm or run".
func (c *command) verbs() string {
	var names []string
	for _, s := range c.subs {
		if !s.hidden {
			names = append(names, s.name)
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// flags returns a leaf's flag set, with --config unless noConfig, and
// the action setup returned.
func (c *command) flags(path string) (*flag.FlagSet, action) {
	fl := flag.NewFlagSet(path, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	config := new(configFlag)
	if !c.noConfig {
		fl.Var(config, "config", "the config file that says where the daemon is (none: /etc/hearth/hearth.toml if it exists, else built-in defaults)")
	}
	return fl, c.setup(fl)
}

// configFlag is --config: a plain string flag, distinct so the tree can
// find it.
type configFlag string

func (f *configFlag) String() string     { return string(*f) }
func (f *configFlag) Set(v string) error { *f = configFlag(v); return nil }
func (f *configFlag) ptr() *string       { return (*string)(f) }

// usageLine is "hearth PATH ARGS", adding [flags] when the leaf has any
// but --config.
func (c *command) usageLine(path string) string {
	line := "hearth " + path
	if c.args != "" {
		line += " " + c.args
	}
	if c.setup != nil {
		fl, _ := c.flags(path)
		n := 0
		fl.VisitAll(func(f *flag.Flag) {
			if f.Name != "config" {
				n++
			}
		})
		if n > 0 && !strings.Contains(c.args, "[flags]") {
			line += " [flags]"
		}
	}
	return line
}

// help writes -h: a leaf's usage and every flag with its default, or a
// group's commands.
func (c *command) help(path string, w io.Writer) error {
	if c.setup == nil {
		fmt.Fprintf(w, "usage: hearth %s COMMAND\n\n", path)
		c.writeUsage(w, path)
		fmt.Fprintf(w, "\n'hearth %s COMMAND -h' shows a command's flags.\n", path)
		return nil
	}
	fmt.Fprintf(w, "usage: %s\n\n%s\n", c.usageLine(path), c.summary)
	fl, _ := c.flags(path)
	first := true
	fl.VisitAll(func(f *flag.Flag) {
		if first {
			fmt.Fprintln(w, "\nflags:")
			first = false
		}
		name, usage := flag.UnquoteUsage(f)
		if name == "value" {
			name = placeholder(f.Value)
		}
		fmt.Fprintf(w, "  %s", flagName(f.Name))
		if name != "" {
			fmt.Fprintf(w, " %s", name)
		}
		def := f.DefValue
		if def == "" {
			def = "none"
		}
		if !strings.Contains(usage, "(default: ") { // some say what the default is better
			usage += " (default: " + def + ")"
		}
		fmt.Fprintf(w, "\n    \t%s\n", usage)
	})
	return nil
}

// placeholder names what a flag of a type of this package takes.
func placeholder(v flag.Value) string {
	switch v.(type) {
	case *usdFlag:
		return "USD"
	case *positiveDuration:
		return "DURATION"
	case *positiveInt:
		return "N"
	case envFlag:
		return "NAME=VALUE"
	case *sizeFlag:
		return "SIZE"
	case *configFlag, *inputFlag:
		return "FILE"
	}
	return "value"
}

// flagName is how the usage writes a flag: -n, --json.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// usageColumn is where the summaries start in the usage text.
const usageColumn = 49

// writeUsage writes one line (or a few) per leaf under c, a blank line
// around each group.
func (c *command) writeUsage(w io.Writer, path string) {
	c.writeLeaves(w, path, new(bool))
}

// writeLeaves is writeUsage; blank says whether a blank line was last.
func (c *command) writeLeaves(w io.Writer, path string, blank *bool) {
	for _, s := range c.subs {
		if s.hidden {
			continue
		}
		p := strings.TrimSpace(path + " " + s.name)
		if s.setup == nil {
			if !*blank {
				fmt.Fprintln(w)
			}
			s.writeLeaves(w, p, blank)
			if !*blank {
				fmt.Fprintln(w)
				*blank = true
			}
			continue
		}
		left := "  " + s.usageLine(p)
		if len(left) >= usageColumn-1 {
			fmt.Fprintln(w, left)
			left = ""
		}
		for _, l := range strings.Split(s.summary, "\n") {
			fmt.Fprintf(w, "%-*s%s\n", usageColumn-1, left, l)
			left = ""
		}
		*blank = false
	}
}

// leaves lists the path of every command that runs, for tests.
func (c *command) leaves(path []string) [][]string {
	var out [][]string
	for _, s := range c.subs {
		if s.hidden {
			continue
		}
		p := append(slices.Clone(path), s.name)
		if s.setup != nil {
			out = append(out, p)
		} else {
			out = append(out, s.leaves(p)...)
		}
	}
	return out
}

// printJSON is what every --json prints: v as JSON, indented by two
// spaces, one value per command.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
