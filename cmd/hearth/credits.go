package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	flag "github.com/spf13/pflag"

	"hearth/client"
)

func creditsCmd() *command {
	return &command{name: "credits", summary: "the prepaid credit balance model spend draws on", example: "hearth credits add 20\nhearth credits show", subs: []*command{
		{name: "add", example: `hearth credits add 20 --note "March top-up"`, args: "USD", min: 1, max: 1, summary: "add to the credit balance", setup: func(fl *flag.FlagSet) action {
			note := fl.String("note", "", "who added them and why")
			return func(inv *env) error {
				amount, err := parseUSD(inv.args[0])
				if err != nil {
					return usageError{fmt.Sprintf("credits add: %v", err)}
				}
				c, err := inv.client()
				if err != nil {
					return err
				}
				cr, err := c.AddCredits(context.Background(), amount, *note)
				if err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "added %s; %s available\n", usd(amount), usd(cr.Available))
				if !cr.Enabled {
					fmt.Fprintln(inv.stdout, "note: credits are off, so executions do not draw on them: set enabled = true under [credits] in the config")
				}
				return nil
			}
		}},
		{name: "show", example: "hearth credits show\nhearth credits show --json", summary: "the balance and the newest ledger entries", setup: func(fl *flag.FlagSet) action {
			asJSON := jsonFlag(fl)
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				cr, err := c.Credits(context.Background())
				if err != nil {
					return err
				}
				if *asJSON {
					return printJSON(inv.stdout, cr)
				}
				printCredits(inv.stdout, cr)
				return nil
			}
		}},
	}}
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
