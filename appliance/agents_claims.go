package appliance

import (
	"context"

	"hearth/agents/store"
)

// Leases on workspace paths (agents/claims.go), as operators see and
// manage them: agents take and release their own from inside their
// machines; an operator lists them and may release any.

// Claims lists the leases in force at or under prefix (relative to
// /workspace/agents; "" for all), of holder if it is set, by path.
func (a *agentService) Claims(ctx context.Context, prefix, holder string) ([]store.Claim, error) {
	return a.store.ListClaims(ctx, store.ClaimFilter{Prefix: prefix, Holder: holder})
}

// ReleaseClaim releases the lease on path whoever holds it, as an
// operator: a claim event in the holder's stream says so.
func (a *agentService) ReleaseClaim(ctx context.Context, path string) (store.Claim, error) {
	if err := a.available(); err != nil {
		return store.Claim{}, err
	}
	return a.runner.ForceRelease(ctx, path)
}
