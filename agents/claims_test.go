package agents

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
	"hearth/fs"
)

// wsRunner is a runner with the real store and the real FUSE workspace
// and no machines: enough for WaitForFiles, which only watches files.
type wsRunner struct {
	runner *Runner
	store  *store.Store
	fs     *fs.Store
	host   string // the host view: host/SESSION/... as an agent's writes land
}

func newWSRunner(t *testing.T) *wsRunner {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the FUSE workspace needs root")
	}
	dir := t.TempDir()
	ws, err := fs.Open(fs.Options{Dir: filepath.Join(dir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	host, err := ws.Mount(filepath.Join(dir, "views", "host"), fs.ViewOptions{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Unmount() })
	st, err := store.Open(filepath.Join(dir, "hearth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := NewRunner(RunnerConfig{Store: st, Workspace: fsWorkspace{s: ws, views: filepath.Join(dir, "views")}})
	return &wsRunner{runner: r, store: st, fs: ws, host: host.Dir()}
}

// session makes a session in the store and the workspace.
func (w *wsRunner) session(t *testing.T) string {
	t.Helper()
	sess, err := w.store.CreateSession(context.Background(), store.Session{Agent: "analyst"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.runner.cfg.Workspace.EnsureSession(sess.ID, 1000, 1000, Quota{}); err != nil {
		t.Fatal(err)
	}
	return sess.ID
}

// write writes a file of session through the host view, as a process on
// the FUSE mount does.
func (w *wsRunner) write(t *testing.T, session, p, data string) {
	t.Helper()
	full := filepath.Join(w.host, session, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Error(err)
		return
	}
	if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
		t.Error(err)
	}
}

type waitResult struct {
	paths []string
	err   error
}

func (w *wsRunner) wait(ctx context.Context, session, pattern string, changes bool, timeout time.Duration) chan waitResult {
	c := make(chan waitResult, 1)
	go func() {
		p, err := w.runner.WaitForFiles(ctx, session, pattern, changes, timeout)
		c <- waitResult{p, err}
	}()
	return c
}

// within takes the wait's answer, failing if none comes in 30s.
func within(t *testing.T, c chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("WaitForFiles did not return in 30s")
		return waitResult{}
	}
}

// notYet checks that the wait has not returned after a moment in which
// the writes before it have reached the bus (the workspace publishes
// synchronously with the write).
func notYet(t *testing.T, c chan waitResult, why string) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("WaitForFiles returned %q, %v %s", r.paths, r.err, why)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestWaitForFilesExists: a file that already matches is returned at
// once; otherwise the wait ends when a writer in another goroutine makes
// one, and only files that match count.
func TestWaitForFilesExists(t *testing.T) {
	w := newWSRunner(t)
	ctx := context.Background()
	sess := w.session(t)
	w.write(t, sess, "outputs/old.md", "old")
	r := within(t, w.wait(ctx, sess, "outputs/*.md", false, time.Minute))
	if r.err != nil || strings.Join(r.paths, ",") != "outputs/old.md" {
		t.Fatalf("wait on an existing file = %q, %v", r.paths, r.err)
	}
	c := w.wait(ctx, sess, "parts/*.md", false, time.Minute)
	notYet(t, c, "before any part was written")
	w.write(t, sess, "parts/p1.txt", "not markdown")
	w.write(t, sess, "other/p1.md", "elsewhere")
	notYet(t, c, "for files that do not match")
	go w.write(t, sess, "parts/p1.md", "part one")
	r = within(t, c)
	if r.err != nil || strings.Join(r.paths, ",") != "parts/p1.md" {
		t.Fatalf("wait = %q, %v; want parts/p1.md", r.paths, r.err)
	}
	// A session the store has and the workspace not yet (its first
	// execution is starting): the wait goes on until its files come.
	late, err := w.store.CreateSession(ctx, store.Session{Agent: "analyst"})
	if err != nil {
		t.Fatal(err)
	}
	c = w.wait(ctx, late.ID, "outputs/*.md", false, time.Minute)
	notYet(t, c, "before the session is in the workspace")
	if err := w.runner.cfg.Workspace.EnsureSession(late.ID, 1000, 1000, Quota{}); err != nil {
		t.Fatal(err)
	}
	w.write(t, late.ID, "outputs/first.md", "first")
	if r := within(t, c); r.err != nil || strings.Join(r.paths, ",") != "outputs/first.md" {
		t.Fatalf("wait on a session made after the call = %q, %v", r.paths, r.err)
	}
	// Another session's files do not count.
	other := w.session(t)
	c = w.wait(ctx, sess, "shared/*.md", false, time.Minute)
	w.write(t, other, "shared/x.md", "x")
	notYet(t, c, "for another session's file")
	w.write(t, sess, "shared/y.md", "y")
	if r := within(t, c); r.err != nil || strings.Join(r.paths, ",") != "shared/y.md" {
		t.Fatalf("wait = %q, %v; want shared/y.md", r.paths, r.err)
	}
}

// TestWaitForFilesChanges: with changes, files that already match do not
// end the wait; a write, a creation or a rename after the call does.
func TestWaitForFilesChanges(t *testing.T) {
	w := newWSRunner(t)
	ctx := context.Background()
	sess := w.session(t)
	w.write(t, sess, "outputs/a.md", "v1")
	c := w.wait(ctx, sess, "outputs/*.md", true, time.Minute)
	notYet(t, c, "with no change after the call")
	go w.write(t, sess, "outputs/a.md", "v2")
	r := within(t, c)
	if r.err != nil || strings.Join(r.paths, ",") != "outputs/a.md" {
		t.Fatalf("wait for a change = %q, %v; want outputs/a.md", r.paths, r.err)
	}
	// A rename into the pattern is a change: the way to publish a file
	// whole.
	w.write(t, sess, "tmp/b.part", "whole")
	c = w.wait(ctx, sess, "outputs/*.md", true, time.Minute)
	notYet(t, c, "before the rename")
	if err := os.Rename(filepath.Join(w.host, sess, "tmp/b.part"), filepath.Join(w.host, sess, "outputs/b.md")); err != nil {
		t.Fatal(err)
	}
	r = within(t, c)
	if r.err != nil || !slices.Contains(r.paths, "outputs/b.md") {
		t.Fatalf("wait for a rename = %q, %v; want outputs/b.md", r.paths, r.err)
	}
}

// TestWaitForFilesLimits: the timeout ends a wait with ErrTimeout saying
// what was waited for, the context ends it too, and bad patterns,
// timeouts and sessions are refused with errors that say what to give.
func TestWaitForFilesLimits(t *testing.T) {
	w := newWSRunner(t)
	ctx := context.Background()
	sess := w.session(t)
	r := within(t, w.wait(ctx, sess, "outputs/*.md", false, time.Second))
	if !errors.Is(r.err, ErrTimeout) || !strings.Contains(r.err.Error(), "outputs/*.md") || !strings.Contains(r.err.Error(), sess) {
		t.Fatalf("wait past its timeout = %q, %v; want ErrTimeout naming the pattern and session", r.paths, r.err)
	}
	r = within(t, w.wait(ctx, sess, "outputs/*.md", true, time.Second))
	if !errors.Is(r.err, ErrTimeout) || !strings.Contains(r.err.Error(), "created, written or renamed") {
		t.Fatalf("wait for a change past its timeout = %v", r.err)
	}
	cctx, cancel := context.WithCancel(ctx)
	c := w.wait(cctx, sess, "outputs/*.md", false, time.Minute)
	notYet(t, c, "before the context ended")
	cancel()
	if r := within(t, c); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("wait with its context cancelled = %v", r.err)
	}
	for _, bad := range []struct {
		pattern string
		timeout time.Duration
	}{
		{"", 0}, {"/etc/*", 0}, {"../*", 0}, {"outputs/../../x", 0}, {"outputs/[", 0}, {"a//b", 0}, {"./a", 0},
		{"a\x00b", 0}, {strings.Repeat("a", 2000), 0}, {".", 0},
		{"outputs/*.md", -time.Second}, {"outputs/*.md", 2 * time.Hour},
	} {
		if _, err := w.runner.WaitForFiles(ctx, sess, bad.pattern, false, bad.timeout); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("WaitForFiles(%q, %v) = %v, want ErrInvalid", bad.pattern, bad.timeout, err)
		}
	}
	if _, err := w.runner.WaitForFiles(ctx, "session-000000", "outputs/*.md", false, time.Second); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("WaitForFiles on no session = %v, want ErrNotFound", err)
	}
}

// agentPair is two agents of one harness, each in its own jail, busy in
// a long Bash command (so their executions run) until cancelled.
type agentPair struct {
	h    *harness
	a, b store.Execution
	ran  map[string]chan error
}

func startPair(t *testing.T) *agentPair {
	t.Helper()
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{bash(busy(300))}, Usage: modeltest.Usage{InputTokens: 10}},
		{Blocks: []modeltest.Block{bash(busy(300))}, Usage: modeltest.Usage{InputTokens: 10}},
	}, Limits{USD: 500, Turns: 10}) // not what is checked: room for the hard cap's first-call bound (about $117: harnessOptions.price)
	p := &agentPair{h: h, ran: map[string]chan error{}}
	var execs []store.Execution
	for range 2 {
		accepted := make(chan store.Execution, 1)
		ran := make(chan error, 1)
		go func() {
			_, err := h.runner.Run(WithAccepted(context.Background(), func(e store.Execution) { accepted <- e }),
				TaskRequest{Agent: "analyst", Prompt: "take a part of the work"})
			ran <- err
		}()
		select {
		case e := <-accepted:
			execs = append(execs, e)
			p.ran[e.ID] = ran
		case err := <-ran:
			t.Fatalf("Run before it was accepted: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("no execution accepted in 60s")
		}
	}
	p.a, p.b = execs[0], execs[1]
	t.Cleanup(func() {
		for id := range p.ran {
			h.runner.Cancel(id)
		}
		for id, ran := range p.ran {
			select {
			case <-ran:
			case <-time.After(60 * time.Second):
				t.Errorf("execution %s did not end in 60s after Cancel", id)
			}
		}
	})
	// Both agents are at work in their machines.
	deadline := time.Now().Add(120 * time.Second)
	for _, e := range execs {
		for countType(h.eventsOf(t, e.ID), stream.ToolCall, "sleep 300") == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("no tool call from %s in 120s:\n%s", e.ID, dump(h.eventsOf(t, e.ID)))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return p
}

// end cancels an execution and waits for its Run to return.
func (p *agentPair) end(t *testing.T, id string) {
	t.Helper()
	if err := p.h.runner.Cancel(id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.ran[id]:
		delete(p.ran, id)
	case <-time.After(60 * time.Second):
		t.Fatalf("execution %s did not end in 60s after Cancel", id)
	}
}

// claimEvents returns the claim events of an execution's stream.
func claimEvents(t *testing.T, h *harness, exec string) []claimPayload {
	t.Helper()
	if err := h.store.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var out []claimPayload
	for _, ev := range h.eventsOf(t, exec) {
		if ev.Type != stream.Claim {
			continue
		}
		var p claimPayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			t.Fatalf("claim event %s: %v", ev.Payload, err)
		}
		out = append(out, p)
	}
	return out
}

