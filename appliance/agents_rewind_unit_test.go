package appliance

import (
	"testing"

	"hearth/agents/store"
)

// TestLocateCall numbers calls over the session (oldest execution
// first) or over one execution, and finds the snapshot after each: the
// next call's, the end one after an execution's last call, the start
// one for call 0; the agent session id is the one reported by then.
func TestLocateCall(t *testing.T) {
	all := []execCalls{
		{exec: store.Execution{ID: "e1"}, calls: []int{1, 2}, agentSID: "cli-1"},
		{exec: store.Execution{ID: "e2"}, calls: []int{1, 2, 3}, agentSID: "cli-2"},
		{exec: store.Execution{ID: "e3"}},
	}
	for _, c := range []struct {
		call          int
		exec          string
		ok            bool
		snap, at, sid string
		sessionCall   int
	}{
		{1, "", true, "e1.call-2", "e1", "cli-1", 1},
		{2, "", true, "e1.end", "e1", "cli-1", 2},
		{3, "", true, "e2.call-2", "e2", "cli-2", 3},
		{5, "", true, "e2.end", "e2", "cli-2", 5},
		{6, "", false, "", "", "", 0},
		{0, "", true, "e1.start", "e1", "", 0},
		{1, "e2", true, "e2.call-2", "e2", "cli-2", 3},
		{3, "e2", true, "e2.end", "e2", "cli-2", 5},
		{4, "e2", false, "", "", "", 0},
		{0, "e2", true, "e2.start", "e2", "cli-1", 2},
		{1, "e3", false, "", "", "", 0},
		{1, "nope", false, "", "", "", 0},
	} {
		pt, ok, _ := locateCall(all, c.call, c.exec)
		if ok != c.ok || pt.Snapshot != c.snap || pt.Execution != c.at || pt.AgentSessionID != c.sid || pt.SessionCall != c.sessionCall {
			t.Errorf("locateCall(%d, %q) = %+v, %v; want %s in %s (session call %d, agent session %q), %v", c.call, c.exec, pt, ok, c.snap, c.at, c.sessionCall, c.sid, c.ok)
		}
	}
}
