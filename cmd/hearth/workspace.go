package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/appliance"
	"hearth/client"
)

func workspaceCmd() *command {
	// With --all the session argument is left out: scoped puts "" (the
	// whole tree) in its place.
	scoped := func(all bool, args []string) []string {
		if all {
			return append([]string{""}, args...)
		}
		return args
	}
	return &command{name: "workspace", summary: "the shared workspace: sessions, snapshots, archives", example: "hearth workspace ls\nhearth workspace snapshot work before-refactor", aliases: []string{"ws"}, wrap: notFoundHint, subs: []*command{
		workspaceServeCmd(),
		{name: "ls", example: "hearth workspace ls\nhearth workspace ls --json", summary: "list sessions", setup: func(fl *flag.FlagSet) action {
			asJSON := jsonFlag(fl)
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				return wsList(context.Background(), c, inv.stdout, *asJSON)
			}
		}},
		{name: "create", example: "hearth workspace create work", args: "SESSION", summary: "make a session (inputs/, outputs/, .home/)", min: 1, max: 1, setup: func(*flag.FlagSet) action {
			return func(inv *env) error {
				cfg, c, err := configAndClient(inv)
				if err != nil {
					return err
				}
				if err := c.CreateSession(context.Background(), inv.args[0]); err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "created session %s: %s/%s/{inputs,outputs,.home}\n", inv.args[0], cfg.Workspace.Mount, inv.args[0])
				return nil
			}
		}},
		{name: "rm", example: "hearth workspace rm work", args: "SESSION", summary: "delete a session and its snapshots", min: 1, max: 1, setup: func(*flag.FlagSet) action {
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				if err := c.DeleteSession(context.Background(), inv.args[0]); err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "deleted session %s\n", inv.args[0])
				return nil
			}
		}},
		{name: "snapshot", example: "hearth workspace snapshot work before-refactor\nhearth workspace snapshot --all nightly", args: "SESSION|--all [NAME]", summary: "take a copy-on-write snapshot", max: 2, setup: func(fl *flag.FlagSet) action {
			all := fl.Bool("all", false, "the whole tree instead of one session")
			return func(inv *env) error {
				pos := scoped(*all, inv.args)
				if len(pos) == 0 || len(pos) > 2 {
					return usageError{"usage: hearth workspace snapshot SESSION|--all [NAME]"}
				}
				name := ""
				if len(pos) > 1 {
					name = pos[1]
				}
				c, err := inv.client()
				if err != nil {
					return err
				}
				start := time.Now()
				got, err := c.Snapshot(context.Background(), pos[0], name)
				if err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "snapshot %s of %s taken in %s\n", got, scopeName(pos[0]), time.Since(start).Round(time.Microsecond))
				return nil
			}
		}},
		{name: "snapshots", example: "hearth workspace snapshots work", args: "[SESSION]", summary: "list snapshots (no SESSION: whole-tree ones)", max: 1, setup: func(fl *flag.FlagSet) action {
			asJSON := jsonFlag(fl)
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				return wsSnapshots(context.Background(), c, inv.stdout, strings.Join(inv.args, ""), *asJSON)
			}
		}},
		{name: "snapshot-rm", example: "hearth workspace snapshot-rm work before-refactor", args: "SESSION|--all NAME", summary: "delete a snapshot (frees its space)", max: 2, setup: func(fl *flag.FlagSet) action {
			all := fl.Bool("all", false, "the whole tree instead of one session")
			return func(inv *env) error {
				pos := scoped(*all, inv.args)
				if len(pos) != 2 {
					return usageError{"usage: hearth workspace snapshot-rm SESSION|--all NAME"}
				}
				c, err := inv.client()
				if err != nil {
					return err
				}
				if err := c.DeleteSnapshot(context.Background(), pos[0], pos[1]); err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "deleted snapshot %s of %s\n", pos[1], scopeName(pos[0]))
				return nil
			}
		}},
		{name: "restore", example: "hearth workspace restore work before-refactor", args: "SESSION|--all NAME", summary: "roll back to a snapshot", max: 2, setup: func(fl *flag.FlagSet) action {
			all := fl.Bool("all", false, "the whole tree instead of one session")
			return func(inv *env) error {
				pos := scoped(*all, inv.args)
				if len(pos) != 2 {
					return usageError{"usage: hearth workspace restore SESSION|--all NAME"}
				}
				c, err := inv.client()
				if err != nil {
					return err
				}
				if err := c.Restore(context.Background(), pos[0], pos[1]); err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "restored %s to snapshot %s\n", scopeName(pos[0]), pos[1])
				return nil
			}
		}},
		{name: "branch", example: "hearth workspace branch work before-refactor work-try2", args: "SESSION NAME NEW", summary: "start session NEW from a snapshot", min: 3, max: 3, setup: func(*flag.FlagSet) action {
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				pos := inv.args
				if err := c.Branch(context.Background(), client.BranchRequest{Session: pos[0], Snapshot: pos[1], NewSession: pos[2]}); err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "session %s starts from snapshot %s of %s\n", pos[2], pos[1], pos[0])
				return nil
			}
		}},
		{name: "download", example: "hearth workspace download work\nhearth workspace download work -o work.zip --home", args: "SESSION", summary: "save the session as a .tar.gz or .zip (from a snapshot)", min: 1, max: 1, setup: func(fl *flag.FlagSet) action {
			out := fl.StringP("output", "o", "", "write to FILE (.tar.gz, .tgz or .zip: the format goes by the name; - for stdout); default: SESSION.tar.gz, or stdout when that is not a terminal")
			format := fl.String("format", "", "tar.gz or zip, for stdout (default tar.gz)")
			home := fl.Bool("home", false, "include the session's private .home (the agent CLI's own state)")
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				return wsDownload(context.Background(), c, inv, inv.args[0], *out, *format, *home)
			}
		}},
		{name: "upload", example: "hearth workspace upload work data.tar.gz datasets", args: "SESSION ARCHIVE [DIR]", summary: "unpack a .tar.gz or .zip into the session's inputs/ (or inputs/DIR)", min: 2, max: 3, setup: func(*flag.FlagSet) action {
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				dir := ""
				if len(inv.args) > 2 {
					dir = inv.args[2]
				}
				return wsUpload(context.Background(), c, inv, inv.args[0], inv.args[1], dir)
			}
		}},
	}}
}