func hasClaimEvent(evs []claimPayload, op store.ClaimOp, path, holder string) bool {
	return slices.ContainsFunc(evs, func(p claimPayload) bool { return p.Op == op && p.Path == path && p.Holder == holder })
}

// TestClaimsBetweenAgents: two real agents at work; their executions race
// for one lease (exactly one wins), the winner renews it, an expired
// lease is taken over, each step is an event in the streams concerned,
// and an execution's end lets go of its leases before its final status.
func TestClaimsBetweenAgents(t *testing.T) {
	p := startPair(t)
	r, ctx := p.h.runner, context.Background()
	path := p.a.Session + "/outputs/report.md"

	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		holder := []string{p.a.ID, p.b.ID}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = r.ClaimPath(ctx, holder, path, time.Minute)
		}()
	}
	close(start)
	wg.Wait()
	// The first success decides; the same holder's later ones renew.
	list, err := r.Claims(ctx, p.a.Session)
	if err != nil || len(list) != 1 {
		t.Fatalf("Claims = %+v, %v; want one lease", list, err)
	}
	winner := list[0].Holder
	loser := map[string]string{p.a.ID: p.b.ID, p.b.ID: p.a.ID}[winner]
	for i, err := range errs {
		holder := []string{p.a.ID, p.b.ID}[i%2]
		switch {
		case holder == winner && err != nil:
			t.Errorf("the winner's claim %d: %v", i, err)
		case holder == loser && !errors.Is(err, store.ErrClaimed):
			t.Errorf("the loser's claim %d: %v, want ErrClaimed", i, err)
		}
	}
	if evs := claimEvents(t, p.h, winner); !hasClaimEvent(evs, store.Claimed, path, winner) || !hasClaimEvent(evs, store.Renewed, path, winner) {
		t.Errorf("winner's claim events: %+v; want claimed and renewed", evs)
	}
	if evs := claimEvents(t, p.h, loser); len(evs) != 0 {
		t.Errorf("the loser's refused claims made events: %+v", evs)
	}

	// Renewal moves the expiry on.
	before := list[0]
	renewed, err := r.ClaimPath(ctx, winner, path, time.Hour)
	if err != nil || !renewed.Acquired.Equal(before.Acquired) || !renewed.Expires.After(before.Expires) {
		t.Fatalf("renewal = %+v, %v (was %+v)", renewed, err, before)
	}

	// An expired lease is taken over, and both holders are told.
	plan := "shared/plan.md"
	short, err := r.ClaimPath(ctx, winner, plan, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ClaimPath(ctx, loser, plan, time.Minute); !errors.Is(err, store.ErrClaimed) {
		t.Fatalf("claim before expiry = %v, want ErrClaimed", err)
	}
	time.Sleep(time.Until(short.Expires) + 20*time.Millisecond)
	took, err := r.ClaimPath(ctx, loser, plan, time.Minute)
	if err != nil || took.Holder != loser {
		t.Fatalf("takeover = %+v, %v", took, err)
	}
	for _, holder := range []string{winner, loser} {
		evs := claimEvents(t, p.h, holder)
		if !slices.ContainsFunc(evs, func(c claimPayload) bool {
			return c.Op == store.TakenOver && c.Path == plan && c.Holder == loser && c.Previous == winner
		}) {
			t.Errorf("%s's claim events: %+v; want the takeover of %s", holder, evs, plan)
		}
	}
	if err := r.ReleasePath(ctx, loser, plan); err != nil {
		t.Fatal(err)
	}
	if !hasClaimEvent(claimEvents(t, p.h, loser), store.Released, plan, loser) {
		t.Errorf("no released event for %s", plan)
	}

	// The winner's end lets go of its leases, before its final status.
	if _, err := r.ClaimPath(ctx, winner, "shared/notes.md", 0); err != nil {
		t.Fatal(err)
	}
	p.end(t, winner)
	if list, err := r.Claims(ctx, ""); err != nil || slices.ContainsFunc(list, func(c store.Claim) bool { return c.Holder == winner }) {
		t.Fatalf("Claims after %s ended = %+v, %v", winner, list, err)
	}
	evs := p.h.eventsOf(t, winner)
	released, final := -1, -1
	for i, ev := range evs {
		if ev.Type == stream.Claim && strings.Contains(string(ev.Payload), `"op":"released"`) && strings.Contains(string(ev.Payload), `"by":"end"`) {
			released = i
		}
		if ev.Type == stream.Status && strings.Contains(string(ev.Payload), `"status":"cancelled"`) {
			final = i
		}
	}
	if released < 0 || final < 0 || released > final {
		t.Errorf("the end's release (event %d) is not before the final status (event %d):\n%s", released, final, dump(evs))
	}
	for _, pth := range []string{path, "shared/notes.md"} {
		if !hasClaimEvent(claimEvents(t, p.h, winner), store.Released, pth, winner) {
			t.Errorf("no released event for %s at the end", pth)
		}
	}
	// The path is free for the other agent now; the ended one holds nothing.
	if c, err := r.ClaimPath(ctx, loser, path, 0); err != nil || c.Holder != loser {
		t.Fatalf("claim after the holder ended = %+v, %v", c, err)
	}
	if _, err := r.ClaimPath(ctx, winner, "shared/late.md", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("claim by an ended execution = %v, want ErrNotFound", err)
	}
	// An operator may release any lease: an event in the holder's stream.
	if c, err := r.ForceRelease(ctx, path); err != nil || c.Holder != loser {
		t.Fatalf("ForceRelease = %+v, %v", c, err)
	}
	if !slices.ContainsFunc(claimEvents(t, p.h, loser), func(c claimPayload) bool {
		return c.Op == store.Released && c.Path == path && c.By == "operator"
	}) {
		t.Errorf("no operator release event in %s's stream", loser)
	}
}

