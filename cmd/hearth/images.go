package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"hearth/client"
)

func cmdImages(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"images: say what to do: build, ls, inspect or rm"}
	}
	verb, args := args[0], args[1:]
	fl := flag.NewFlagSet("images "+verb, flag.ContinueOnError)
	config := fl.String("config", "", "config file")
	asJSON := fl.Bool("json", false, "print JSON")
	pos, err := parseFlags(fl, args)
	if err != nil {
		return err
	}
	need := func(form string) error {
		if len(pos) != 1 {
			return usageError{"usage: hearth images " + form}
		}
		return nil
	}
	var run func(context.Context, *client.Client) error
	switch verb {
	case "build":
		err = need("build NAME")
		run = func(ctx context.Context, c *client.Client) error { return imgBuild(ctx, c, pos[0], stdout, stderr) }
	case "ls", "list":
		run = func(ctx context.Context, c *client.Client) error { return imgList(ctx, c, stdout, *asJSON) }
	case "inspect":
		err = need("inspect NAME [--json]")
		run = func(ctx context.Context, c *client.Client) error {
			return imgInspect(ctx, c, pos[0], stdout, *asJSON)
		}
	case "rm":
		err = need("rm NAME")
		run = func(ctx context.Context, c *client.Client) error {
			if err := c.RemoveImage(ctx, pos[0]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "removed image %s\n", pos[0])
			return nil
		}
	default:
		return usageError{fmt.Sprintf("images: unknown command %q: use build, ls, inspect or rm", verb)}
	}
	if err != nil {
		return err
	}
	c, err := connect(*config)
	if err != nil {
		return err
	}
	return run(context.Background(), c)
}

// imgBuild shows the build's progress on stderr and the result on stdout.
func imgBuild(ctx context.Context, c *client.Client, name string, stdout, stderr io.Writer) error {
	start := time.Now()
	img, err := c.BuildImage(ctx, name, stderr)
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Step != "" {
		return fmt.Errorf("%w\n(nothing was kept: fix the cause and run 'hearth images build %s' again)", err, name)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image %s %s ready (%s) after %s\n", img.Name, shortHash(img.Hash), humanize.IBytes(uint64(img.Size)),
		time.Since(start).Round(100*time.Millisecond))
	return nil
}

func shortHash(h string) string { return h[:min(len(h), 12)] }

func imgList(ctx context.Context, c *client.Client, out io.Writer, asJSON bool) error {
	list, err := c.Images(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(out).Encode(list)
	}
	if len(list.Images) == 0 {
		fmt.Fprintf(out, "no images built yet: build one with 'hearth images build base' (recipes: %s)\n", strings.Join(list.Recipes, ", "))
		return nil
	}
	sort.SliceStable(list.Images, func(i, j int) bool { return list.Images[i].Name < list.Images[j].Name })
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tHASH\tSTATE\tUSER\tSIZE\tBUILT")
	for _, img := range list.Images {
		state := "current"
		if !img.Current {
			state = "outdated"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", img.Name, shortHash(img.Hash), state, dash(img.User),
			humanize.IBytes(uint64(img.Size)), humanize.Time(img.Built))
	}
	return tw.Flush()
}

func imgInspect(ctx context.Context, c *client.Client, name string, out io.Writer, asJSON bool) error {
	m, err := c.InspectImage(ctx, name)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(m)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("image", m.Name)
	row("hash", m.Hash)
	row("parent", strings.TrimSpace(m.Parent+" "+shortHash(m.ParentHash)))
	row("suite", m.Suite)
	row("mirror", m.Mirror)
	row("built", fmt.Sprintf("%s (%s, took %s)", m.Built.Local().Format(time.DateTime), humanize.Time(m.Built),
		(time.Duration(m.BuildSeconds*float64(time.Second))).Round(100*time.Millisecond)))
	if m.User.Name != "" {
		row("user", fmt.Sprintf("%s (uid %d, %s)", m.User.Name, m.User.Uid, m.User.Shell))
	}
	var env []string
	for k, v := range m.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	row("env", strings.Join(env, " "))
	row("size", fmt.Sprintf("%s root, %s ext4", humanize.IBytes(uint64(m.Size)), humanize.IBytes(uint64(m.Ext4Size))))
	row("packages", fmt.Sprintf("%d Debian, %d npm (--json lists them)", len(m.DebianPackages), len(m.NpmPackages)))
	return tw.Flush()
}
