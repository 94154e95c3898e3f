package dashboard_test

// These tests open the dashboard in a real headless Chromium (Debian's
// chromium, driven over CDP with chromedp) against a real daemon served
// on loopback TCP, whose agents run for real: the claude CLI in jail
// machines of the claude-code image, through the daemon's metering
// gateway, against the scripted model (agents/modeltest) as the provider.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hearth/agents/modeltest"
	"hearth/appliance"
	"hearth/appliance/appliancetest"
	"hearth/client"
)

// browser starts a headless Chromium for the test with the flags the
// project's machines need (platform.md) and returns its first tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium not installed: apt-get install chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // the first run starts the browser; it must have no timeout
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// newWindow opens a second window of the browser of ctx.
func newWindow(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	w, cancel := chromedp.NewContext(ctx, chromedp.WithNewWindow(true))
	t.Cleanup(cancel)
	if err := chromedp.Do(w); err != nil {
		t.Fatalf("open a window: %v", err)
	}
	return w
}

// do runs actions in the tab of ctx, failing the test after timeout.
func do(t *testing.T, ctx context.Context, timeout time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the tab of ctx.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor waits until the JavaScript expression is truthy in the tab.
func waitFor(t *testing.T, ctx context.Context, timeout time.Duration, what, expr string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(c, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("waiting %v for %s (%s): %v\nthe page says:\n%s", timeout, what, expr, err, text)
	}
}

// js quotes s as a JavaScript string.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// screenshot saves a full-page PNG of the tab as name in the artifact
// directory ($HEARTH_ARTIFACTS, else the test's) and logs where.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("HEARTH_ARTIFACTS")
	if dir == "" {
		dir = t.ArtifactDir()
	}
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	// At the top: a full-page shot of a scrolled page draws the sticky header mid-page.
	if err := chromedp.Do(c, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`), chromedp.Sleep(100*time.Millisecond)); err != nil {
		t.Fatalf("scroll to the top: %v", err)
	}
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

type logWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// daemonConfig is a config on temporary directories serving TCP on a
// free loopback port.
func daemonConfig(t *testing.T) appliance.Config {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the daemon needs root (FUSE for the workspace; namespaces, mounts and cgroups for the agents' machines)")
	}
	dir := t.TempDir()
	cfg := appliance.DefaultConfig()
	cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	cfg.API.TCP = "127.0.0.1:0"
	cfg.Sandbox.Tier = appliance.TierJail
	return cfg
}

func startDaemon(t *testing.T, cfg appliance.Config) *appliance.Daemon {
	t.Helper()
	lw := &logWriter{t: t}
	d, err := appliance.Start(context.Background(), cfg, slog.New(slog.NewTextHandler(lw, nil)))
	if err != nil {
		t.Fatalf("start the daemon: %v", err)
	}
	t.Cleanup(func() {
		d.Close()
		lw.mu.Lock()
		lw.done = true
		lw.mu.Unlock()
	})
	if d.TCPAddr() == "" {
		t.Fatal("the daemon serves no TCP address")
	}
	return d
}

// analystTOML is the agent the tests delegate to; the built-in price
// table prices its model at $3 per million input tokens, $15 output.
const analystTOML = `description = "Analyses data files and writes a report."
image = "claude-code"
model = "claude-sonnet-4-5"
outputs = ["outputs/*.md"]

[limits]
usd = 5.0
turns = 20
wall_time = "10m"
`

// startAgentDaemon starts a daemon on TCP whose analyst agent runs the
// real claude CLI against script; it returns the daemon and a client on
// its unix socket.
func startAgentDaemon(t *testing.T, script modeltest.Config) (*appliance.Daemon, *client.Client) {
	t.Helper()
	cfg := daemonConfig(t)
	cfg.Sandbox.Agent = appliancetest.Agent(t)
	appliancetest.LinkImages(t, cfg.StateDir, appliancetest.ClaudeCodeImages(t))
	model := modeltest.New(script)
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	key := filepath.Join(t.TempDir(), "api-key")
	if err := os.WriteFile(key, []byte(model.Key()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Model = appliance.ModelConfig{Upstream: model.URL(), APIKeyFile: key}
	cfg.Agents.Grace = appliance.Duration(3 * time.Second)
	if err := os.MkdirAll(cfg.AgentsDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.AgentsDir(), "analyst.toml"), []byte(analystTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cfg)
	return d, client.New(cfg.SocketPath())
}

func bashTurn(command string, usage modeltest.Usage) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.ToolUse("Bash", map[string]string{"command": command, "description": "step"})}, Usage: usage}
}

func textTurn(text string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text(text)}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

// signIn opens the dashboard with the token, as a user would once.
func signIn(t *testing.T, ctx context.Context, d *appliance.Daemon) string {
	t.Helper()
	base := "http://" + d.TCPAddr()
	do(t, ctx, 20*time.Second, "open the dashboard with the token", chromedp.Navigate(base+"/ui/?token="+d.Token()))
	waitFor(t, ctx, 10*time.Second, "a session for the token", `localStorage.getItem('hearth_session')?.length >= 32`)
	if loc := eval[string](t, ctx, `location.href`); loc != base+"/ui/" {
		t.Fatalf("after ?token= the page is at %s, want %s/ui/ (the token out of the address)", loc, base)
	}
	return base
}

// seenObserver records, in the page, when each event row (any element
// with data-seq) is added under #events: window.__seen[seq] = the time
// in ms since the epoch. It is the test's, not the dashboard's, so the
// delay it measures includes all of the dashboard's own work.
const seenObserver = `(() => {
  window.__seen = {};
  window.__observing = Date.now();
  const note = (el) => { if (el.dataset && el.dataset.seq && !(el.dataset.seq in window.__seen)) window.__seen[el.dataset.seq] = Date.now(); };
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes) {
      if (n.nodeType !== 1) continue;
      note(n);
      n.querySelectorAll('[data-seq]').forEach(note);
    }
  }).observe(document.getElementById('events'), { childList: true, subtree: true });
  return window.__observing;
})()`

// TestDashboardLive drives the dashboard while agents run: the list
// follows an execution without a reload, the execution page shows each
// tool call within a second of its event, with its result, the file it
// wrote, the model calls and their cost, and opens the output; Cancel
// stops a running execution and Retry starts a new one; the schedules,
// credits and sandboxes pages show theirs.
func TestDashboardLive(t *testing.T) {
	ctx := browser(t)
	d, c := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		// A: slow to answer (so the page follows before the tool call), writes a report.
		{Blocks: bashTurn("mkdir -p outputs && printf '# Q2 report\\n\\ntotal 30\\n' > outputs/report.md && sleep 2 && echo wrote the report",
			modeltest.Usage{}).Blocks, Usage: modeltest.Usage{InputTokens: 1200, OutputTokens: 150}, Delay: 500 * time.Millisecond},
		textTurn("Wrote outputs/report.md: total 30"),
		// B: runs until it is cancelled.
		bashTurn("echo busy; sleep 120", modeltest.Usage{InputTokens: 100}),
		// B's retry.
		textTurn("retried and done"),
	}})
	l := &live{t: t, c: c, base: signIn(t, ctx, d), list: ctx}
	waitFor(t, l.list, 10*time.Second, "the empty executions list", `document.querySelector('.empty') && document.querySelectorAll('#executions tr').length === 0`)
	eval[bool](t, l.list, `(window.__loaded = true)`) // gone if the page reloads

	a, err := c.Delegate(context.Background(), client.DelegateRequest{Agent: "analyst", Prompt: "Write the Q2 report"})
	if err != nil {
		t.Fatalf("Delegate = %v", err)
	}
	l.page = newWindow(t, ctx)
	l.open(a.Id)
	observing := time.UnixMilli(int64(eval[float64](t, l.page, seenObserver)))
	waitFor(t, l.list, 30*time.Second, "the new execution running in the list", l.row(a.Id)+`?.dataset.status === 'running'`)
	l.toolCallDelay(a.Id, observing)
	l.completed(a.Id)
	l.executionPage(a.Id)
	screenshot(t, l.page, "execution.png")

	b, err := c.Delegate(context.Background(), client.DelegateRequest{Agent: "analyst", Prompt: "Sleep on it"})
	if err != nil {
		t.Fatal(err)
	}
	retry := l.cancelAndRetry(b.Id)
	waitFor(t, l.list, 5*time.Second, "the retry completed in the list", `document.querySelectorAll('#executions tr').length === 3 && `+
		l.row(retry)+`?.dataset.status === 'completed'`)
	screenshot(t, l.list, "executions.png")
	l.otherPages()
}

// live is TestDashboardLive's state: the executions list in one window,
// an execution's page in another.
type live struct {
	t          *testing.T
	c          *client.Client
	base       string
	list, page context.Context
}

// row is the list's row of execution id, as a JavaScript expression.
func (l *live) row(id string) string {
	return fmt.Sprintf(`document.querySelector('#executions tr[data-id=%s]')`, js(id))
}

// open shows execution id's page in the second window.
func (l *live) open(id string) {
	do(l.t, l.page, 20*time.Second, "open the page of "+id, chromedp.Navigate(l.base+"/ui/#/execution/"+id), chromedp.WaitReady(chromedp.CSS("#events")))
}

// toolCallDelay checks that the first tool call of id was shown within a
// second of its event, which must come after the page started to
// observe.
func (l *live) toolCallDelay(id string, observing time.Time) {
	t := l.t
	waitFor(t, l.page, 60*time.Second, "the tool call on the execution page", `document.querySelector('#events [data-type="tool_call"]')`)
	seen := eval[map[string]float64](t, l.page, `window.__seen`)
	page, err := l.c.Events(context.Background(), id, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(page.Events, func(ev client.Event) bool { return ev.Type == "tool_call" })
	if i < 0 {
		t.Fatalf("the page shows a tool call but the API has none: %+v", page.Events)
	}
	call := page.Events[i]
	shown, ok := seen[fmt.Sprint(call.Seq)]
	if !ok || !call.Time.After(observing) {
		t.Fatalf("tool call seq %d at %v, observing since %v, seen %v: the call must happen while the page follows the stream (slow the first turn down)",
			call.Seq, call.Time, observing, seen)
	}
	delay := time.UnixMilli(int64(shown)).Sub(call.Time)
	t.Logf("the tool call event of %s was shown %v after it was made", call.Time.Format(time.RFC3339Nano), delay)
	if delay > time.Second || delay < -50*time.Millisecond {
		t.Errorf("the tool call was shown %v after its event, want within a second", delay)
	}
}

// completed waits for execution id to complete on its page and in the
// list, which must not have reloaded, and checks the list's row.
func (l *live) completed(id string) {
	t := l.t
	waitFor(t, l.page, 120*time.Second, "the execution completed on its page", `document.querySelector('#summary [data-status]')?.dataset.status === 'completed'`)
	waitFor(t, l.list, 5*time.Second, "the execution completed in the list", l.row(id)+`?.dataset.status === 'completed'`)
	if !eval[bool](t, l.list, `window.__loaded === true`) {
		t.Error("the list page reloaded; it must update in place")
	}
	e, err := l.c.Execution(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	cells := eval[[]string](t, l.list, `[...`+l.row(id)+`.cells].map(c => c.innerText)`)
	want := []string{e.Id, "analyst", e.Session, "completed", "call 2/20", cents(e.Usd) + " of $5.00"}
	if len(cells) != 7 || strings.Join(cells[:6], "|") != strings.Join(want, "|") || !strings.HasSuffix(cells[6], "s") {
		t.Errorf("list row = %q, want %q and the elapsed time", cells, want)
	}
}

// executionPage checks what the page of the completed execution id
// shows: its events, its totals, and its output, opened and downloaded.
func (l *live) executionPage(id string) {
	t := l.t
	e, err := l.c.Execution(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	events := eval[string](t, l.page, `document.getElementById('events').innerText`)
	for _, want := range []string{"Bash", "printf '# Q2 report", "wrote the report", "created outputs/report.md", "claude-sonnet-4-5: 1,200 in / 150 out tokens",
		"Wrote outputs/report.md: total 30", "completed"} {
		if !strings.Contains(events, want) {
			t.Errorf("the event stream lacks %q:\n%s", want, events)
		}
	}
	tokens := eval[string](t, l.page, `document.querySelector('#summary .f-tokens').innerText`)
	if want := fmt.Sprintf("%s in / %s out", comma(e.Tokens.Input), comma(e.Tokens.Output)); tokens != want {
		t.Errorf("tokens shown %q, want %q", tokens, want)
	}
	if n := eval[int](t, l.page, `document.querySelectorAll('#events .event time').length`); n < 5 {
		t.Errorf("%d event rows have a timestamp, want every one", n)
	}
	report := `#outputs tr[data-path="outputs/report.md"]`
	waitFor(t, l.page, 10*time.Second, "the report in the output files", `document.querySelector('`+report+`')`)
	do(t, l.page, 10*time.Second, "open the report", chromedp.Click(chromedp.CSS(report+" button.open")))
	waitFor(t, l.page, 10*time.Second, "the report shown", `document.querySelector('#viewer pre')?.textContent === '# Q2 report\n\ntotal 30\n'`)
	if got := eval[string](t, l.page, `import('/ui/api.js').then((api) => api.authFetch(document.querySelector('`+report+` a.download').dataset.url)).then(r => r.text())`); got != "# Q2 report\n\ntotal 30\n" {
		t.Errorf("the download link gives %q", got)
	}
	// Clicking it fetches the file with the session and hands the browser
	// a blob of bytes (never of the file's own type).
	got := eval[string](t, l.page, `new Promise((done) => {
	  const made = URL.createObjectURL;
	  URL.createObjectURL = (b) => { URL.createObjectURL = made; b.text().then((text) => done(b.type + ' ' + text)); return made(b); };
	  document.querySelector('`+report+` a.download').click();
	  setTimeout(() => done('no blob: ' + (document.querySelector('#outputs .error')?.innerText || '')), 5000);
	})`)
	if got != "application/octet-stream # Q2 report\n\ntotal 30\n" {
		t.Errorf("clicking download made %q", got)
	}
	// The session's download button hands the browser the session as a
	// .tar.gz (from a snapshot), with the report in it.
	got = eval[string](t, l.page, `new Promise((done) => {
	  const made = URL.createObjectURL;
	  URL.createObjectURL = (b) => {
	    URL.createObjectURL = made;
	    new Response(b.stream().pipeThrough(new DecompressionStream('gzip'))).text().then((tar) =>
	      done(['outputs/report.md', 'total 30', '.home/'].map((s) => s + ':' + tar.includes(s)).join(' ')), (err) => done('not gzip: ' + err));
	    return made(b);
	  };
	  document.querySelector('#summary a.archive-targz').click();
	  setTimeout(() => done('no blob: ' + (document.querySelector('#summary .error')?.innerText || '')), 10000);
	})`)
	if got != "outputs/report.md:true total 30:true .home/:false" {
		t.Errorf("clicking the session's download .tar.gz made %q", got)
	}
	if n := eval[int](t, l.page, `document.querySelectorAll('#actions button').length`); n != 0 {
		t.Errorf("a completed execution offers %d buttons, want neither Cancel nor Retry", n)
	}
}

