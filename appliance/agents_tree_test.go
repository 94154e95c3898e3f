package appliance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hearth/agents"
	"hearth/agents/modeltest"
	"hearth/internal/money"
)

// TestAgentsDelegationTree: a running execution delegates through the
// agent service (as its MCP server does), with credits in use; the API
// shows the tree: the child's parent and depth, the parent's children
// and totals, the executions listed by parent; the credit ledger comes
// out exact; the dashboard's execution pages show the tree (real headless
// Chromium).
func TestAgentsDelegationTree(t *testing.T) {
	wait := "mkdir -p outputs && echo partial > outputs/partial.md && for i in $(seq 500); do [ -e outputs/go ] && break; sleep 0.2; done; echo released-P"
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		{Match: modeltest.LastUserContains("PARENT"), Blocks: bashTurn(wait, modeltest.Usage{}).Blocks, Usage: modeltest.Usage{InputTokens: 10000}},
		{Match: modeltest.LastUserContains("released-P"), Blocks: textTurn("parent done").Blocks, Usage: modeltest.Usage{InputTokens: 20000}},
		{Match: modeltest.LastUserContains("CHILD"), Blocks: textTurn("child done").Blocks, Usage: modeltest.Usage{InputTokens: 30000}},
	}}, func(c *Config) { c.Credits.Enabled = true; c.API.TCP = "127.0.0.1:0" })
	ctx := context.Background()
	c := env.c
	if err := env.d.agents.store.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	p, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "PARENT", Limits: Limits{Usd: 1}})
	if err != nil {
		t.Fatal(err)
	}
	partial := filepath.Join(env.cfg.Workspace.Mount, p.Session, "outputs", "partial.md")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(partial); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the parent did not start its tool call in a minute:\n%s", eventDump(allEvents(t, c, p.Id)))
		}
	}
	_, _, err = env.d.agents.Start(ctx, task{TaskRequest: agents.TaskRequest{Agent: "analyst", Prompt: "CHILD", Parent: p.Id,
		Limits: agents.Limits{USD: 2}}})
	if err == nil || !strings.Contains(err.Error(), "asked $2.00, the parent has $0.97 left") {
		t.Errorf("a child asking $2 of a $1 parent: %v, want refused with what is left", err)
	}
	kid, done, err := env.d.agents.Start(ctx, task{TaskRequest: agents.TaskRequest{Agent: "analyst", Prompt: "CHILD", Parent: p.Id,
		Limits: agents.Limits{USD: 0.5}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := env.d.agents.Wait(wctx, kid.ID, done); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(env.cfg.Workspace.Mount, p.Session, "outputs", "go"), []byte("go"), 0o644)
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if e, _ := c.Execution(ctx, p.Id); Ended(e) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the parent has not ended in 3 minutes:\n%s", eventDump(allEvents(t, c, p.Id)))
		}
	}
	// $3 per million input tokens: the parent $0.03 + $0.06, the child $0.09.
	pe, err := c.Execution(ctx, p.Id)
	if err != nil || pe.Status != "completed" || !slices.Equal(pe.Children, []string{kid.ID}) || pe.Depth != 0 || pe.Parent != "" ||
		money.Micros(pe.Usd) != money.Micros(0.09) || money.Micros(pe.TotalUsd) != money.Micros(0.18) || pe.TotalTokens.Input != 60000 {
		t.Errorf("parent = %+v, %v; want completed, child %s, $0.09 own, $0.18 and 60000 tokens with it", pe, err, kid.ID)
	}
	ke, err := c.Execution(ctx, kid.ID)
	if err != nil || ke.Parent != p.Id || ke.Depth != 1 || ke.Status != "completed" || money.Micros(ke.TotalUsd) != money.Micros(0.09) {
		t.Errorf("child = %+v, %v; want parent %s at depth 1, completed, $0.09", ke, err, p.Id)
	}
	list, err := c.Executions(ctx, ExecutionFilter{Parent: p.Id})
	if err != nil || len(list) != 1 || list[0].Id != kid.ID {
		t.Errorf("Executions(parent=%s) = %v, %v; want the child", p.Id, list, err)
	}
	if n := countEvents(allEvents(t, c, p.Id), "child", `"status":"completed"`); n != 1 {
		t.Errorf("%d child events with the child's end in the parent's stream, want 1", n)
	}
	avail, reserved, spent, err := env.d.agents.store.Balance(ctx)
	if err != nil || money.Micros(avail) != money.Micros(10-0.18) || reserved != 0 || money.Micros(spent) != money.Micros(0.18) {
		t.Errorf("balance %v available, %v reserved, %v spent; want 9.82, 0, 0.18", avail, reserved, spent)
	}
	t.Run("dashboard", func(t *testing.T) { dashboardTree(t, env, pe.Id, kid.ID) })
}

// dashboardTree opens the parent's and the child's execution pages in a
// headless Chromium: the parent lists its child with its status and
// cost, the child links to its parent.
func dashboardTree(t *testing.T, env *agentEnv, parent, child string) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium not installed: apt-get install chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	base := "http://" + env.d.TCPAddr() + "/ui/"
	poll := func(what, expr string) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := chromedp.Run(c, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("waiting for %s (%s): %v\nthe page says:\n%s", what, expr, err, text)
		}
	}
	c, cancelNav := context.WithTimeout(ctx, 30*time.Second)
	defer cancelNav()
	if err := chromedp.Do(c, chromedp.Navigate(base+"?token="+env.d.Token())); err != nil {
		t.Fatal(err)
	}
	poll("a session", `localStorage.getItem('hearth_session')?.length >= 32`)
	if err := chromedp.Do(c, chromedp.Navigate(base+"#/execution/"+parent)); err != nil {
		t.Fatal(err)
	}
	poll("the child in the parent's tree", `(() => { const r = document.querySelector('#tree tr[data-id="`+child+`"]');
	  return r && r.dataset.status === 'completed' && r.querySelector('.c-total').textContent === '$0.09'; })()`)
	poll("the parent's cost with its child", `document.querySelector('.f-with-children')?.textContent.startsWith('$0.18')`)
	poll("the child's end in the parent's stream", `[...document.querySelectorAll('#events .t-child')].some(r => r.textContent.includes('`+child+`') && r.textContent.includes('completed, $0.09'))`)
	if err := chromedp.Do(c, chromedp.Navigate(base+"#/execution/"+child)); err != nil {
		t.Fatal(err)
	}
	poll("the child's link to its parent", `document.querySelector('#parent-link')?.getAttribute('href') === '#/execution/`+parent+`'`)
}
