package appliance

import (
	"context"
	"errors"
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestHostileRewindBranch: a caller naming a branch or a call to hurt
// the workspace or another session gets a clear refusal and nothing is
// made: branch names that climb out, hide in .home or nest; call numbers
// negative or past any call; another session's execution; a session
// that does not exist.
func TestHostileRewindBranch(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("echo one > outputs/a.txt", modeltest.Usage{InputTokens: 100}),
		textTurn("done"),
		textTurn("other-done"),
	}}, nil)
	ctx := context.Background()
	c := env.c
	run := func(prompt string) Execution {
		started, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: prompt})
		if err != nil {
			t.Fatal(err)
		}
		e, err := c.Execution(ctx, waitEnded(t, env, started.Id).ID)
		if err != nil || e.Status != "completed" {
			t.Fatalf("execution = %+v, %v", e, err)
		}
		return e
	}
	e, other := run("write a file"), run("say done")
	before := len(env.d.store.Sessions())
	var apiErr *client.APIError
	for _, tc := range []struct {
		name string
		req  SessionBranchRequest
		want string
	}{
		{"climbs out", SessionBranchRequest{Call: 1, Id: "../victim"}, "use 1-63"},
		{"nested", SessionBranchRequest{Call: 1, Id: "a/b"}, "use 1-63"},
		{"hidden", SessionBranchRequest{Call: 1, Id: ".home"}, "use 1-63"},
		{"too long", SessionBranchRequest{Call: 1, Id: strings.Repeat("x", 4096)}, "use 1-63"},
		{"negative call", SessionBranchRequest{Call: -1}, "numbered from 1"},
		{"call past the end", SessionBranchRequest{Call: 1 << 40}, "no call"},
		{"another session's execution", SessionBranchRequest{Call: 1, Execution: other.Id}, "no execution"},
		{"an existing session's name", SessionBranchRequest{Call: 1, Id: other.Session}, "exists"},
	} {
		_, err := c.BranchSession(ctx, e.Session, tc.req)
		if !errors.As(err, &apiErr) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: BranchSession = %v; want a refusal containing %q", tc.name, err, tc.want)
		}
	}
	for _, call := range []int{-1, 1 << 40} {
		if _, err := c.Rewind(ctx, e.Session, call, ""); !errors.As(err, &apiErr) {
			t.Errorf("Rewind(call %d) = %v; want a refusal", call, err)
		}
	}
	if _, err := c.Rewind(ctx, "../"+e.Session, 1, ""); err == nil {
		t.Error("Rewind of a session named with ../ was accepted")
	}
	if _, err := c.BranchSession(ctx, "session-nope00", SessionBranchRequest{Call: 1}); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("BranchSession of no such session = %v; want 404", err)
	}
	if got := len(env.d.store.Sessions()); got != before {
		t.Errorf("refused branches made sessions: %d before, %d after", before, got)
	}
	if _, err := env.d.store.ReadFile(e.Session, "", "outputs/a.txt", 1<<10); err != nil {
		t.Errorf("the session's own file after the refusals: %v", err)
	}
}
