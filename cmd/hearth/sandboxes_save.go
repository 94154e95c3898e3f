package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dustin/go-humanize"
	flag "github.com/spf13/pflag"

	"hearth/client"
)

// sbxSave saves a sandbox's root as a new image, showing progress on
// stderr and the result on stdout.
func sbxSave(*flag.FlagSet) action {
	return func(inv *env) error {
		c, err := inv.client()
		if err != nil {
			return err
		}
		id, name := inv.args[0], inv.args[1]
		start := time.Now()
		img, err := c.SaveSandbox(context.Background(), id, name, inv.stderr)
		var ae *client.APIError
		if errors.As(err, &ae) && ae.Step != "" {
			return fmt.Errorf("%w\n(nothing was kept: fix the cause and run 'hearth sandboxes save %s %s' again)", err, id, name)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(inv.stdout, "image %s %s saved from sandbox %s (%s) after %s: boot it with 'hearth sandboxes create --image %s'\n",
			img.Name, shortHash(img.Hash), id, humanize.IBytes(uint64(img.Size)), time.Since(start).Round(100*time.Millisecond), img.Name)
		return nil
	}
}
