package appliance

import (
	"context"
	"strings"
	"testing"

	"hearth/agents/modeltest"
)

// TestAgentsRewindBranch runs the real claude CLI through three calls,
// branches the session and rewinds it at call 1 (its files and the
// CLI's transcript as call 1 left them), undoes and redoes the rewind,
// refuses a rewind while the session runs, and resumes both the session
// and its branch: each sees only its own later writes and its own
// conversation, and the branch's CLI finds its transcript at its new
// working directory.
func TestAgentsRewindBranch(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("echo one > outputs/a.txt", modeltest.Usage{InputTokens: 100}),
		bashTurn("echo two > outputs/b.txt", modeltest.Usage{InputTokens: 100}),
		textTurn("first-done"),
		bashTurn("echo orig > outputs/c.txt && sleep 2", modeltest.Usage{InputTokens: 100}),
		textTurn("orig-done"),
		bashTurn("echo branch > outputs/d.txt", modeltest.Usage{InputTokens: 100}),
		textTurn("branch-done"),
	}}, nil)
	ctx := context.Background()
	c := env.c
	// Not waited for in the request: under -race on a loaded host the run
	// can take longer than the client waits for headers.
	started, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "write two files"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.Execution(ctx, waitEnded(t, env, started.Id).ID)
	if err != nil || e.Status != "completed" {
		t.Fatalf("the first execution = %+v, %v", e, err)
	}
	sess := e.Session
	has := func(session, p string) bool {
		_, err := env.d.store.ReadFile(session, "", p, 1<<20)
		return err == nil
	}

	br, err := c.BranchSession(ctx, sess, SessionBranchRequest{Call: 1, Id: "branch-one"})
	if err != nil || br.Session.Id != "branch-one" || br.Session.BranchedFrom != sess || br.From.Snapshot != e.Id+".call-2" || br.From.SessionCall != 1 {
		t.Fatalf("BranchSession = %+v, %v", br, err)
	}
	if !has("branch-one", "outputs/a.txt") || has("branch-one", "outputs/b.txt") || !has(sess, "outputs/b.txt") {
		t.Fatal("the branch is not the session after call 1, or the session changed")
	}
	_, err = c.BranchSession(ctx, sess, SessionBranchRequest{Call: 9})
	wantCode(t, err, "not_found", 404)

	rw, err := c.Rewind(ctx, sess, 1, "")
	if err != nil || rw.To.Execution != e.Id || rw.To.Call != 1 || !strings.HasPrefix(rw.Undo, "rewind-") {
		t.Fatalf("Rewind = %+v, %v", rw, err)
	}
	if !has(sess, "outputs/a.txt") || has(sess, "outputs/b.txt") {
		t.Fatal("after the rewind to call 1, outputs/b.txt (call 2's) is still there or a.txt is gone")
	}
	if _, err := c.UndoRewind(ctx, sess); err != nil || !has(sess, "outputs/b.txt") {
		t.Fatalf("UndoRewind = %v; b.txt back: %v", err, has(sess, "outputs/b.txt"))
	}
	if rw, err = c.Rewind(ctx, sess, 1, e.Id); err != nil || has(sess, "outputs/b.txt") {
		t.Fatalf("Rewind --execution = %+v, %v", rw, err)
	}
	if n := countEvents(allEvents(t, c, e.Id), "rewind", `"op":"rewound"`); n != 2 {
		t.Errorf("%d rewound events in the stream, want 2", n)
	}

	orig, err := c.Resume(ctx, sess, ResumeRequest{Prompt: "prompt-orig"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, c, orig.Id, "file")
	_, err = c.Rewind(ctx, sess, 1, "")
	wantCode(t, err, "conflict", 409)
	if got := waitEnded(t, env, orig.Id); got.Status != "completed" {
		t.Fatalf("resumed session: %+v", got)
	}
	origBody := string(env.model.MessageRequests()[len(env.model.MessageRequests())-1].Body)

	bstarted, err := c.Resume(ctx, "branch-one", ResumeRequest{Prompt: "prompt-branch"})
	if err != nil {
		t.Fatal(err)
	}
	bres, err := c.Execution(ctx, waitEnded(t, env, bstarted.Id).ID)
	if err != nil || bres.Status != "completed" || bres.Result != "branch-done" {
		t.Fatalf("Resume(branch) = %+v, %v", bres, err)
	}
	branchBody := string(env.model.MessageRequests()[len(env.model.MessageRequests())-1].Body)

	for _, c := range []struct {
		name, body string
		want, not  []string
	}{
		{"session", origBody, []string{"write two files", "echo one", "prompt-orig"}, []string{"first-done", "prompt-branch"}},
		{"branch", branchBody, []string{"write two files", "echo one", "prompt-branch"}, []string{"first-done", "prompt-orig", "echo orig"}},
	} {
		for _, w := range c.want {
			if !strings.Contains(c.body, w) {
				t.Errorf("the %s's last model request lacks %q: %.2000s", c.name, w, c.body)
			}
		}
		for _, w := range c.not {
			if strings.Contains(c.body, w) {
				t.Errorf("the %s's last model request has %q, from another line of the conversation", c.name, w)
			}
		}
	}
	if !has(sess, "outputs/c.txt") || has(sess, "outputs/d.txt") || has("branch-one", "outputs/c.txt") || !has("branch-one", "outputs/d.txt") {
		t.Error("the session and its branch see each other's writes")
	}
	list, err := c.SessionBranches(ctx, sess)
	if err != nil || len(list) != 1 || list[0].Id != "branch-one" {
		t.Errorf("SessionBranches = %+v, %v", list, err)
	}
}
