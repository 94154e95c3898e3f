// Command hearth is the Hearth CLI: `hearth up` runs the appliance daemon,
// the other commands drive it through its API.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"hearth/appliance"
)

// Exit codes scripts can rely on.
const (
	exitOK       = 0
	exitError    = 1 // the operation failed
	exitUsage    = 2 // bad command line
	exitNotFound = 3 // no such session or snapshot
	exitDown     = 4 // the daemon is not running
)

const usage = `hearth: a workspace computer for AI agents

Usage:
  hearth up [--config FILE]                      run the daemon (mounts the workspace)
  hearth workspace ls [--json]                   list sessions
  hearth workspace create SESSION                make a session (inputs/, outputs/, .home/)
  hearth workspace rm SESSION                    delete a session and its snapshots
  hearth workspace snapshot SESSION|--all [NAME] take a copy-on-write snapshot
  hearth workspace snapshots [SESSION] [--json]  list snapshots (no SESSION: whole-tree ones)
  hearth workspace restore SESSION|--all NAME    roll back to a snapshot
  hearth workspace branch SESSION NAME NEW       start session NEW from a snapshot

Every command but up takes --config FILE to find the daemon (default
/etc/hearth/hearth.toml if it exists, else built-in defaults).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	var err error
	switch args[0] {
	case "up":
		err = cmdUp(args[1:], stderr)
	case "workspace", "ws":
		err = cmdWorkspace(args[1:], stdout)
	default:
		fmt.Fprintf(stderr, "hearth: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	return exitCode(err, stderr)
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var ue usageError
	var ae *appliance.APIError
	hint := ""
	if errors.As(err, &ae) && ae.Code == "not_found" {
		hint = " (list what exists with 'hearth workspace ls' or 'hearth workspace snapshots SESSION')"
	}
	fmt.Fprintf(stderr, "hearth: %v%s\n", err, hint)
	switch {
	case errors.As(err, &ue), errors.Is(err, flag.ErrHelp):
		return exitUsage
	case errors.Is(err, appliance.ErrDaemonDown):
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
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
