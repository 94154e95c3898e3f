package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	flag "github.com/spf13/pflag"

	"hearth/client"
)

func clusterCmd() *command {
	return &command{name: "cluster", summary: "the daemons sharing one [cluster] database", example: "hearth cluster nodes", subs: []*command{
		{name: "nodes", example: "hearth cluster nodes\nhearth cluster nodes --json", summary: "the cluster's nodes: address, tier, capacity, images, last heartbeat, dead or alive", setup: func(fl *flag.FlagSet) action {
			asJSON := jsonFlag(fl)
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				nodes, err := c.ClusterNodes(context.Background())
				if err != nil {
					return err
				}
				if *asJSON {
					return printJSON(inv.stdout, nodes)
				}
				printNodes(inv.stdout, nodes, time.Now())
				return nil
			}
		}},
	}}
}

func printNodes(w io.Writer, nodes []client.ClusterNode, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDR\tTIER\tCAPACITY\tLAST SEEN\tSTATE\tIMAGES")
	for _, n := range nodes {
		id, addr, state := n.Id, n.Addr, "alive"
		if n.Self {
			id += " (this)"
		}
		if addr == "" {
			addr = "-"
		}
		if n.Dead {
			state = "dead since " + n.DeadSince.Local().Format("2006-01-02 15:04:05")
		}
		seen := now.Sub(n.LastSeen).Round(time.Second).String() + " ago"
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", id, addr, n.Tier, n.Capacity, seen, state, strings.Join(n.Images, ","))
	}
	tw.Flush()
}