// cancelAndRetry cancels the running execution id with its page's
// Cancel button, retries it with Retry, and returns the retry's id once
// it completed.
func (l *live) cancelAndRetry(id string) string {
	t := l.t
	l.open(id)
	waitFor(t, l.page, 60*time.Second, "its sleep running", `document.querySelector('#events [data-type="tool_call"]') && document.querySelector('#cancel')`)
	// The totals follow the model calls while it runs.
	waitFor(t, l.page, 5*time.Second, "the running totals", `document.querySelector('#summary .f-calls')?.innerText === 'call 1/20' && `+
		`document.querySelector('#summary .f-tokens')?.innerText === '100 in / 0 out' && document.querySelector('#summary .f-cost')?.innerText === '$0.0003 of $5.00'`)
	screenshot(t, l.page, "running.png")
	// Top up: $1.50 more raises its limit to $6.50.
	eval[bool](t, l.page, `(document.querySelector('#topup-usd').value = '1.5', true)`)
	do(t, l.page, 10*time.Second, "click Top up", chromedp.Click(chromedp.CSS("#topup")))
	waitFor(t, l.page, 10*time.Second, "the raised limit", `document.querySelector('#summary .f-limits')?.innerText.startsWith('$6.50')`)
	if e, err := l.c.Execution(context.Background(), id); err != nil || e.Limits.Usd != 6.5 {
		t.Fatalf("after Top up the API says %+v, %v; want the limit at $6.50", e.Limits, err)
	}
	do(t, l.page, 10*time.Second, "click Cancel", chromedp.Click(chromedp.CSS("#cancel")))
	waitFor(t, l.page, 30*time.Second, "the execution cancelled", `document.querySelector('#summary [data-status]')?.dataset.status === 'cancelled'`)
	e, err := l.c.Execution(context.Background(), id)
	if err != nil || e.Status != "cancelled" {
		t.Fatalf("after Cancel the API says %s, %v; want cancelled", e.Status, err)
	}
	waitFor(t, l.page, 5*time.Second, "the cancelled status in the stream", `[...document.querySelectorAll('#events [data-type="status"]')].some(e => e.innerText.includes('cancelled'))`)

	waitFor(t, l.page, 5*time.Second, "the Retry button", `document.querySelector('#retry')`)
	// The stream follows new events down the page, which can leave the
	// button under the sticky top bar (and a click there on Sign out): a
	// user would scroll up to it first.
	eval[bool](t, l.page, `(document.querySelector('#retry').scrollIntoView({block: 'center'}), true)`)
	do(t, l.page, 10*time.Second, "click Retry", chromedp.Click(chromedp.CSS("#retry")))
	waitFor(t, l.page, 20*time.Second, "the retry's page", `location.hash.startsWith('#/execution/') && !location.hash.endsWith(`+js(id)+`)`)
	retry := strings.TrimPrefix(eval[string](t, l.page, `decodeURIComponent(location.hash)`), "#/execution/")
	r, err := l.c.Execution(context.Background(), retry)
	if err != nil || r.Kind != "retry" || r.Previous != id || r.Session != e.Session {
		t.Fatalf("the page went to %s: %+v, %v; want a retry of %s", retry, r, err, id)
	}
	waitFor(t, l.page, 120*time.Second, "the retry completed", `document.querySelector('#summary [data-status]')?.dataset.status === 'completed' && `+
		`document.getElementById('events').innerText.includes('retried and done')`)
	return retry
}

