package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

// Checkpoints are saved states of a sandbox's files outside the
// workspace (which has its own snapshots): checkpoint, checkpoints,
// restore and checkpoint-rm. Flat verbs, like workspace snapshot,
// snapshots and restore.

func sbxCheckpoint(*flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		id, name := inv.args[0], ""
		if len(inv.args) == 2 {
			name = inv.args[1]
		}
		start := time.Now()
		cp, err := c.Checkpoint(context.Background(), id, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "checkpoint %s of sandbox %s taken in %s (%s): bring it back with 'hearth sandboxes restore %s %s'\n",
			cp.Name, id, time.Since(start).Round(time.Millisecond), humanize.IBytes(uint64(cp.Size)), id, cp.Name)
		return nil
	}
}

func sbxListCheckpoints(fl *flag.FlagSet) action {
	asJSON := jsonFlag(fl)
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		id := inv.args[0]
		list, err := c.Checkpoints(context.Background(), id)
		if err != nil {
			return err
		}
		if *asJSON {
			if list == nil {
				list = []client.Checkpoint{}
			}
			return printJSON(inv.stdout, list)
		}
		if len(list) == 0 {
			fmt.Fprintf(inv.stdout, "no checkpoints of sandbox %s: take one with 'hearth sandboxes checkpoint %s NAME'\n", id, id)
			return nil
		}
		tw := tabwriter.NewWriter(inv.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CHECKPOINT\tSIZE\tTAKEN")
		for _, cp := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", cp.Name, humanize.IBytes(uint64(cp.Size)), humanize.Time(cp.Taken))
		}
		return tw.Flush()
	}
}

func sbxRestore(*flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := c.RestoreCheckpoint(context.Background(), inv.args[0], inv.args[1]); err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "restored sandbox %s to checkpoint %s in %s: every process in it was stopped and its agent restarted (background jobs are gone)\n",
			inv.args[0], inv.args[1], time.Since(start).Round(time.Millisecond))
		return nil
	}
}

func sbxDeleteCheckpoint(*flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		if err := c.DeleteCheckpoint(context.Background(), inv.args[0], inv.args[1]); err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "deleted checkpoint %s of sandbox %s\n", inv.args[1], inv.args[0])
		return nil
	}
}