// archiveFormat is the format a file's name says, or "".
func archiveFormat(name string) string {
	switch {
	case strings.HasSuffix(name, ".zip"):
		return "zip"
	case strings.HasSuffix(name, ".tar.gz"), strings.HasSuffix(name, ".tgz"):
		return "tar.gz"
	}
	return ""
}

// wsDownload saves session's archive to out ("" chooses: see the flag),
// through a temporary file renamed into place, so an archive cut short
// never takes the name.
func wsDownload(ctx context.Context, c *client.Client, inv *env, session, out, format string, home bool) error {
	if out == "" {
		if f, ok := inv.stdout.(*os.File); ok && isTerminal(f) {
			out = session + ".tar.gz"
		} else {
			out = "-"
		}
	}
	if out == "-" {
		if format == "" {
			format = "tar.gz"
		}
		if archiveFormat("x."+format) == "" {
			return usageError{fmt.Sprintf("--format %q: use tar.gz or zip", format)}
		}
		_, err := c.DownloadArchive(ctx, session, format, home, inv.stdout)
		return err
	}
	byName := archiveFormat(out)
	switch {
	case byName == "":
		return usageError{fmt.Sprintf("-o %s: name the file .tar.gz, .tgz or .zip (the format goes by the name), or - for stdout", out)}
	case format != "" && format != byName:
		return usageError{fmt.Sprintf("--format %s and -o %s disagree: the name says %s", format, out, byName)}
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".hearth-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := c.DownloadArchive(ctx, session, byName, home, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(inv.stderr, "saved session %s to %s (%s)\n", session, out, humanize.IBytes(uint64(n)))
	return nil
}

// wsUpload sends archive (a file, or - for stdin) to be unpacked.
func wsUpload(ctx context.Context, c *client.Client, inv *env, session, archive, dir string) error {
	var r io.Reader = inv.stdin
	format := ""
	if archive != "-" {
		f, err := os.Open(archive)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
		format = archiveFormat(archive) // else the daemon tells by the first bytes
	}
	got, err := c.UploadArchive(ctx, session, dir, format, r)
	if err != nil {
		return err
	}
	fmt.Fprintf(inv.stdout, "unpacked %s into %s/%s: %s files, directories and links, %s\n", archive, session, got.Dir,
		humanize.Comma(got.Files), humanize.IBytes(uint64(got.Bytes)))
	return nil
}

// notFoundHint says how to list what exists when a workspace command
// names what does not.
func notFoundHint(err error) error {
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Code == "not_found" {
		return fmt.Errorf("%w (list what exists with 'hearth workspace ls' or 'hearth workspace snapshots SESSION')", err)
	}
	return err
}

// configAndClient reads the config (for what it says, like the mount)
// and connects to the daemon.
func configAndClient(inv *env) (appliance.Config, *client.Client, error) {
	cfg, err := loadConfig(inv.configFile())
	if err != nil {
		return cfg, nil, err
	}
	c, err := inv.client()
	return cfg, c, err
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
		return printJSON(out, list)
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
		return printJSON(out, list)
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
