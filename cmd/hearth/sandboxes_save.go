package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/dustin/go-humanize"

	"hearth/client"
)

// sbxSave saves a sandbox's root as a new image, showing progress on
// stderr and the result on stdout.
func sbxSave(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("sandboxes save", flag.ContinueOnError)
	c, pos, err := sbxArgs(fl, args, 2, 2, "save ID IMAGE")
	if err != nil {
		return err
	}
	id, name := pos[0], pos[1]
	start := time.Now()
	img, err := c.SaveSandbox(context.Background(), id, name, stderr)
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Step != "" {
		return fmt.Errorf("%w\n(nothing was kept: fix the cause and run 'hearth sandboxes save %s %s' again)", err, id, name)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image %s %s saved from sandbox %s (%s) after %s: boot it with 'hearth sandboxes create --image %s'\n",
		img.Name, shortHash(img.Hash), id, humanize.IBytes(uint64(img.Size)), time.Since(start).Round(100*time.Millisecond), img.Name)
	return nil
}
