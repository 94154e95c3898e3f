package main

import (
	"context"
	"errors"
	"fmt"

	flag "github.com/spf13/pflag"

	"hearth/client"
	"hearth/internal/version"
)

func versionCmd() *command {
	return &command{name: "version", setup: cmdVersion,
		summary: "print the versions of the CLI, the daemon and the images' agent CLIs\n(the daemon's part only when it runs)",
		example: "hearth version\nhearth version --json\nhearth --version"}
}

func cmdVersion(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error { return printVersion(inv, *asJSON) }
}

// versions is what hearth version --json prints.
type versions struct {
	Client version.Info `json:"client"`
	// Daemon is the running daemon's answer; nil when it is not running.
	Daemon *client.VersionInfo `json:"daemon,omitempty"`
}

// printVersion prints this binary's version and, when a daemon answers,
// the daemon's and its images' agent CLIs. A daemon that is not running
// is no error: the CLI's own version is still the answer.
func printVersion(inv *env, asJSON bool) error {
	v := versions{Client: version.Get()}
	d, err := daemonVersion(inv)
	if err != nil && !errors.Is(err, client.ErrDaemonDown) {
		return err
	}
	v.Daemon = d
	if asJSON {
		return printJSON(inv.stdout, v)
	}
	fmt.Fprintf(inv.stdout, "hearth %s\n", v.Client)
	if d == nil {
		fmt.Fprintln(inv.stdout, "daemon: not running")
		return nil
	}
	fmt.Fprintf(inv.stdout, "daemon: hearth %s\n", daemonInfo(d))
	for _, im := range d.Images {
		fmt.Fprintf(inv.stdout, "image %s: %s\n", im.Name, imageCLIs(im))
	}
	return nil
}

func daemonVersion(inv *env) (*client.VersionInfo, error) {
	c, err := inv.client()
	if err != nil {
		return nil, err
	}
	v, err := c.Version(context.Background())
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func daemonInfo(d *client.VersionInfo) string {
	return version.Info{Version: d.Version, Commit: d.Commit, Dirty: d.Dirty, Go: d.Go}.String()
}

// imageCLIs is "claude 2.0.14, codex 0.46.0", or what the image lacks.
func imageCLIs(im client.ImageVersion) string {
	if len(im.Clis) == 0 {
		return "no agent CLI"
	}
	s := ""
	for i, c := range im.Clis {
		if i > 0 {
			s += ", "
		}
		s += c.Name + " " + c.Version
	}
	return s
}
