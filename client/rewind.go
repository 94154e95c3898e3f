package client

import (
	"context"
	"net/http"

	"hearth/appliance/api"
)

// Rewinding and branching agent sessions at a model call.
type (
	CallPoint            = api.CallPoint
	Rewind               = api.Rewind
	SessionBranch        = api.SessionBranch
	SessionBranchRequest = api.SessionBranchRequest
)

// Rewind puts session's files and its agent's conversation back as they
// were after model call (counted over the session, or over execution's
// calls when it is not ""; 0 is the start), so a resume continues from
// there. The result names the snapshot of the state before (Undo).
func (c *Client) Rewind(ctx context.Context, session string, call int, execution string) (Rewind, error) {
	var out Rewind
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.RewindAgentSession(ctx, session, api.RewindRequest{Call: call, Execution: execution})
	})
}

// UndoRewind brings session back to where it was before its latest
// rewind.
func (c *Client) UndoRewind(ctx context.Context, session string) (Rewind, error) {
	var out Rewind
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.UndoAgentSessionRewind(ctx, session)
	})
}

// BranchSession starts a new session as session was after req.Call,
// leaving session as it is.
func (c *Client) BranchSession(ctx context.Context, session string, req SessionBranchRequest) (SessionBranch, error) {
	var out SessionBranch
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.BranchAgentSession(ctx, session, req)
	})
}

// SessionBranches lists the sessions branched from session, newest first.
func (c *Client) SessionBranches(ctx context.Context, session string) ([]AgentSession, error) {
	var out []AgentSession
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListAgentSessionBranches(ctx, session)
	})
}

// AgentSession returns one agent session, with where it was branched from.
func (c *Client) AgentSession(ctx context.Context, id string) (AgentSession, error) {
	var out AgentSession
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetAgentSession(ctx, id) })
}
