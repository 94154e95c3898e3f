package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"hearth/agents"
	"hearth/agents/gateway"
	"hearth/agents/store"
	evstream "hearth/agents/stream"
	"hearth/fs"
)

// Rewind and branch: a session's call snapshots (agents/callsnap.go)
// put back in place (rewind) or copied into a new session (branch).
//
// "After call N" is the state the call's answer left: its snapshot is
// the one taken next in the same execution (as call N+1's answer
// arrived, by when the agent had acted on call N's answer and its CLI
// had written both to its transcript), or the execution's end snapshot
// after its last call. Call 0 is the execution's start.
//
// Calls are numbered over the whole session, oldest execution first,
// counting each finished model call once (as the session's streams list
// them); with an execution named, N counts that execution's calls only,
// as its call-N snapshots do.

// rewindPrefix starts the name of the snapshot of a session's state
// before a rewind: rewind-<time>, found with `hearth workspace snapshots`.
const rewindPrefix = "rewind-"

// CallPoint is a point of an agent session: the state after a call.
type CallPoint struct {
	Execution   string // the execution the call is part of
	Call        int    // the call's number in that execution (0: its start)
	SessionCall int    // its number over the session's calls
	Snapshot    string // the session snapshot holding the state after it
	// AgentSessionID is the agent CLI's session id then: what a resume
	// from this point passes back to it.
	AgentSessionID string
}

// RewindResult is what a rewind did.
type RewindResult struct {
	CallPoint
	Undo string // the snapshot of the state before the rewind: RewindUndo brings it back
}

// execCalls is what a session's execution recorded about its calls.
type execCalls struct {
	exec     store.Execution
	calls    []int  // the call snapshot numbers of its finished calls, in order
	agentSID string // the agent CLI's session id it reported, or ""
}

// sessionCalls reads the finished calls of each of session's executions,
// oldest execution first.
func (a *agentService) sessionCalls(ctx context.Context, session string) ([]execCalls, error) {
	execs, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Session: session, Limit: 10000})
	if err != nil {
		return nil, err
	}
	slices.Reverse(execs)
	out := make([]execCalls, 0, len(execs))
	for _, e := range execs {
		ec := execCalls{exec: e}
		evs, err := a.store.Events(ctx, e.ID, 0, 0)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			ec.read(ev)
		}
		out = append(out, ec)
	}
	return out, nil
}

var callSnapNumber = regexp.MustCompile(`\.call-([0-9]+)$`)

// read takes in one of the execution's events.
func (ec *execCalls) read(ev evstream.Event) {
	switch ev.Type {
	case evstream.ModelCall:
		var p gateway.ModelCallPayload
		if json.Unmarshal(ev.Payload, &p) != nil || p.Phase == gateway.PhaseStart {
			return
		}
		n := len(ec.calls) + 1
		if m := callSnapNumber.FindStringSubmatch(p.Snapshot); m != nil {
			n, _ = strconv.Atoi(m[1])
		}
		ec.calls = append(ec.calls, n)
	case evstream.Status:
		var p struct {
			AgentSessionID string `json:"agent_session_id"`
		}
		// The first one reported: the adapters let no later line change
		// it (docs/security.md), and neither does this.
		if ec.agentSID == "" && json.Unmarshal(ev.Payload, &p) == nil {
			ec.agentSID = p.AgentSessionID
		}
	}
}

// callPoint finds call N of session (of execution, if not "") and the
// snapshot holding the state after it, which must still be kept.
func (a *agentService) callPoint(ctx context.Context, session string, call int, execution string) (CallPoint, error) {
	if call < 0 {
		return CallPoint{}, invalidf("call %d: calls are numbered from 1 (0 is the execution's start)", call)
	}
	all, err := a.sessionCalls(ctx, session)
	if err != nil {
		return CallPoint{}, err
	}
	pt, ok, total := locateCall(all, call, execution)
	if !ok {
		if execution != "" && !slices.ContainsFunc(all, func(ec execCalls) bool { return ec.exec.ID == execution }) {
			return pt, notFoundf("session %s has no execution %s: list them with 'hearth agents list --session %s'", session, execution, session)
		}
		return pt, notFoundf("session %s has %d finished model calls%s: no call %d", session, total, inExec(execution), call)
	}
	names, err := a.work.Snapshots(session)
	if err != nil {
		return pt, err
	}
	if !slices.ContainsFunc(names, func(n agents.SnapshotRef) bool { return n.Name == pt.Snapshot }) {
		return pt, notFoundf("the state after call %d%s is snapshot %s, which is gone (agents.call_snapshots = %q keeps fewer, or the snapshot was taken off): list what is kept with 'hearth workspace snapshots %s'",
			call, inExec(execution), pt.Snapshot, a.runnerRetention(), session)
	}
	return pt, nil
}

