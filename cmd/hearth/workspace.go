package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"hearth/client"
)

func cmdWorkspace(args []string, stdout io.Writer) error {
	err := workspaceCmd(args, stdout)
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Code == "not_found" {
		return fmt.Errorf("%w (list what exists with 'hearth workspace ls' or 'hearth workspace snapshots SESSION')", err)
	}
	return err
}

func workspaceCmd(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("workspace", flag.ContinueOnError)
	config := fl.String("config", "", "config file")
	asJSON := fl.Bool("json", false, "print JSON")
	all := fl.Bool("all", false, "the whole tree instead of one session")
	pos, err := parseFlags(fl, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError{"workspace: say what to do: ls, create, rm, snapshot, snapshots, snapshot-rm, restore or branch"}
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return err
	}
	c, err := connect(*config)
	if err != nil {
		return err
	}
	ctx := context.Background()
	verb, pos := pos[0], pos[1:]
	need := func(n int, form string) error {
		if len(pos) < n || len(pos) > n+1 {
			return usageError{"usage: hearth workspace " + form}
		}
		return nil
	}
	// With --all the session argument is left out.
	session := func() string {
		if *all {
			pos = append([]string{""}, pos...)
		}
		return pos[0]
	}
	switch verb {
	case "ls":
		return wsList(ctx, c, stdout, *asJSON)
	case "create":
		if err := need(1, "create SESSION"); err != nil {
			return err
		}
		if err := c.CreateSession(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "created session %s: %s/%s/{inputs,outputs,.home}\n", pos[0], cfg.Workspace.Mount, pos[0])
	case "rm":
		if err := need(1, "rm SESSION"); err != nil {
			return err
		}
		if err := c.DeleteSession(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted session %s\n", pos[0])
	case "snapshot":
		if !*all && len(pos) == 0 {
			return usageError{"usage: hearth workspace snapshot SESSION|--all [NAME]"}
		}
		sess := session()
		name := ""
		if len(pos) > 1 {
			name = pos[1]
		}
		start := time.Now()
		got, err := c.Snapshot(ctx, sess, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "snapshot %s of %s taken in %s\n", got, scopeName(sess), time.Since(start).Round(time.Microsecond))
	case "snapshots":
		sess := ""
		if len(pos) > 0 {
			sess = pos[0]
		}
		return wsSnapshots(ctx, c, stdout, sess, *asJSON)
	case "snapshot-rm":
		sess := session()
		if len(pos) != 2 {
			return usageError{"usage: hearth workspace snapshot-rm SESSION|--all NAME"}
		}
		if err := c.DeleteSnapshot(ctx, sess, pos[1]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted snapshot %s of %s\n", pos[1], scopeName(sess))
	case "restore":
		if err := need(1, "restore SESSION|--all NAME"); err != nil && !*all {
			return err
		}
		sess := session()
		if len(pos) != 2 {
			return usageError{"usage: hearth workspace restore SESSION|--all NAME"}
		}
		if err := c.Restore(ctx, sess, pos[1]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "restored %s to snapshot %s\n", scopeName(sess), pos[1])
	case "branch":
		if len(pos) != 3 {
			return usageError{"usage: hearth workspace branch SESSION SNAPSHOT NEW_SESSION"}
		}
		if err := c.Branch(ctx, client.BranchRequest{Session: pos[0], Snapshot: pos[1], NewSession: pos[2]}); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "session %s starts from snapshot %s of %s\n", pos[2], pos[1], pos[0])
	default:
		return usageError{fmt.Sprintf("workspace: unknown command %q", verb)}
	}
	return nil
}

func scopeName(session string) string {
	if session == "" {
		return "the whole workspace"
	}
	return "session " + session
}

func wsList(ctx context.Context, c *client.Client, out io.Writer, asJSON bool) error {
	list, err := c.Sessions(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(out).Encode(list)
	}
	if len(list) == 0 {
		fmt.Fprintln(out, "no sessions yet: make one with 'hearth workspace create NAME'")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tFILES\tFILE-QUOTA\tSIZE\tSIZE-QUOTA\tCREATED")
	for _, s := range list {
		files, bytes := "-", "-"
		if s.Quota.Inodes > 0 {
			files = fmt.Sprintf("%s (%d%%)", humanize.Comma(s.Quota.Inodes), 100*s.Files/s.Quota.Inodes)
		}
		if s.Quota.Bytes > 0 {
			bytes = fmt.Sprintf("%s (%d%%)", humanize.IBytes(uint64(s.Quota.Bytes)), 100*s.Bytes/s.Quota.Bytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, humanize.Comma(s.Files), files, humanize.IBytes(uint64(s.Bytes)), bytes, humanize.Time(s.Created))
	}
	return tw.Flush()
}

func wsSnapshots(ctx context.Context, c *client.Client, out io.Writer, session string, asJSON bool) error {
	list, err := c.Snapshots(ctx, session)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(out).Encode(list)
	}
	if len(list) == 0 {
		fmt.Fprintf(out, "no snapshots of %s\n", scopeName(session))
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tSESSIONS\tFILES\tSIZE\tSHARED\tUNIQUE\tTAKEN")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, strings.Join(s.Sessions, ","), humanize.Comma(s.Files),
			humanize.IBytes(uint64(s.Bytes)), humanize.IBytes(uint64(s.Shared)), humanize.IBytes(uint64(s.Unique)), humanize.Time(s.Created))
	}
	return tw.Flush()
}
