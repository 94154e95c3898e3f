package appliance

import (
	"context"

	"hearth/agents/store"
	evstream "hearth/agents/stream"
)

// An execution's events, for agents_events_api.go: stored pages, and a
// subscription to the new ones.

// EventPage returns up to limit (default 1000, at most 10000) events of
// execution id after seq after; ended says there will be no more.
func (a *agentService) EventPage(ctx context.Context, id string, after int64, limit int) (evs []evstream.Event, ended bool, err error) {
	if after < 0 || limit < 0 {
		return nil, false, invalidf("after and limit must not be negative")
	}
	e, err := a.execution(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if limit <= 0 {
		limit = 1000
	}
	limit = min(limit, 10000)
	evs, err = a.store.Events(ctx, id, after, limit)
	if err != nil {
		return nil, false, err
	}
	return evs, e.Status.Terminal() && len(evs) < limit, nil
}

// Events returns up to limit stored events of execution id after seq after.
func (a *agentService) Events(ctx context.Context, id string, after int64, limit int) ([]evstream.Event, error) {
	return a.store.Events(ctx, id, after, limit)
}

// Subscribe delivers execution id's events after seq after, stored ones
// first; the caller closes it.
func (a *agentService) Subscribe(id string, after int64) (*store.Subscription, error) {
	return a.store.Subscribe(id, after)
}

// Stopping is closed when the daemon stops: streams end then.
func (a *agentService) Stopping() <-chan struct{} { return a.stopped }
