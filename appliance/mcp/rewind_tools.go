package mcp

import (
	"context"
	"fmt"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/client"
)

// rewind_session and branch_session: an agent session put back, or a
// new one started, as it was after a model call.

type rewindArgs struct {
	Session   string `json:"session" jsonschema:"an agent session id, like session-a8f3e2"`
	Call      *int   `json:"call,omitempty" jsonschema:"the model call after which to go back: counted over the session's calls from 1 (0 is the start); required unless undo"`
	Execution string `json:"execution,omitempty" jsonschema:"count only this execution's calls"`
	Undo      bool   `json:"undo,omitempty" jsonschema:"bring the session back to where it was before its latest rewind instead"`
}

type branchArgs struct {
	Session   string `json:"session" jsonschema:"an agent session id, like session-a8f3e2"`
	Call      int    `json:"call" jsonschema:"the model call after which the branch starts: counted over the session's calls from 1 (0 is the start)"`
	Execution string `json:"execution,omitempty" jsonschema:"count only this execution's calls"`
	ID        string `json:"id,omitempty" jsonschema:"the new session's id; generated when left out"`
}

type callPoint struct {
	Execution   string `json:"execution,omitempty"`
	Call        int    `json:"call" jsonschema:"the call's number in its execution"`
	SessionCall int    `json:"session_call" jsonschema:"its number over the session"`
	Snapshot    string `json:"snapshot" jsonschema:"the session snapshot the state came from"`
}

type rewound struct {
	Session string    `json:"session"`
	To      callPoint `json:"to"`
	Undo    string    `json:"undo" jsonschema:"the snapshot of the state before the rewind (rewind_session with undo brings it back)"`
}

type branched struct {
	Session string    `json:"session" jsonschema:"the new session, to continue with delegate_task's session"`
	From    callPoint `json:"from"`
}

func (h *handlers) addRewindTools(s *mcpsdk.Server) {
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "rewind_session", Description: "Put an agent session's files and its agent's conversation back as they were after a model call, " +
		"so continuing it (delegate_task with session) goes on from there. Refused while it runs. Undoable."}, h.rewind)
	mcpsdk.AddTool(s, &mcpsdk.Tool{Name: "branch_session", Description: "Start a new agent session as a session was after a model call, with the conversation up to there; " +
		"the original is left as it is and both can be continued on their own."}, h.branch)
}

func fromPoint(p client.CallPoint) callPoint {
	return callPoint{Execution: p.Execution, Call: p.Call, SessionCall: p.SessionCall, Snapshot: p.Snapshot}
}

func (h *handlers) rewind(ctx context.Context, _ *mcpsdk.CallToolRequest, in rewindArgs) (*mcpsdk.CallToolResult, rewound, error) {
	var (
		rw  client.Rewind
		err error
	)
	switch {
	case in.Undo && in.Call != nil:
		return nil, rewound{}, fmt.Errorf("give call or undo, not both")
	case in.Undo:
		rw, err = h.d.UndoRewind(ctx, in.Session)
	case in.Call == nil:
		return nil, rewound{}, fmt.Errorf("say which model call with call (from 1; 0 is the start), or undo")
	default:
		rw, err = h.d.Rewind(ctx, in.Session, *in.Call, in.Execution)
	}
	if err != nil {
		return nil, rewound{}, err
	}
	return nil, rewound{Session: rw.Session, To: fromPoint(rw.To), Undo: rw.Undo}, nil
}

func (h *handlers) branch(ctx context.Context, _ *mcpsdk.CallToolRequest, in branchArgs) (*mcpsdk.CallToolResult, branched, error) {
	br, err := h.d.BranchSession(ctx, in.Session, client.SessionBranchRequest{Call: in.Call, Execution: in.Execution, Id: in.ID})
	if err != nil {
		return nil, branched{}, err
	}
	return nil, branched{Session: br.Session.Id, From: fromPoint(br.From)}, nil
}