func inExec(execution string) string {
	if execution == "" {
		return ""
	}
	return " in execution " + execution
}

func (a *agentService) runnerRetention() string {
	r, _ := agents.ParseRetention(a.cfg.Agents.CallSnapshots)
	return r.String()
}

// locateCall finds call N among the executions' calls; it returns how
// many calls there are when there is no call N.
func locateCall(all []execCalls, call int, execution string) (CallPoint, bool, int) {
	seen, agentSID := 0, ""
	for _, ec := range all {
		before := agentSID
		if ec.agentSID != "" {
			agentSID = ec.agentSID
		}
		mine := execution == "" || ec.exec.ID == execution
		if mine && call == 0 {
			return CallPoint{Execution: ec.exec.ID, SessionCall: seen, AgentSessionID: before,
				Snapshot: agents.CallSnapshotName(ec.exec.ID, "start", 0)}, true, 0
		}
		for i, n := range ec.calls {
			k := i + 1
			if execution == "" {
				k = seen + i + 1
			}
			if !mine || k != call {
				continue
			}
			pt := CallPoint{Execution: ec.exec.ID, Call: n, SessionCall: seen + i + 1, AgentSessionID: agentSID,
				Snapshot: agents.CallSnapshotName(ec.exec.ID, "end", 0)}
			if slices.Contains(ec.calls, n+1) {
				pt.Snapshot = agents.CallSnapshotName(ec.exec.ID, "call", n+1)
			}
			return pt, true, 0
		}
		seen += len(ec.calls)
		if ec.exec.ID == execution {
			return CallPoint{}, false, len(ec.calls)
		}
	}
	return CallPoint{}, false, seen
}

// Rewind puts session back as it was after call (of execution, if not
// ""): its files and its agent's conversation, so a resume continues from
// there. The state before is kept as snapshot rewind-<time> (Undo).
// Refused while an execution runs in the session.
func (a *agentService) Rewind(ctx context.Context, session string, call int, execution string) (RewindResult, error) {
	a.startMu.Lock() // no start can slip in between the check and the restore
	defer a.startMu.Unlock()
	sess, err := a.idleSession(ctx, session)
	if err != nil {
		return RewindResult{}, err
	}
	pt, err := a.callPoint(ctx, session, call, execution)
	if err != nil {
		return RewindResult{}, err
	}
	return a.restore(ctx, sess, pt, "rewound")
}

// RewindUndo brings session back to the state before its latest rewind
// (itself a rewind, so undoing it again redoes).
func (a *agentService) RewindUndo(ctx context.Context, session string) (RewindResult, error) {
	a.startMu.Lock()
	defer a.startMu.Unlock()
	sess, err := a.idleSession(ctx, session)
	if err != nil {
		return RewindResult{}, err
	}
	names, err := a.work.Snapshots(session)
	if err != nil {
		return RewindResult{}, err
	}
	var last string
	for _, n := range names {
		if strings.HasPrefix(n.Name, rewindPrefix) {
			last = n.Name
		}
	}
	if last == "" {
		return RewindResult{}, notFoundf("session %s has not been rewound: nothing to undo", session)
	}
	pt := CallPoint{Snapshot: last, AgentSessionID: a.agentSIDBefore(ctx, sess, last)}
	return a.restore(ctx, sess, pt, "undone")
}

// agentSIDBefore is the agent CLI session id a session had before the
// rewind that took snapshot undo, as its rewind event recorded it.
func (a *agentService) agentSIDBefore(ctx context.Context, sess store.Session, undo string) string {
	evs, err := a.store.Events(ctx, sess.LastExecution, 0, 0)
	if err != nil {
		return sess.AgentSessionID
	}
	for _, ev := range slices.Backward(evs) {
		var p rewindPayload
		if ev.Type == evstream.Rewind && json.Unmarshal(ev.Payload, &p) == nil && p.Undo == undo {
			return p.AgentSessionBefore
		}
	}
	return sess.AgentSessionID
}

// rewindPayload is a rewind event's payload.
type rewindPayload struct {
	Op                 string `json:"op"` // rewound, undone or branched
	Execution          string `json:"execution,omitempty"`
	Call               int    `json:"call,omitempty"`
	SessionCall        int    `json:"session_call,omitempty"`
	Snapshot           string `json:"snapshot"`
	Undo               string `json:"undo,omitempty"`
	Branch             string `json:"branch,omitempty"`
	AgentSessionBefore string `json:"agent_session_before,omitempty"`
}

