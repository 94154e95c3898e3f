package main

import (
	"context"
	"fmt"
	"time"

	"hearth/client"

	flag "github.com/spf13/pflag"
)

// maxForks is the daemon's bound on one fork request, checked before it
// is asked.
const maxForks = 16

func sbxForkCmd() *command {
	return &command{name: "fork", example: "hearth sandboxes fork box1\nhearth sandboxes fork box1 --count 4 --json", args: "ID", min: 1, max: 1, names: sandboxIDs, setup: sbxFork,
		summary: "make --count new sandboxes from a copy of its files as they are now (and a branch of its session);\n" +
			"memory is not carried over: each fork starts with no process running and an empty /tmp (a tmpfs); the source pauses only while its files are copied"}
}

func sbxFork(fl *flag.FlagSet) action {
	count := fl.Int("count", 1, fmt.Sprintf("how many forks, 1 to %d", maxForks))
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		if *count < 1 || *count > maxForks {
			return usageError{fmt.Sprintf("--count %d: give 1 to %d", *count, maxForks)}
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		id := inv.args[0]
		start := time.Now()
		res, err := c.ForkSandbox(context.Background(), id, *count)
		if err != nil {
			return err
		}
		if *asJSON {
			if res.Sandboxes == nil {
				res.Sandboxes = []client.Sandbox{}
			}
			return printJSON(inv.stdout, res)
		}
		how := "copied"
		if res.Reflinked {
			how = "reflinked"
		}
		fmt.Fprintf(inv.stdout, "forked sandbox %s %d times in %s (files %s; no process and nothing in /tmp carried over):\n",
			id, len(res.Sandboxes), time.Since(start).Round(time.Millisecond), how)
		for _, s := range res.Sandboxes {
			fmt.Fprintf(inv.stdout, "%s\t%s\n", s.Id, dash(s.Session))
		}
		return nil
	}
}
