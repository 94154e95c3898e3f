package main

import (
	"context"
	"fmt"
	"time"

	flag "github.com/spf13/pflag"

	"hearth/client"
)

// claimsCmd: the advisory leases agents take on workspace paths so that
// two do not do the same work.
func claimsCmd() *command {
	return &command{name: "claims", summary: "the paths agents lease to write, and who holds them", example: "hearth claims list\nhearth claims release /shared/report.md", aliases: []string{"claim"}, subs: []*command{
		{name: "list", example: "hearth claims list\nhearth claims list /shared --json", aliases: []string{"ls"}, args: "[PREFIX]", max: 1, setup: claimsList,
			summary: "the leases in force, by path (at or under PREFIX,\nrelative to /workspace/agents)"},
		{name: "release", example: "hearth claims release /shared/report.md", args: "PATH", min: 1, max: 1, names: claimPaths, setup: claimsRelease,
			summary: "release a lease whoever holds it (the holder's\nstream says so)"},
	}}
}

func claimsList(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	holder := fl.String("holder", "", "only this execution's leases")
	return func(inv *env) error {
		prefix := ""
		if len(inv.args) > 0 {
			prefix = inv.args[0]
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		list, err := c.Claims(context.Background(), prefix, *holder)
		if err != nil {
			return err
		}
		return printList(inv.stdout, *asJSON, list, "no leases in force", func(cl client.Claim) []string {
			return []string{cl.Path, cl.Holder, "expires in " + time.Until(cl.Expires).Round(time.Second).String()}
		})
	}
}

func claimsRelease(fl *flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		cl, err := c.ReleaseClaim(context.Background(), inv.args[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "released %s (held by %s)\n", safe(cl.Path), safe(cl.Holder))
		return nil
	}
}

// claimPaths completes the paths of the leases in force.
func claimPaths(ctx context.Context, c *client.Client) []string {
	list, _ := c.Claims(ctx, "", "")
	return collect(list, func(cl client.Claim) string { return cl.Path })
}
