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

const usage = `hearth: a workspace computer for AI agents

Usage:
  hearth up [--config FILE]                      run the daemon (mounts the workspace)
  hearth doctor [--json]                         what this host offers and the tier Hearth uses
  hearth mcp                                     serve MCP on stdin/stdout (delegate tasks to agents,
                                                 read their outputs); the daemon also serves it at /mcp
  hearth workspace ls [--json]                   list sessions
  hearth workspace create SESSION                make a session (inputs/, outputs/, .home/)
  hearth workspace rm SESSION                    delete a session and its snapshots
  hearth workspace snapshot SESSION|--all [NAME] take a copy-on-write snapshot
  hearth workspace snapshots [SESSION] [--json]  list snapshots (no SESSION: whole-tree ones)
  hearth workspace snapshot-rm SESSION|--all NAME delete a snapshot (frees its space)
  hearth workspace restore SESSION|--all NAME    roll back to a snapshot
  hearth workspace branch SESSION NAME NEW       start session NEW from a snapshot

  hearth sandboxes create [--image base] [--session S] [--cpus N] [--memory 512M]
                          [--pids N] [--disk 2G] [--env K=V]... [--idle-timeout 10m]
                          [--exec-timeout 5m] [ID]      boot a sandbox, print its id
  hearth sandboxes exec ID [--user U] [--cwd D] [--env K=V]... [--timeout D] [-n] -- CMD ARGS...
                                                 run a command; exits with its status
  hearth sandboxes cp SRC DST                    copy a file in or out (ID:/path, - for stdin/stdout)
  hearth sandboxes pause|resume|destroy ID       freeze, thaw or remove a sandbox
  hearth sandboxes ls [--json]                   list sandboxes with what they use
  hearth sandboxes checkpoint ID [NAME]          save the writable layer; checkpoints ID [--json] lists them
  hearth sandboxes restore ID NAME               put a checkpoint back (every process ends, the agent restarts)
  hearth sandboxes checkpoint-rm ID NAME         delete a checkpoint
  hearth sandboxes save ID IMAGE                 save a sandbox's root as a new image
  hearth sandboxes job start ID [--user U] [--cwd D] [--env K=V]... -- CMD ARGS...
                                                 start a background job
  hearth sandboxes job ls ID [--json]            a sandbox's jobs
  hearth sandboxes job logs ID JOB [--stderr]    a job's output so far
  hearth sandboxes job stop ID JOB [--grace 5s]  stop a job (TERM, then KILL after the grace)

  hearth agents run AGENT "PROMPT" [--input FILE]... [--budget USD] [--max-turns N]
                   [--timeout D] [--session ID] [--output GLOB]... [--detach] [--json]
                                                 delegate a task; streams it, ends with the result,
                                                 outputs, turns, tokens and cost
  hearth agents list [--agent A] [--session S] [--status S,...] [--json]
                                                 one line per execution, newest first
  hearth agents show EXECUTION [--json]          an execution's details
  hearth agents execution EXECUTION [--follow] [--json]
                                                 its event log with timestamps (logs is the same)
  hearth agents outputs EXECUTION [--download DIR] [--json]
                                                 the session's outputs/, or a copy of them
  hearth agents retry EXECUTION [--detach]       run an ended execution's task again
  hearth agents resume SESSION "PROMPT" [--input FILE]... [--budget USD] [--detach]
                                                 continue a session; the agent keeps its conversation
  hearth agents cancel EXECUTION                 stop it (partial outputs are kept)
  hearth agents definitions [--json]             the agents the daemon knows
  hearth agents reload [--json]                  read the agent definitions again (or SIGHUP the daemon)
  hearth agents sessions [--agent A] [--json]    agent sessions, newest first
  hearth credits add USD [--note TEXT]           add to the credit balance
  hearth credits show [--json]                   the balance and the newest ledger entries
  hearth schedules add ID "SPEC" AGENT "PROMPT" [--budget USD] [--max-turns N] [--timeout D]
                   [--overlap skip|queue|allow] [--catch-up none|once]
                                                 run a task on a cron schedule ("0 9 * * 1-5",
                                                 "@daily", "@every 1h", "CRON_TZ=Europe/Paris ...")
  hearth schedules ls [--json]                   schedules with their next and last runs
  hearth schedules rm ID                         delete a schedule (its history stays)
  hearth schedules run ID                        start a run now
  hearth schedules runs ID [--json]              a schedule's runs and their executions

  hearth images build NAME                       build an image from its recipe, showing progress
  hearth images ls [--json]                      list built images and recipes
  hearth images inspect NAME [--json]            show an image's manifest
  hearth images rm NAME                          delete a built image
  hearth completion bash|zsh|fish                print a shell completion script
                                                 (bash: hearth completion bash > /etc/bash_completion.d/hearth)

Every command but up takes --config FILE to find the daemon (default
/etc/hearth/hearth.toml if it exists, else built-in defaults); with
HEARTH_ADDR=host:port and HEARTH_TOKEN set, commands use a daemon's TCP
API (api.tcp) instead. Exit codes:
0 ok, 1 failed, 2 bad command line, 3 not found, 4 daemon not running;
sandboxes exec exits with the command's own status (128+N if killed by
signal N); agents run, retry and resume exit 0 when the execution
completed and 1 when it ended otherwise (failed, budget_exceeded,
timed_out, cancelled, interrupted), 130 if Ctrl-C stopped the following
(the execution goes on in the daemon).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
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
	case "sandboxes", "sandbox", "sbx":
		err = cmdSandboxes(args[1:], stdin, stdout, stderr)
	case "images", "image":
		err = cmdImages(args[1:], stdout, stderr)
	case "agents", "agent":
		err = cmdAgents(args[1:], stdout, stderr)
	case "credits":
		err = cmdCredits(args[1:], stdout)
	case "schedules", "schedule":
		err = cmdSchedules(args[1:], stdout)
	case "doctor":
		err = cmdDoctor(args[1:], stdout)
	case "mcp":
		err = cmdMCP(args[1:], stdin, stdout, stderr)
	case "completion":
		err = cmdCompletion(args[1:], stdout)
	case "__complete":
		complete(args[1:], stdout)
	default:
		fmt.Fprintf(stderr, "hearth: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	return exitCode(err, stderr)
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