// TestHostileClaimsBetweenAgents: an agent (its execution) cannot
// release or renew another's lease, cannot act as an execution that is
// not running, and cannot reach outside the tree or alias a path.
func TestHostileClaimsBetweenAgents(t *testing.T) {
	p := startPair(t)
	r, ctx := p.h.runner, context.Background()
	victim, attacker := p.a.ID, p.b.ID
	path := p.a.Session + "/outputs/mine.md"
	held, err := r.ClaimPath(ctx, victim, path, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ReleasePath(ctx, attacker, path); !errors.Is(err, store.ErrNotHolder) {
		t.Errorf("release of another's lease = %v, want ErrNotHolder", err)
	}
	for _, alias := range []string{path + "/", "/workspace/agents/" + path, "./" + path, strings.Replace(path, "/", "//", 1)} {
		if _, err := r.ClaimPath(ctx, attacker, alias, time.Hour); !errors.Is(err, store.ErrClaimed) {
			t.Errorf("claim of %q, another's lease = %v, want ErrClaimed", alias, err)
		}
		if err := r.ReleasePath(ctx, attacker, alias); !errors.Is(err, store.ErrNotHolder) {
			t.Errorf("release of %q = %v, want ErrNotHolder", alias, err)
		}
	}
	for _, holder := range []string{"", "exec-00000000", "../" + victim, victim + "\x00"} {
		if _, err := r.ClaimPath(ctx, holder, "shared/x", 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("claim as %q = %v, want ErrNotFound", holder, err)
		}
		if err := r.ReleasePath(ctx, holder, path); !errors.Is(err, ErrNotFound) {
			t.Errorf("release as %q = %v, want ErrNotFound", holder, err)
		}
	}
	for _, bad := range []string{"../x", p.a.Session + "/../../etc/passwd", "/etc/passwd", "x\x00y", strings.Repeat("a/", 700), ""} {
		if _, err := r.ClaimPath(ctx, attacker, bad, 0); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("claim of %q = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := r.ClaimPath(ctx, attacker, "shared/x", 48*time.Hour); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("a 48h lease = %v, want ErrInvalid", err)
	}
	list, err := r.Claims(ctx, "")
	if err != nil || len(list) != 1 || list[0].Holder != victim || !list[0].Expires.Equal(held.Expires) {
		t.Fatalf("after the attacks: %+v, %v; want the victim's lease unchanged", list, err)
	}
	if evs := claimEvents(t, p.h, attacker); len(evs) != 0 {
		t.Errorf("the attacker's refused attempts made events: %+v", evs)
	}
}

// FuzzWaitPattern: a pattern WaitForFiles accepts is relative, in its
// simplest form, without "..", and every component is a pattern path.Match
// (and so the workspace's Glob) takes; anything else is ErrInvalid.
func FuzzWaitPattern(f *testing.F) {
	for _, p := range []string{"outputs/*.md", "outputs/", "*", "a/[bc]/*.txt", "../x", "/etc/*", "a//b", "./a", "a/.", "[", "a\\", "a\x00", "é/*"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, pattern string) {
		err := checkPattern(pattern)
		if err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("checkPattern(%q) = %v, not ErrInvalid", pattern, err)
			}
			return
		}
		p := strings.TrimSuffix(pattern, "/")
		if p == "" || strings.HasPrefix(p, "/") || path.Clean(p) != p || len(p) > maxPattern ||
			strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("checkPattern accepted %q", pattern)
		}
		for _, el := range strings.Split(p, "/") {
			if el == "" || el == "." || el == ".." {
				t.Fatalf("checkPattern accepted %q: element %q", pattern, el)
			}
			if _, err := path.Match(el, "x"); err != nil {
				t.Fatalf("checkPattern accepted %q: %v", pattern, err)
			}
		}
	})
}
