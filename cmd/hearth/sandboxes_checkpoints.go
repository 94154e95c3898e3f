package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"hearth/client"
)

// Checkpoints are saved states of a sandbox's files outside the
// workspace (which has its own snapshots): checkpoint, checkpoints,
// restore and checkpoint-rm. Flat verbs, like workspace snapshot,
// snapshots and restore.

func sbxCheckpoint(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("sandboxes checkpoint", flag.ContinueOnError)
	c, pos, err := sbxArgs(fl, args, 1, 2, "checkpoint ID [NAME]")
	if err != nil {
		return err
	}
	id, name := pos[0], ""
	if len(pos) == 2 {
		name = pos[1]
	}
	start := time.Now()
	cp, err := c.Checkpoint(context.Background(), id, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "checkpoint %s of sandbox %s taken in %s (%s): bring it back with 'hearth sandboxes restore %s %s'\n",
		cp.Name, id, time.Since(start).Round(time.Millisecond), humanize.IBytes(uint64(cp.Size)), id, cp.Name)
	return nil
}

func sbxListCheckpoints(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("sandboxes checkpoints", flag.ContinueOnError)
	asJSON := fl.Bool("json", false, "print JSON")
	c, pos, err := sbxArgs(fl, args, 1, 1, "checkpoints ID [--json]")
	if err != nil {
		return err
	}
	id := pos[0]
	list, err := c.Checkpoints(context.Background(), id)
	if err != nil {
		return err
	}
	if *asJSON {
		if list == nil {
			list = []client.Checkpoint{}
		}
		return json.NewEncoder(stdout).Encode(list)
	}
	if len(list) == 0 {
		fmt.Fprintf(stdout, "no checkpoints of sandbox %s: take one with 'hearth sandboxes checkpoint %s NAME'\n", id, id)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINT\tSIZE\tTAKEN")
	for _, cp := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", cp.Name, humanize.IBytes(uint64(cp.Size)), humanize.Time(cp.Taken))
	}
	return tw.Flush()
}

func sbxRestore(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("sandboxes restore", flag.ContinueOnError)
	c, pos, err := sbxArgs(fl, args, 2, 2, "restore ID NAME")
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := c.RestoreCheckpoint(context.Background(), pos[0], pos[1]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "restored sandbox %s to checkpoint %s in %s: every process in it was stopped and its agent restarted (background jobs are gone)\n",
		pos[0], pos[1], time.Since(start).Round(time.Millisecond))
	return nil
}

func sbxDeleteCheckpoint(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("sandboxes checkpoint-rm", flag.ContinueOnError)
	c, pos, err := sbxArgs(fl, args, 2, 2, "checkpoint-rm ID NAME")
	if err != nil {
		return err
	}
	if err := c.DeleteCheckpoint(context.Background(), pos[0], pos[1]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "deleted checkpoint %s of sandbox %s\n", pos[1], pos[0])
	return nil
}
