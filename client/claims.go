package client

import (
	"context"
	"net/http"

	"hearth/appliance/api"
)

// Claim is an advisory lease on a workspace path, held by an execution.
type Claim = api.Claim

// Claims lists the leases in force at or under prefix (relative to
// /workspace/agents; "" for all), of holder if it is set, by path.
func (c *Client) Claims(ctx context.Context, prefix, holder string) ([]Claim, error) {
	var out []Claim
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListClaims(ctx, &api.ListClaimsParams{Prefix: prefix, Holder: holder})
	})
}

// ReleaseClaim releases the lease on path, whoever holds it, and returns
// it.
func (c *Client) ReleaseClaim(ctx context.Context, path string) (Claim, error) {
	var out Claim
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ReleaseClaim(ctx, path) })
}
