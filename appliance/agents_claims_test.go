package appliance

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hearth/agents/modeltest"
	"hearth/fs"
)

// TestAgentsClaims: the leases a running agent holds are listed by the
// API (all, under a prefix, by holder); an operator releases one by its
// path (a '/' inside written %2F), which the holder's stream records; bad
// paths and unknown leases get clear errors; the agent's end lets go of
// the rest. (A lease held by another is a 409: TestAPIErrorDomain.)
func TestAgentsClaims(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("mkdir -p outputs && echo started > outputs/started.md && sleep 120", modeltest.Usage{InputTokens: 100}),
	}}, nil)
	ctx := context.Background()
	c := env.c
	e, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "take part 1"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, c, e.Id, "file") // at work in its machine
	if list, err := c.Claims(ctx, "", ""); err != nil || len(list) != 0 {
		t.Fatalf("Claims before any = %+v, %v", list, err)
	}
	r := env.d.agents.runner
	part1, part2 := e.Session+"/outputs/part-1.md", "shared/plan.md"
	for _, p := range []string{part1, part2} {
		if _, err := r.ClaimPath(ctx, e.Id, p, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.Claims(ctx, "", "")
	if err != nil || len(list) != 2 || list[0].Path != part1 || list[0].Holder != e.Id || list[0].Session != e.Session ||
		list[1].Path != part2 || !list[0].Expires.After(list[0].Acquired) {
		t.Fatalf("Claims = %+v, %v", list, err)
	}
	if list, err := c.Claims(ctx, e.Session, ""); err != nil || len(list) != 1 || list[0].Path != part1 {
		t.Errorf("Claims under %s = %+v, %v", e.Session, list, err)
	}
	if list, err := c.Claims(ctx, "", "exec-00000000"); err != nil || len(list) != 0 {
		t.Errorf("Claims of another holder = %+v, %v", list, err)
	}
	_, err = c.Claims(ctx, "../etc", "")
	wantCode(t, err, "bad_request", 400)

	released, err := c.ReleaseClaim(ctx, part1)
	if err != nil || released.Path != part1 || released.Holder != e.Id {
		t.Fatalf("ReleaseClaim = %+v, %v", released, err)
	}
	_, err = c.ReleaseClaim(ctx, part1)
	wantCode(t, err, "not_found", 404)
	for _, bad := range []string{"../x", "/etc/passwd", "a\x00b"} {
		_, err = c.ReleaseClaim(ctx, bad)
		wantCode(t, err, "bad_request", 400)
	}
	// The raw route: the path's '/' written %2F, as the client does.
	resp, body := rawDelete(t, env.cfg, "/v1/claims/"+strings.ReplaceAll(part2, "/", "%2F"))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"path":"`+part2+`"`) {
		t.Fatalf("DELETE /v1/claims/%s = %d %s", part2, resp.StatusCode, body)
	}
	waitForEvent(t, c, e.Id, "claim")
	evs := allEvents(t, c, e.Id)
	for _, p := range []string{part1, part2} {
		if countEvents(evs, "claim", `"op":"released","path":"`+p+`"`) != 1 || countEvents(evs, "claim", `"op":"claimed","path":"`+p+`"`) != 1 {
			t.Errorf("claim events for %s:\n%s", p, eventDump(evs))
		}
	}
	if countEvents(evs, "claim", `"by":"operator"`) != 2 {
		t.Errorf("want two operator releases:\n%s", eventDump(evs))
	}

	// The holder's end lets go of what it still holds.
	if _, err := r.ClaimPath(ctx, e.Id, part1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, e.Id); err != nil {
		t.Fatal(err)
	}
	if list, err := c.Claims(ctx, "", ""); err != nil || len(list) != 0 {
		t.Fatalf("Claims after the holder ended = %+v, %v", list, err)
	}
	evs = allEvents(t, c, e.Id)
	if countEvents(evs, "claim", `"by":"end"`) != 1 {
		t.Errorf("no release at the end:\n%s", eventDump(evs))
	}
}

// rawDelete sends DELETE path to the daemon's socket, as any HTTP client
// would.
func rawDelete(t *testing.T, cfg Config, path string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, "http://hearth"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", cfg.SocketPath())
	}}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestAgentsClaimsDashboard: the execution page of a holder lists the
// leases it holds, as text (a path an agent chose cannot run in the
// page), with each claim event in its stream, and follows a release.
func TestAgentsClaimsDashboard(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium not installed: apt-get install chromium")
	}
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("mkdir -p outputs && echo started > outputs/started.md && sleep 120", modeltest.Usage{InputTokens: 100}),
	}}, func(cfg *Config) { cfg.API.TCP = "127.0.0.1:0" })
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "take part 1"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, env.c, e.Id, "file")
	hostile := e.Session + `/outputs/<img src=x onerror="window.__pwned=1">.md`
	if _, err := env.d.agents.runner.ClaimPath(ctx, e.Id, hostile, time.Hour); err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(c, actions...); err != nil {
			text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("%s: %v\nthe page says:\n%s", what, err, text)
		}
	}
	poll := func(what, expr string) {
		t.Helper()
		run(what, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	}
	base := "http://" + env.d.TCPAddr()
	run("sign in", chromedp.Navigate(base+"/ui/?token="+env.d.Token()))
	poll("a session", `localStorage.getItem('hearth_session')?.length >= 32`)
	run("open the execution", chromedp.Navigate(base+"/ui/#/execution/"+e.Id), chromedp.WaitReady(chromedp.CSS("#events")))
	poll("the lease listed", `document.querySelector('#claims li[data-path]')?.innerText.includes('onerror')`)
	shown, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]any](`({
	  path: document.querySelector('#claims li[data-path]').dataset.path,
	  hidden: document.querySelector('#claims').hidden,
	  imgs: document.querySelectorAll('#claims img, #events img').length,
	  pwned: window.__pwned === 1,
	})`))
	if err != nil || shown["path"] != hostile || shown["hidden"] != false || shown["imgs"] != float64(0) || shown["pwned"] != false {
		t.Fatalf("the claims section: %v, %v; want the path as text, no image, nothing run", shown, err)
	}
	poll("the claim event", `[...document.querySelectorAll('#events [data-type="claim"]')].some(r => r.innerText.includes('claimed') && r.innerText.includes('onerror'))`)

	if _, err := env.c.ReleaseClaim(ctx, hostile); err != nil {
		t.Fatal(err)
	}
	poll("the section hidden after the release", `document.querySelector('#claims').hidden === true`)
	poll("the release event", `[...document.querySelectorAll('#events [data-type="claim"]')].some(r => r.innerText.includes('by an operator'))`)
	if pwned, _ := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.__pwned === 1`)); pwned {
		t.Error("a claimed path ran as HTML in the page")
	}
}

// TestAgentWorkspaceGlobNoSession: the runner's Glob of a session the
// workspace has not made yet is no files (WaitForFiles waits for them),
// and a malformed pattern is still an error.
func TestAgentWorkspaceGlobNoSession(t *testing.T) {
	st, err := fs.Open(fs.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := agentWorkspace{store: st}
	if m, err := w.Glob("session-000000", "outputs/*.md"); err != nil || len(m) != 0 {
		t.Errorf("Glob of no session = %q, %v; want none", m, err)
	}
	if _, err := w.Glob("session-000000", "outputs/["); !errors.Is(err, fs.ErrBadName) {
		t.Errorf("Glob of a malformed pattern = %v, want ErrBadName", err)
	}
}
