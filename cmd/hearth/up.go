package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	flag "github.com/spf13/pflag"

	"hearth/appliance"
)

func upCmd() *command {
	return &command{name: "up", summary: "run the daemon (mounts the workspace)", max: -1, setup: cmdUp,
		example: "hearth up --config /etc/hearth/hearth.toml"}
}

func cmdUp(*flag.FlagSet) action {
	return func(inv *env) error { return up(inv.configFile(), inv.stderr) }
}

// up runs the daemon until a signal stops it.
func up(config string, stderr io.Writer) error {
	cfg, err := loadConfig(config)
	if err != nil {
		return err
	}
	// Signals are caught before the start, so that Ctrl-C during a slow
	// one (the tier probe, fetching the VM kernel) stops it cleanly: the
	// context cancels the start, sig keeps the signal for after it.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	d, err := appliance.Start(ctx, cfg, cfg.Log.NewLogger(stderr))
	stop()
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "hearth: workspace mounted at %s (state in %s)\n", cfg.Workspace.Mount, cfg.StateDir)
	fmt.Fprintf(stderr, "hearth: API on unix socket %s", cfg.SocketPath())
	if addr := d.TCPAddr(); addr != "" {
		fmt.Fprintf(stderr, " and on http://%s (token in %s; dashboard at /ui/)", addr, cfg.TokenPath())
	}
	fmt.Fprintf(stderr, "; stop with Ctrl-C or SIGTERM, reload agent definitions with SIGHUP\n")
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var s os.Signal
	for s == nil {
		select {
		case <-hup:
			d.ReloadAgents() // it logs what it loaded and what it could not
		case s = <-sig:
		}
	}
	then := "running agent executions are stopped (their partial outputs kept)"
	switch cfg.Agents.OnShutdown {
	case appliance.OnShutdownFinish:
		then = "running agent executions may finish first (signal again to stop them now)"
	case appliance.OnShutdownLeave:
		then = "running agent executions are left running, for the next start to take up, once their model calls in flight finish (signal again to cut those)"
	}
	fmt.Fprintf(stderr, "hearth: %v: %s; sandboxes keep running for the next start; unmounting and saving state\n", s, then)
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	for {
		select {
		case err := <-closed:
			return err
		case s := <-sig:
			now := "stopping running executions now"
			if cfg.Agents.OnShutdown == appliance.OnShutdownLeave {
				now = "cutting model calls in flight now"
			}
			fmt.Fprintf(stderr, "hearth: %v again: %s\n", s, now)
			d.Hurry()
		}
	}
}
