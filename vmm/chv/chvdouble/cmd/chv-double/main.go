// Command chv-double is a test double standing in for the
// cloud-hypervisor binary, which cannot run where Hearth is tested: it
// takes upstream's command line (--api-socket, --log-file, -v, ...) and
// serves upstream's REST API with its state machine, and runs the guest
// agent named by $CHV_DOUBLE_GUEST as a host process in place of a guest.
// See package hearth/vmm/chv/chvdouble for exactly what it checks and
// what it only pretends.
package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"hearth/vmm/chv/chvdouble"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == chvdouble.GuestWorkspaceCommand {
		// The double itself, started again to set up a guest's workspace
		// before it becomes the guest agent.
		err := chvdouble.RunGuestWorkspace(os.Args[2:])
		fmt.Fprintln(os.Stderr, "chv-double:", err)
		os.Exit(1)
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chv-double:", err)
		os.Exit(1)
	}
}

type count int

func (c *count) String() string   { return fmt.Sprint(int(*c)) }
func (c *count) Set(string) error { *c++; return nil }
func (c *count) IsBoolFlag() bool { return true }

func run(args []string) error {
	fl := flag.NewFlagSet("chv-double", flag.ContinueOnError)
	apiSocket := fl.String("api-socket", "", "path=PATH (or PATH) of the HTTP API socket")
	logFile := fl.String("log-file", "", "file to log to")
	seccomp := fl.String("seccomp", "true", "accepted as upstream does; the double has no seccomp filter")
	var verbose count
	fl.Var(&verbose, "v", "verbosity (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	_ = seccomp
	if fl.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: the double takes only the API socket and log options; the VM is made over the API", fl.Args())
	}
	path := *apiSocket
	if strings.Contains(path, "=") {
		var ok bool
		if path, ok = strings.CutPrefix(path, "path="); !ok {
			return fmt.Errorf("--api-socket %q: the double supports path=PATH only", *apiSocket)
		}
	}
	var w io.Writer = io.Discard
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	} else if verbose > 0 {
		w = os.Stderr
	}
	v, err := chvdouble.Listen(chvdouble.Options{APISocket: path, Guest: os.Getenv("CHV_DOUBLE_GUEST"), Subreaper: true, Log: slog.New(slog.NewTextHandler(w, nil))})
	if err != nil {
		return err
	}
	return v.Serve()
}
