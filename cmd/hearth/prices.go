package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	flag "github.com/spf13/pflag"

	"hearth/client"
)

func pricesCmd() *command {
	return &command{name: "prices", example: "hearth prices\nhearth prices --json", summary: "the model price table in force (USD per million tokens)", setup: func(fl *flag.FlagSet) action {
		asJSON := jsonFlag(fl)
		return func(inv *env) error {
			c, err := inv.client()
			if err != nil {
				return err
			}
			t, err := c.Prices(context.Background())
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(inv.stdout, t)
			}
			printPrices(inv.stdout, t)
			return nil
		}
	}}
}

func printPrices(w io.Writer, t client.PriceTable) {
	fmt.Fprintf(w, "prices from %s, USD per million tokens\n", t.Source)
	if t.Problem != "" {
		fmt.Fprintf(w, "warning: the price file's last change was not taken, this table stays in force until it is fixed: %s\n", t.Problem)
	}
	printEntries(w, t.Entries)
	for _, p := range t.Providers {
		fmt.Fprintf(w, "\n%s prices from %s, USD per million tokens\n", p.Provider, p.Source)
		if p.Problem != "" {
			fmt.Fprintf(w, "warning: the price file's last change was not taken, this table stays in force until it is fixed: %s\n", p.Problem)
		}
		printEntries(w, p.Entries)
	}
	switch t.Unpriced {
	case "refuse":
		fmt.Fprintln(w, "a model without an entry of its own (priced only by its family's entry or default) is refused ([model] unpriced = \"refuse\")")
	default:
		fmt.Fprintln(w, "a model without an entry of its own is priced by its family's entry (or default) with a warning event; a model nothing prices is refused")
	}
}

func printEntries(w io.Writer, entries []client.PriceEntry) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tINPUT\tOUTPUT\tCACHE READ\tCACHE WRITE\tSOURCE")
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Pattern, perM(e.Input), perM(e.Output), perM(e.CacheRead), perM(e.CacheWrite), e.Source)
	}
	tw.Flush()
}

// perM is a price per million tokens: at least two decimals, more when
// the price has them ($15.00, $0.08, $18.75, $0.025).
func perM(v float64) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	dot := strings.IndexByte(s, '.')
	switch {
	case dot < 0:
		s += ".00"
	case len(s)-dot == 2:
		s += "0"
	}
	return "$" + s
}
