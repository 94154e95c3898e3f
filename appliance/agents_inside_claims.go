package appliance

import (
	"context"
	"errors"
	"time"

	"hearth/agents"
	"hearth/agents/inside"
	"hearth/agents/store"
)

// The hearth MCP server's coordination tools, through the runner's
// leases and file waits, as the calling execution.

func (p insidePlatform) WaitForFiles(ctx context.Context, c inside.Caller, session, pattern string, changes bool, timeout time.Duration) ([]string, error) {
	if err := p.a.available(); err != nil {
		return nil, err
	}
	files, err := p.a.runner.WaitForFiles(ctx, session, pattern, changes, timeout)
	if errors.Is(err, agents.ErrTimeout) {
		return nil, nil // the tool says it timed out
	}
	return files, err
}

func (p insidePlatform) ClaimPath(ctx context.Context, c inside.Caller, path string, ttl time.Duration) (inside.Claim, error) {
	if err := p.a.available(); err != nil {
		return inside.Claim{}, err
	}
	cl, err := p.a.runner.ClaimPath(ctx, c.Execution, path, ttl)
	return insideClaim(cl), err
}

func (p insidePlatform) ReleasePath(ctx context.Context, c inside.Caller, path string) error {
	if err := p.a.available(); err != nil {
		return err
	}
	return p.a.runner.ReleasePath(ctx, c.Execution, path)
}

func (p insidePlatform) Claims(ctx context.Context, c inside.Caller, prefix string) ([]inside.Claim, error) {
	if err := p.a.available(); err != nil {
		return nil, err
	}
	list, err := p.a.runner.Claims(ctx, prefix)
	var out []inside.Claim
	for _, cl := range list {
		out = append(out, insideClaim(cl))
	}
	return out, err
}

func insideClaim(c store.Claim) inside.Claim {
	return inside.Claim{Path: c.Path, Holder: c.Holder, Session: c.Session, Acquired: c.Acquired, Expires: c.Expires}
}
