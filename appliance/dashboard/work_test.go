package dashboard_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hearth/agents/modeltest"
	"hearth/client"
)

// pngBase64 is a 1x1 PNG, for the image an agent writes.
const pngBase64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

// TestDashboardWork works from the dashboard as a person would: starts a
// task with an input uploaded from the browser and a budget and follows
// it to the end, resumes its session, reads the agents page, and in the
// workspace previews a text file and an image and downloads the session.
func TestDashboardWork(t *testing.T) {
	ctx := browser(t)
	d, c := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("mkdir -p outputs && cp inputs/sales.csv outputs/sales.txt && echo "+pngBase64+" | base64 -d > outputs/chart.png && echo copied",
			modeltest.Usage{InputTokens: 1000, OutputTokens: 100}),
		textTurn("Copied the sales and drew the chart."),
		textTurn("Resumed: nothing more to do."),
	}})
	base := signIn(t, ctx, d)
	input := filepath.Join(t.TempDir(), "sales.csv")
	if err := os.WriteFile(input, []byte("region,total\nnorth,30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := startTask(t, ctx, base, input)
	e := completedWith(t, c, id, 0.5)
	got, ct := readFile(t, c, e.Session, "outputs/sales.txt")
	if got != "region,total\nnorth,30\n" || !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("the uploaded input copied by the agent = %q (%s), want the file as uploaded", got, ct)
	}
	resumed := resumeSession(t, ctx, e.Session)
	if r := completedWith(t, c, resumed, 0.25); r.Kind != "resume" || r.Session != e.Session {
		t.Errorf("the resume = %s in %s, want a resume in %s", r.Kind, r.Session, e.Session)
	}
	agentsPage(t, ctx, base)
	workspacePage(t, ctx, base, e.Session)
}

// startTask fills the start form: the analyst (whose $5.00 limit it
// shows), a prompt, the input and a budget; a budget above the agent's
// limit is refused by the API, 0.50 starts it. It returns the execution
// the page went to, once its stream shows the tool call and completion.
func startTask(t *testing.T, ctx context.Context, base, input string) string {
	do(t, ctx, 20*time.Second, "open the start form", chromedp.Navigate(base+"/ui/#/start/analyst"), chromedp.WaitVisible(chromedp.CSS("#start-form textarea")))
	waitFor(t, ctx, 10*time.Second, "the agent's limit in the form", `document.querySelector('#start-form .budget-hint').innerText.includes("$5.00") && `+
		`document.getElementById('agent-about').innerText.includes('claude-sonnet-4-5')`)
	do(t, ctx, 10*time.Second, "fill the form",
		chromedp.SetValue(chromedp.CSS("#start-form textarea"), "Copy the sales and chart them"),
		chromedp.SetValue(chromedp.CSS("#start-form input[name=budget]"), "9"),
		chromedp.SetUploadFiles(chromedp.CSS("#start-form input[type=file]"), []string{input}))
	do(t, ctx, 10*time.Second, "start with too big a budget", chromedp.Click(chromedp.CSS("#start-form button[type=submit]")))
	waitFor(t, ctx, 10*time.Second, "the API's refusal of a budget above the agent's", `document.querySelector('#start-form .form-status .error')`)
	do(t, ctx, 10*time.Second, "set a budget", chromedp.SetValue(chromedp.CSS("#start-form input[name=budget]"), "0.50"))
	screenshot(t, ctx, "dashboard-start.png")
	do(t, ctx, 10*time.Second, "start", chromedp.Click(chromedp.CSS("#start-form button[type=submit]")))
	waitFor(t, ctx, 20*time.Second, "the new execution's page", `location.hash.startsWith('#/execution/') && document.getElementById('events')`)
	waitFor(t, ctx, 120*time.Second, "the tool call, then completion, in the stream", `document.querySelector('#events [data-type="tool_call"]') && `+
		`document.querySelector('#summary [data-status]')?.dataset.status === 'completed'`)
	return eval[string](t, ctx, `decodeURIComponent(location.hash.slice('#/execution/'.length))`)
}

// completedWith checks execution id completed with a dollar limit of usd.
func completedWith(t *testing.T, c *client.Client, id string, usd float64) client.Execution {
	t.Helper()
	e, err := c.Execution(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != "completed" || e.Limits.Usd != usd {
		t.Errorf("execution %s: %s with limit $%v, want completed with $%v", id, e.Status, e.Limits.Usd, usd)
	}
	return e
}

func readFile(t *testing.T, c *client.Client, session, path string) (string, string) {
	t.Helper()
	body, ct, err := c.ReadWorkspaceFile(context.Background(), session, path)
	if err != nil {
		t.Fatalf("ReadWorkspaceFile(%s, %s) = %v", session, path, err)
	}
	defer body.Close()
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), ct
}

