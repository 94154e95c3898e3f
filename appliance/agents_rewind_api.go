package appliance

import (
	"net/http"

	"hearth/agents/store"
	"hearth/appliance/api"
)

// The rewind and branch routes, over agents_rewind.go.

func callPointView(pt CallPoint) api.CallPoint {
	return api.CallPoint{Execution: pt.Execution, Call: pt.Call, SessionCall: pt.SessionCall, Snapshot: pt.Snapshot, AgentSessionId: pt.AgentSessionID}
}

func agentSessionView(sess store.Session) api.AgentSession {
	return api.AgentSession{Id: sess.ID, Agent: sess.Agent, Created: sess.Created, LastExecution: sess.LastExecution,
		BranchedFrom: sess.BranchedFrom, BranchedAt: sess.BranchedAt}
}

func (s *server) RewindAgentSession(w http.ResponseWriter, r *http.Request, id string) {
	var req api.RewindRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	res, err := s.d.agents.Rewind(r.Context(), id, req.Call, req.Execution)
	result(w, http.StatusOK, api.Rewind{Session: id, To: callPointView(res.CallPoint), Undo: res.Undo}, err)
}

func (s *server) UndoAgentSessionRewind(w http.ResponseWriter, r *http.Request, id string) {
	res, err := s.d.agents.RewindUndo(r.Context(), id)
	result(w, http.StatusOK, api.Rewind{Session: id, To: callPointView(res.CallPoint), Undo: res.Undo}, err)
}

func (s *server) BranchAgentSession(w http.ResponseWriter, r *http.Request, id string) {
	var req api.SessionBranchRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	sess, pt, err := s.d.agents.BranchSession(r.Context(), id, req.Call, req.Execution, req.Id)
	result(w, http.StatusCreated, api.SessionBranch{Session: agentSessionView(sess), From: callPointView(pt)}, err)
}

func (s *server) ListAgentSessionBranches(w http.ResponseWriter, r *http.Request, id string) {
	list, err := s.d.agents.Branches(r.Context(), id)
	out := make([]api.AgentSession, 0, len(list))
	for _, sess := range list {
		out = append(out, agentSessionView(sess))
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) GetAgentSession(w http.ResponseWriter, r *http.Request, id string) {
	sess, err := s.d.agents.Session(r.Context(), id)
	result(w, http.StatusOK, agentSessionView(sess), err)
}