// restore snapshots the session as it is, restores pt's snapshot, makes
// the agent's session id agree and records the rewind in the stream.
func (a *agentService) restore(ctx context.Context, sess store.Session, pt CallPoint, op string) (RewindResult, error) {
	undo := rewindPrefix + time.Now().UTC().Format("20060102t150405.000000")
	if err := a.work.Snapshot(sess.ID, undo); err != nil {
		return RewindResult{}, fmt.Errorf("snapshot session %s before the rewind: %w", sess.ID, err)
	}
	if err := a.work.Restore(sess.ID, pt.Snapshot); err != nil {
		return RewindResult{}, fmt.Errorf("rewind session %s to %s: %w", sess.ID, pt.Snapshot, err)
	}
	if err := a.store.SetAgentSessionID(ctx, sess.ID, pt.AgentSessionID); err != nil {
		return RewindResult{}, err
	}
	p := rewindPayload{Op: op, Execution: pt.Execution, Call: pt.Call, SessionCall: pt.SessionCall, Snapshot: pt.Snapshot, Undo: undo, AgentSessionBefore: sess.AgentSessionID}
	if err := a.recordRewind(ctx, sess, p); err != nil {
		return RewindResult{}, err
	}
	return RewindResult{CallPoint: pt, Undo: undo}, nil
}

// recordRewind appends a rewind event to the session's last execution's
// stream: the session's history is its executions' streams.
func (a *agentService) recordRewind(ctx context.Context, sess store.Session, p rewindPayload) error {
	if sess.LastExecution == "" {
		return nil // a branch never run has no stream yet
	}
	_, err := a.store.Append(ctx, evstream.New(sess.ID, sess.LastExecution, evstream.Rewind, p))
	return err
}

// BranchSession makes a new session, newID ("" for a generated one),
// that starts as session was after call (of execution, if not ""), with
// the agent's conversation up to there; session is left as it is and
// both resume on their own. Exported for the other services: a sandbox
// fork branches its session through it.
func (a *agentService) BranchSession(ctx context.Context, session string, call int, execution, newID string) (store.Session, CallPoint, error) {
	if newID != "" {
		if err := fs.ValidateID("session", newID); err != nil {
			return store.Session{}, CallPoint{}, invalid(err)
		}
	}
	sess, err := a.Session(ctx, session)
	if err != nil {
		return store.Session{}, CallPoint{}, err
	}
	pt, err := a.callPoint(ctx, session, call, execution)
	if err != nil {
		return store.Session{}, CallPoint{}, err
	}
	branch, err := a.store.CreateSession(ctx, store.Session{ID: newID, Agent: sess.Agent, AgentSessionID: pt.AgentSessionID,
		BranchedFrom: session, BranchedAt: pt.Snapshot})
	if errors.Is(err, store.ErrExists) {
		return store.Session{}, CallPoint{}, conflictf("session %s exists: name the branch another way", newID)
	} else if err != nil {
		return store.Session{}, CallPoint{}, err
	}
	if err := a.branchFiles(session, pt.Snapshot, branch.ID); err != nil {
		return store.Session{}, CallPoint{}, err
	}
	err = a.recordRewind(ctx, sess, rewindPayload{Op: "branched", Execution: pt.Execution, Call: pt.Call, SessionCall: pt.SessionCall, Snapshot: pt.Snapshot, Branch: branch.ID})
	return branch, pt, err
}

// branchFiles makes the branch's tree from the snapshot and moves the
// transcripts its agent CLI keeps by working directory to the branch's.
func (a *agentService) branchFiles(session, snapshot, branch string) error {
	if err := a.work.Branch(session, snapshot, branch); err != nil {
		if errors.Is(err, fs.ErrExists) {
			return conflictf("workspace session %s exists: name the branch another way", branch)
		}
		return fmt.Errorf("branch session %s at %s: %w", session, snapshot, err)
	}
	for _, m := range agents.TranscriptMoves(session, branch) {
		err := a.work.Move(branch, m[0], m[1])
		if err != nil && !errors.Is(err, fs.ErrNotFound) { // a CLI that kept none
			return fmt.Errorf("move the agent's transcripts to branch %s: %w", branch, err)
		}
	}
	return nil
}

// Branches lists the sessions branched from session, newest first.
func (a *agentService) Branches(ctx context.Context, session string) ([]store.Session, error) {
	return a.store.ListSessions(ctx, store.SessionFilter{BranchedFrom: session, Limit: 10000})
}

// Session returns the agent session id.
func (a *agentService) Session(ctx context.Context, id string) (store.Session, error) {
	sess, err := a.store.GetSession(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return sess, notFoundf("no session %s: list them with 'hearth agents sessions'", id)
	}
	return sess, err
}