// resumeSession goes from the execution's page to its session and
// resumes it with a prompt and a budget; it returns the new execution.
func resumeSession(t *testing.T, ctx context.Context, session string) string {
	eval[bool](t, ctx, `(document.querySelector('#summary a.session-link').click(), true)`) // a JS click: the sticky header may cover it
	waitFor(t, ctx, 10*time.Second, "the session's execution and its resume form", `location.hash === '#/session/`+session+`' && `+
		`document.querySelectorAll('#session-executions tr[data-id]').length === 1 && document.querySelector('#resume-form .budget-hint')?.innerText.includes('$5.00')`)
	do(t, ctx, 10*time.Second, "fill the resume form",
		chromedp.SetValue(chromedp.CSS("#resume-form textarea"), "Anything else?"),
		chromedp.SetValue(chromedp.CSS("#resume-form input[name=budget]"), "0.25"))
	screenshot(t, ctx, "dashboard-session.png")
	do(t, ctx, 10*time.Second, "resume", chromedp.Click(chromedp.CSS("#resume-form button[type=submit]")))
	waitFor(t, ctx, 120*time.Second, "the resumed execution completed on its page", `location.hash.startsWith('#/execution/') && `+
		`document.querySelector('#summary [data-status]')?.dataset.status === 'completed' && document.getElementById('events').innerText.includes('Resumed')`)
	return eval[string](t, ctx, `decodeURIComponent(location.hash.slice('#/execution/'.length))`)
}

// agentsPage: the analyst's definition, its limits and what it spent.
func agentsPage(t *testing.T, ctx context.Context, base string) {
	do(t, ctx, 10*time.Second, "open the agents", chromedp.Navigate(base+"/ui/#/agents"))
	waitFor(t, ctx, 10*time.Second, "the analyst's definition, limits and spend", `(() => {
	  const r = document.querySelector('#agents tr[data-agent="analyst"]');
	  return r && r.querySelector('.c-runs').innerText.includes('claude-code') && r.querySelector('.c-runs').innerText.includes('claude-sonnet-4-5') &&
	    r.querySelector('.c-limits').innerText === '$5.00, 20 model calls, 10m0s wall time' && /\$0\.\d+ in 2 runs/.test(r.querySelector('.c-spent').innerText);
	})()`)
	screenshot(t, ctx, "dashboard-agents.png")
}

// workspacePage: the sessions with who writes them; the session's
// outputs previewed (text as text, the PNG as an image from a blob:);
// its snapshots; its .tar.gz downloaded, without the .home.
func workspacePage(t *testing.T, ctx context.Context, base, session string) {
	do(t, ctx, 10*time.Second, "open the workspace", chromedp.Navigate(base+"/ui/#/workspace"))
	waitFor(t, ctx, 10*time.Second, "the session, written by the analyst", `document.querySelector('#ws-sessions tr[data-session="`+session+`"] .c-writer')?.innerText.startsWith('analyst')`)
	screenshot(t, ctx, "dashboard-workspace.png")
	do(t, ctx, 10*time.Second, "open the session's outputs", chromedp.Navigate(base+"/ui/#/workspace/"+session+"/outputs"))
	waitFor(t, ctx, 10*time.Second, "the outputs listed", `document.querySelectorAll('#ws-files tr[data-path]').length === 2`)
	preview(t, ctx, "outputs/sales.txt", `document.querySelector('#ws-viewer pre[data-type="text"]')?.textContent === "region,total\nnorth,30\n"`)
	preview(t, ctx, "outputs/chart.png", `(() => { const i = document.querySelector('#ws-viewer img[data-type="image/png"]'); return i && i.src.startsWith('blob:') && i.complete && i.naturalWidth === 1; })()`)
	waitFor(t, ctx, 10*time.Second, "the snapshots listed", `document.querySelector('#ws-snapshots table, #ws-snapshots .empty')`)
	screenshot(t, ctx, "dashboard-workspace-session.png")
	got := eval[string](t, ctx, `new Promise((done) => {
	  const made = URL.createObjectURL;
	  URL.createObjectURL = (b) => {
	    URL.createObjectURL = made;
	    new Response(b.stream().pipeThrough(new DecompressionStream('gzip'))).text().then((tar) =>
	      done(['outputs/sales.txt', 'north,30', 'inputs/sales.csv', '.home/'].map((s) => s + ':' + tar.includes(s)).join(' ')), (err) => done('not gzip: ' + err));
	    return made(b);
	  };
	  document.querySelector('button.archive-targz').click();
	  setTimeout(() => done('no blob: ' + (document.querySelector('main .error')?.innerText || '')), 10000);
	})`)
	if got != "outputs/sales.txt:true north,30:true inputs/sales.csv:true .home/:false" {
		t.Errorf("downloading the session's .tar.gz made %q", got)
	}
}

// preview clicks path's preview in the workspace listing and waits for ready.
func preview(t *testing.T, ctx context.Context, path, ready string) {
	t.Helper()
	eval[bool](t, ctx, `(document.querySelector('#ws-files tr[data-path=`+js(path)+`] button.preview').click(), true)`)
	waitFor(t, ctx, 10*time.Second, "the preview of "+path, ready)
}
