package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"hearth/client"
)

func cmdCredits(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageError{"credits: say what to do: add or show"}
	}
	verb, args := args[0], args[1:]
	fl := flag.NewFlagSet("credits "+verb, flag.ContinueOnError)
	config := fl.String("config", "", "config file")
	switch verb {
	case "add":
		note := fl.String("note", "", "who added them and why")
		pos, err := parseFlags(fl, args)
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usageError{"usage: hearth credits add USD [--note TEXT]"}
		}
		amount, err := parseUSD(pos[0])
		if err != nil {
			return usageError{fmt.Sprintf("credits add: %v", err)}
		}
		c, err := connect(*config)
		if err != nil {
			return err
		}
		cr, err := c.AddCredits(context.Background(), amount, *note)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "added %s; %s available\n", usd(amount), usd(cr.Available))
		if !cr.Enabled {
			fmt.Fprintln(stdout, "note: credits are off, so executions do not draw on them: set enabled = true under [credits] in the config")
		}
		return nil
	case "show":
		asJSON := fl.Bool("json", false, "print JSON")
		pos, err := parseFlags(fl, args)
		if err != nil {
			return err
		}
		if len(pos) != 0 {
			return usageError{"usage: hearth credits show [--json]"}
		}
		c, err := connect(*config)
		if err != nil {
			return err
		}
		cr, err := c.Credits(context.Background())
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, cr)
		}
		printCredits(stdout, cr)
		return nil
	}
	return usageError{fmt.Sprintf("credits: unknown command %q: use add or show", verb)}
}

func printCredits(w io.Writer, cr client.Credits) {
	if cr.Enabled {
		fmt.Fprintln(w, "credits are on: each execution reserves its budget from the balance")
	} else {
		fmt.Fprintln(w, "credits are off (credits.enabled in the config): budgets are per agent and task only")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "available\t%s\nreserved\t%s\nspent\t%s\n", usd(cr.Available), usd(cr.Reserved), usd(cr.Spent))
	tw.Flush()
	if len(cr.Entries) == 0 {
		return
	}
	fmt.Fprintln(w, "\nnewest entries:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, e := range cr.Entries {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", e.Time.Local().Format("2006-01-02 15:04"), e.Kind, usd(e.Usd), strings.TrimSpace(e.Execution+" "+e.Note))
	}
	tw.Flush()
}
