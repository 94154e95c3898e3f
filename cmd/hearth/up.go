package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"

	"hearth/appliance"
)

func cmdUp(args []string, stderr io.Writer) error {
	fl := flag.NewFlagSet("up", flag.ContinueOnError)
	config := fl.String("config", "", "config file")
	if _, err := parseFlags(fl, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return err
	}
	logger := log.New(stderr, "hearth: ", log.LstdFlags)
	d, err := appliance.Start(cfg, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "hearth: workspace mounted at %s (state in %s)\n", cfg.Workspace.Mount, cfg.StateDir)
	fmt.Fprintf(stderr, "hearth: API on unix socket %s; stop with Ctrl-C or SIGTERM\n", cfg.SocketPath())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	fmt.Fprintf(stderr, "hearth: %v: unmounting and saving state\n", s)
	return d.Close()
}
