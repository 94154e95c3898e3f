package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"hearth/appliance"
)

// cmdDoctor says what the host offers Hearth and which tier it will use.
// It needs no daemon.
func cmdDoctor(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("doctor", flag.ContinueOnError)
	config := fl.String("config", "", "config file")
	asJSON := fl.Bool("json", false, "print JSON")
	if _, err := parseFlags(fl, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return err
	}
	d := appliance.Doctor(cfg)
	if *asJSON {
		return printJSON(stdout, d)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, c := range d.Checks {
		mark := "ok"
		if !c.OK {
			mark = "no"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, mark, c.Detail)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\ntier: %s (%s)\n", d.Tier, d.Why)
	return nil
}
