package client

import (
	"context"
	"net/http"

	"hearth/appliance/api"
)

// Types of the schedule routes, for the client's callers.
type (
	Schedule        = api.Schedule
	ScheduleRequest = api.ScheduleRequest
	ScheduleRun     = api.ScheduleRun
)

// Schedules lists the schedules, by id.
func (c *Client) Schedules(ctx context.Context) ([]Schedule, error) {
	var out []Schedule
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListSchedules(ctx) })
}

// AddSchedule adds a schedule, or replaces the one with the same id.
func (c *Client) AddSchedule(ctx context.Context, req ScheduleRequest) (Schedule, error) {
	var out Schedule
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.AddSchedule(ctx, req) })
}

// RemoveSchedule deletes a schedule; its history stays.
func (c *Client) RemoveSchedule(ctx context.Context, id string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) { return c.api.DeleteSchedule(ctx, id) })
}

// RunSchedule starts a run of a schedule now and returns the run's id.
func (c *Client) RunSchedule(ctx context.Context, id string) (string, error) {
	var out api.ScheduleRunStarted
	err := c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.RunSchedule(ctx, id) })
	return out.Run, err
}

// ScheduleRuns returns a schedule's runs, newest first: up to limit, 0
// for the daemon's default, negative for all.
func (c *Client) ScheduleRuns(ctx context.Context, id string, limit int) ([]ScheduleRun, error) {
	var out []ScheduleRun
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListScheduleRuns(ctx, id, &api.ListScheduleRunsParams{Limit: limit})
	})
}
