package main

import (
	"encoding/json"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestClaimsCommand: the lease commands against a real daemon: an empty
// list says so (and is [] as JSON); releasing a path nobody holds is not
// found; a path outside the tree is refused with what to give.
func TestClaimsCommand(t *testing.T) {
	c, _ := agentDaemon(t, modeltest.Config{}, false)
	runSteps(t, []step{
		{args: []string{"claims", "list", c}, wantOut: "no leases in force"},
		{args: []string{"claims", "list", "session-a8f3e2/outputs", "--holder", "exec-00000000", c}, wantOut: "no leases in force"},
		{args: []string{"claims", "list", "--json", c}, wantOut: "[]"},
		{args: []string{"claims", "release", "session-a8f3e2/outputs/part-1.md", c}, wantCode: exitNotFound, wantErr: "no lease in force"},
		{args: []string{"claims", "release", "../etc/passwd", c}, wantCode: exitError, wantErr: "relative to /workspace/agents"},
		{args: []string{"claims", "list", "/etc", c}, wantCode: exitError, wantErr: "relative to /workspace/agents"},
		{args: []string{"claims", "release", c}, wantCode: exitUsage},
	})
	out, _, code := hearthIn(t, "", "claims", "list", "--json", c)
	var list []client.Claim
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 0 {
		t.Errorf("claims list --json = %d %q", code, out)
	}
}

// TestDescribeClaim: how a lease's events read in agents logs.
func TestDescribeClaim(t *testing.T) {
	expires := time.Date(2026, 11, 22, 10, 10, 0, 0, time.UTC)
	at := expires.Local().Format("15:04:05")
	for _, c := range []struct {
		payload map[string]any
		want    string
	}{
		{map[string]any{"op": "claimed", "path": "s1/outputs/a.md", "holder": "exec-1", "expires": expires}, "claimed s1/outputs/a.md until " + at},
		{map[string]any{"op": "renewed", "path": "s1/a", "holder": "exec-1", "expires": expires}, "renewed s1/a until " + at},
		{map[string]any{"op": "taken_over", "path": "s1/a", "holder": "exec-2", "previous": "exec-1", "expires": expires},
			"taken over s1/a until " + at + " by exec-2 (exec-1's lease had expired)"},
		{map[string]any{"op": "released", "path": "s1/a", "holder": "exec-1", "by": "operator"}, "released s1/a by an operator"},
		{map[string]any{"op": "expired", "path": "s1/a", "holder": "exec-1", "by": "end"}, "expired s1/a as the execution ended"},
		{map[string]any{"op": "released", "path": "s1/a", "holder": "exec-1"}, "released s1/a"},
	} {
		b, _ := json.Marshal(c.payload)
		what, text := describe(client.Event{Type: "claim", Payload: b})
		if what != "claim" || text != c.want {
			t.Errorf("describe(%s) = %q %q, want claim %q", b, what, text, c.want)
		}
	}
}
