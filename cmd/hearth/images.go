package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/appliance"
	"hearth/client"
)

func imagesCmd() *command {
	// imageDo is the action of a command on the one image it names.
	imageDo := func(do func(ctx context.Context, c *client.Client, name string, inv *env) error) action {
		return func(inv *env) error {
			c, err := inv.client()
			if err != nil {
				return err
			}
			return do(context.Background(), c, inv.args[0], inv)
		}
	}
	return &command{name: "images", summary: "the images sandboxes boot, built from recipes", example: "hearth images ls\nhearth images build claude-code", aliases: []string{"image"}, subs: []*command{
		{name: "build", example: "hearth images build claude-code\nhearth images build base node claude-code --cache /var/tmp/hearth-images", args: "NAME...", min: 1, max: -1, names: recipeNames,
			summary: "build images from their recipes, showing progress\n(--cache DIR: into an image cache, without a daemon)", setup: imgBuildCmd},
		{name: "ls", example: "hearth images ls\nhearth images ls --json", aliases: []string{"list"}, summary: "list built images and recipes", setup: func(fl *flag.FlagSet) action {
			asJSON := jsonFlag(fl)
			return func(inv *env) error {
				c, err := inv.client()
				if err != nil {
					return err
				}
				return imgList(context.Background(), c, inv.stdout, *asJSON)
			}
		}},
		{name: "inspect", example: "hearth images inspect codex", args: "NAME", min: 1, max: 1, names: imageNames, summary: "show an image's manifest", setup: func(fl *flag.FlagSet) action {
			asJSON := jsonFlag(fl)
			return imageDo(func(ctx context.Context, c *client.Client, name string, inv *env) error {
				return imgInspect(ctx, c, name, inv.stdout, *asJSON)
			})
		}},
		{name: "rm", example: "hearth images rm codex", args: "NAME", min: 1, max: 1, names: imageNames, summary: "delete a built image", setup: func(*flag.FlagSet) action {
			return imageDo(func(ctx context.Context, c *client.Client, name string, inv *env) error {
				if err := c.RemoveImage(ctx, name); err != nil {
					return err
				}
				fmt.Fprintf(inv.stdout, "removed image %s\n", name)
				return nil
			})
		}},
	}}
}

func imgBuildCmd(fl *flag.FlagSet) action {
	cache := fl.String("cache", "", "build into this image cache directory without a daemon (laid out as a daemon's state_dir/images; the tests' HEARTH_TEST_IMAGES)")
	return func(inv *env) error {
		ctx := context.Background()
		if *cache != "" {
			start := time.Now()
			imgs, err := appliance.BuildImagesInto(ctx, *cache, inv.args, inv.stderr)
			for _, img := range imgs {
				fmt.Fprintf(inv.stdout, "image %s %s ready (%s)\n", img.Name, shortHash(img.Hash), humanize.IBytes(uint64(img.Size)))
			}
			if err == nil {
				fmt.Fprintf(inv.stdout, "%d images ready in %s after %s\n", len(imgs), *cache, time.Since(start).Round(100*time.Millisecond))
			}
			return err
		}
		c, err := inv.client()
		if err != nil {
			return err
		}
		for _, name := range inv.args {
			if err := imgBuild(ctx, c, name, inv.stdout, inv.stderr); err != nil {
				return err
			}
		}
		return nil
	}
}

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
		return printJSON(out, list)
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
		return printJSON(out, m)
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