// otherPages checks the schedules page (a schedule's next run), the
// credits page (spend over time) and the sandboxes page (a sandbox's
// memory use).
func (l *live) otherPages() {
	t, bg := l.t, context.Background()
	if _, err := l.c.AddSchedule(bg, client.ScheduleRequest{Id: "q2-weekly", Spec: "0 9 * * 1", Agent: "analyst", Prompt: "Update the Q2 report"}); err != nil {
		t.Fatal(err)
	}
	do(t, l.list, 10*time.Second, "open the schedules", chromedp.Navigate(l.base+"/ui/#/schedules/q2-weekly"))
	waitFor(t, l.list, 10*time.Second, "the schedule's next run", `/in \d/.test(document.querySelector('#schedules tr[data-id="q2-weekly"]')?.innerText) && `+
		`document.getElementById('runs').innerText.includes('No runs yet')`)
	screenshot(t, l.list, "schedules.png")

	all, err := l.c.Executions(bg, client.ExecutionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	spent, total := 0, 0.0
	for _, e := range all {
		if e.Usd > 0 {
			spent, total = spent+1, total+e.Usd
		}
	}
	do(t, l.list, 10*time.Second, "open the credits", chromedp.Navigate(l.base+"/ui/#/credits"))
	waitFor(t, l.list, 10*time.Second, fmt.Sprintf("the spend chart: %d executions, $%.4f", spent, total),
		fmt.Sprintf(`document.querySelectorAll('#spend-chart circle').length === %d && `+
			`Math.abs(parseFloat(document.querySelector('#spend-chart svg').getAttribute('aria-label').split('$')[1]) - %f) < 0.00006`, spent, total))
	screenshot(t, l.list, "credits.png")

	sbx, err := l.c.CreateSandbox(bg, client.CreateSandboxRequest{Image: "claude-code", Memory: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.c.DestroySandbox(context.Background(), sbx.Id) })
	do(t, l.list, 10*time.Second, "open the sandboxes", chromedp.Navigate(l.base+"/ui/#/sandboxes"))
	waitFor(t, l.list, 10*time.Second, "the sandbox's memory use", `document.querySelector('#sandboxes tr[data-id=`+js(sbx.Id)+`]')?.innerText.includes('of 537 MB')`)
	screenshot(t, l.list, "sandboxes.png")
}

// cents writes dollars under one as the CLI and the page do: up to four
// decimals, at least two ("$0.0103", "$0.25").
func cents(v float64) string {
	s := strconv.FormatFloat(v, 'f', 4, 64)
	for strings.HasSuffix(s, "0") && len(s)-strings.IndexByte(s, '.') > 3 {
		s = s[:len(s)-1]
	}
	return "$" + s
}

// comma writes n with thousands separators, as the page does.
func comma(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestDashboardAuth: on TCP the dashboard's page holds no secret and
// loads for anyone, but without a session (no token, or a wrong one)
// its API calls get a 401 and it says how to sign in; ?token= signs the
// browser in (a session), after which the page and its API calls work
// and the root leads to the dashboard; a browser whose session is gone
// is told how to sign in again, and so is one that signed out.
func TestDashboardAuth(t *testing.T) {
	ctx := browser(t)
	d := startDaemon(t, daemonConfig(t))
	base := "http://" + d.TCPAddr()
	for _, tc := range []struct{ name, url string }{
		{"no token", base + "/ui/"},
		{"wrong token", base + "/ui/?token=" + strings.Repeat("0", 64)},
	} {
		do(t, ctx, 20*time.Second, tc.name+": open "+tc.url, chromedp.Navigate(tc.url))
		waitFor(t, ctx, 10*time.Second, tc.name+": the sign-in banner", `!document.getElementById('banner').hidden && document.getElementById('banner').innerText.includes('/ui/?token=')`)
		if loc := eval[string](t, ctx, `location.href`); loc != base+"/ui/" {
			t.Errorf("%s: the page is at %s, want %s/ui/ (no token in the address)", tc.name, loc, base)
		}
		if got := eval[string](t, ctx, `localStorage.getItem('hearth_session') || ''`); got != "" {
			t.Errorf("%s: the browser holds a session %q", tc.name, got)
		}
	}
	resp, err := http.Get(base + "/v1/executions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("the API without a session: %d, want 401", resp.StatusCode)
	}

	signIn(t, ctx, d)
	waitFor(t, ctx, 10*time.Second, "the executions list from the API", `document.querySelector('.empty')?.innerText.includes('No executions yet') && document.getElementById('conn').innerText === 'connected'`)
	if !eval[bool](t, ctx, `document.getElementById('banner').hidden`) {
		t.Error("the sign-in banner shows though the browser is signed in")
	}
	do(t, ctx, 20*time.Second, "open the root", chromedp.Navigate(base+"/"))
	if loc := eval[string](t, ctx, `location.href`); loc != base+"/ui/" {
		t.Errorf("the root sent the browser to %s, want %s/ui/", loc, base)
	}

	// API clients keep the API's JSON 404 at the root.
	req, _ := http.NewRequest("GET", base+"/", nil)
	req.Header.Set("Authorization", "Bearer "+d.Token())
	req.Header.Set("Accept", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(body), `"code":"not_found"`) {
		t.Errorf("GET / as an API client = %d %s, want the API's JSON 404", resp.StatusCode, body)
	}

	// The session gone (a daemon restart), the page's next call gets a
	// 401 and the page says what to do.
	stale := strings.Repeat("x", 43)
	eval[string](t, ctx, `localStorage.setItem('hearth_session', `+js(stale)+`) || ''`)
	waitFor(t, ctx, 10*time.Second, "the sign-in banner", `!document.getElementById('banner').hidden && document.getElementById('banner').innerText.includes('/ui/?token=')`)
	if got := eval[string](t, ctx, `document.getElementById('conn').innerText`); got != "disconnected" {
		t.Errorf("connection indicator %q after a 401, want disconnected", got)
	}
	screenshot(t, ctx, "signed-out.png")

	// Sign out: the session ends on the daemon, not just in the page.
	signIn(t, ctx, d)
	session := eval[string](t, ctx, `localStorage.getItem('hearth_session')`)
	waitFor(t, ctx, 10*time.Second, "the sign-out button", `!document.getElementById('signout').hidden`)
	do(t, ctx, 10*time.Second, "sign out", chromedp.Click(chromedp.CSS("#signout")))
	waitFor(t, ctx, 10*time.Second, "signed out", `!localStorage.getItem('hearth_session') && !document.getElementById('banner').hidden`)
	req, _ = http.NewRequest("GET", base+"/v1/executions", nil)
	req.Header.Set("Authorization", "Bearer "+session)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("the session after signing out: %d, want 401", resp.StatusCode)
	}
}

// TestDashboardAPIReference: the dashboard's API page, linked from its
// navigation, lists every operation of the daemon's OpenAPI document
// (GET /openapi.json), fetched from the daemon itself, with no request
// to another origin and no violation of the page's security policy.
func TestDashboardAPIReference(t *testing.T) {
	ctx := browser(t)
	d := startDaemon(t, daemonConfig(t))
	base := signIn(t, ctx, d)

	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("GET /openapi.json: %v", err)
	}
	var ops int
	for _, item := range doc.Paths {
		for m := range item {
			if slices.Contains([]string{"get", "put", "post", "delete", "patch"}, m) {
				ops++
			}
		}
	}
	waitFor(t, ctx, 10*time.Second, "the executions page", `document.querySelector('a[data-nav="api"]') !== null`)
	eval[bool](t, ctx, `(() => { window.__csp = []; document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI)); return true; })()`)
	do(t, ctx, 10*time.Second, "follow the API link", chromedp.Click(chromedp.CSS(`a[data-nav="api"]`)))
	waitFor(t, ctx, 10*time.Second, fmt.Sprintf("%d operations listed", ops), fmt.Sprintf(`document.querySelectorAll('#reference details.op').length === %d`, ops))
	for _, want := range []string{"execSandbox", "delegateTask", "getOpenAPIDocument"} {
		if !eval[bool](t, ctx, `document.querySelector('#reference details.op[data-op=`+js(want)+`]') !== null`) {
			t.Errorf("the API page lacks %s", want)
		}
	}
	do(t, ctx, 10*time.Second, "open execSandbox", chromedp.Click(chromedp.CSS(`details.op[data-op="execSandbox"] summary`)))
	if text := eval[string](t, ctx, `document.querySelector('details.op[data-op="execSandbox"]').innerText`); !strings.Contains(text, "POST") ||
		!strings.Contains(text, "/v1/sandboxes/{id}/exec") || !strings.Contains(text, "ExecRequest") || !strings.Contains(text, "application/x-ndjson ExecFrame") {
		t.Errorf("execSandbox shows:\n%s", text)
	}
	if v := eval[[]string](t, ctx, `window.__csp`); len(v) > 0 {
		t.Errorf("security policy violations: %q", v)
	}
	if other := eval[[]string](t, ctx, `performance.getEntriesByType('resource').map((e) => e.name).filter((u) => !u.startsWith(`+js(base+"/")+`))`); len(other) > 0 {
		t.Errorf("the page fetched from elsewhere: %q", other)
	}
	screenshot(t, ctx, "api-reference.png")
}
