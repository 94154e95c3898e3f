package client

import (
	"context"
	"io"
	"net/http"
	"time"

	"hearth/appliance/api"
)

// StartJob starts a command in a sandbox in the background and returns
// at once; the job outlives the call.
func (c *Client) StartJob(ctx context.Context, id string, req JobRequest) (Job, error) {
	var out Job
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.StartJob(ctx, id, req) })
}

// Jobs lists a sandbox's jobs, running and ended, oldest first.
func (c *Client) Jobs(ctx context.Context, id string) ([]Job, error) {
	var out []Job
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListJobs(ctx, id) })
}

// Job describes one job.
func (c *Client) Job(ctx context.Context, id, job string) (Job, error) {
	var out Job
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetJob(ctx, id, job) })
}

// JobOutput copies what a job kept of stream ("stdout" or "stderr": the
// newest 1 MiB) to w.
func (c *Client) JobOutput(ctx context.Context, id, job, stream string, w io.Writer) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	resp, err := c.send(ctx, func(ctx context.Context) (*http.Response, error) {
		return c.api.JobOutput(ctx, id, job, &api.JobOutputParams{Stream: api.JobOutputParamsStream(stream)})
	})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return io.Copy(w, resp.Body)
}

// StopJob sends a job TERM, then KILL after grace, and returns it once it
// ended.
func (c *Client) StopJob(ctx context.Context, id, job string, grace time.Duration) (Job, error) {
	req := api.StopJobRequest{Grace: grace.String()}
	// The call lasts up to the grace period, on top of the usual.
	cc := *c
	cc.Timeout += grace
	var out Job
	return out, cc.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.StopJob(ctx, id, job, req) })
}
