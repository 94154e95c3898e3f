package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"hearth/appliance/api"
)

// Checkpoints lists a sandbox's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]Checkpoint, error) {
	var out []Checkpoint
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListCheckpoints(ctx, id) })
}

// Checkpoint saves a sandbox's writable layer as name (generated when
// empty), pausing it while the layer is copied.
func (c *Client) Checkpoint(ctx context.Context, id, name string) (Checkpoint, error) {
	var out Checkpoint
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.CreateCheckpoint(ctx, id, api.CheckpointRequest{Name: name})
	})
}

// RestoreCheckpoint puts a sandbox's files back as they were at
// checkpoint name; every process in it ends and its agent restarts.
func (c *Client) RestoreCheckpoint(ctx context.Context, id, name string) (Sandbox, error) {
	var out Sandbox
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.RestoreCheckpoint(ctx, id, name) })
}

// DeleteCheckpoint removes one of a sandbox's checkpoints.
func (c *Client) DeleteCheckpoint(ctx context.Context, id, name string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) { return c.api.DeleteCheckpoint(ctx, id, name) })
}

// SaveSandbox makes image name from a sandbox's root as it is now, writing
// each progress line to progress. Only ctx bounds it. A failed step is an
// *APIError with code build_failed and the Step.
func (c *Client) SaveSandbox(ctx context.Context, id, name string, progress io.Writer) (Image, error) {
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.SaveSandbox(ctx, id, api.SaveSandboxRequest{Image: name})
	})
	if err != nil {
		return Image{}, err
	}
	defer resp.Body.Close()
	return readBuildFrames(resp, progress, "save sandbox "+id+" as image "+name)
}

// readBuildFrames reads a build or save stream to its image or error,
// writing each progress line to progress.
func readBuildFrames(resp *http.Response, progress io.Writer, what string) (Image, error) {
	dec := json.NewDecoder(resp.Body)
	for {
		var f api.BuildFrame
		if err := dec.Decode(&f); err != nil {
			return Image{}, fmt.Errorf("%s: progress ended without a result: %w", what, err)
		}
		switch {
		case f.Image != nil:
			return *f.Image, nil
		case f.Error != nil:
			return Image{}, &APIError{Code: f.Error.Code, Message: f.Error.Message, Step: f.Error.Step, Status: resp.StatusCode}
		case progress != nil:
			fmt.Fprintln(progress, f.Progress)
		}
	}
}

// ForkSandbox makes count new sandboxes (1 to 16) that start with a copy
// of sandbox id's files as they are now and, with a session, a branch of
// it. Memory is not carried over: no process, and an empty /tmp.
func (c *Client) ForkSandbox(ctx context.Context, id string, count int) (ForkResult, error) {
	var out ForkResult
	// Without reflinks each fork copies the layer: a big layer takes
	// seconds per fork. The transport waits 2 minutes for an answer.
	return out, c.callWithin(ctx, max(c.Timeout, 2*time.Minute), &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ForkSandbox(ctx, id, api.ForkSandboxRequest{Count: count})
	})
}
