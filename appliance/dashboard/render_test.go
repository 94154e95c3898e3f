package dashboard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hearth/appliance/dashboard"
)

// servePage serves the dashboard alone (its API calls get 404s) and
// opens it in the browser of ctx.
func servePage(t *testing.T, ctx context.Context) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(dashboard.Prefix, dashboard.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	do(t, ctx, 20*time.Second, "open the dashboard", chromedp.Navigate(srv.URL+dashboard.Prefix), chromedp.WaitReady(chromedp.CSS("#view")))
}

// TestFormats: the page writes money, durations and list cells as the
// hearth CLI does (cmd/hearth/agents.go).
func TestFormats(t *testing.T) {
	ctx := browser(t)
	servePage(t, ctx)
	got := eval[[]string](t, ctx, `import('./format.js').then(f => [
	  f.usd(0), f.usd(0.0045), f.usd(0.25), f.usd(0.1), f.usd(1.24), f.usd(1234.5),
	  f.duration(800), f.duration(42000), f.duration(222000), f.duration(3900000),
	  f.turnsOf({turns: 12, limits: {turns: 50}}), f.turnsOf({turns: 3, limits: {}}),
	  f.spendOf({usd: 1.24, limits: {usd: 10}}), f.spendOf({usd: 0.0045, limits: {}}),
	  f.ranFor({started: '2026-01-01T00:00:00Z', ended: '2026-01-01T00:03:42Z'}), f.ranFor({}),
	  f.bytes(512), f.bytes(786432), f.bytes(537e6), String(f.goDuration('1m2.5s')), String(f.goDuration('soon')),
	  String(f.terminal('agent_started')), String(f.terminal('cancelled')),
	])`)
	want := []string{"$0.00", "$0.0045", "$0.25", "$0.10", "$1.24", "$1,234.50",
		"0.8s", "42s", "3m 42s", "1h 05m",
		"call 12/50", "call 3", "$1.24 of $10.00", "$0.0045",
		"3m 42s", "not started",
		"512 B", "786 kB", "537 MB", "62500", "NaN",
		"false", "true"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("formats:\n got %q\nwant %q", got, want)
	}
}

// TestEventRows: each kind of event has its row: budget warnings and
// errors stand out, a tool's result goes under its call, and what an
// agent writes is shown as text, never run as HTML.
func TestEventRows(t *testing.T) {
	ctx := browser(t)
	servePage(t, ctx)
	rows := eval[[]map[string]string](t, ctx, `import('./views/events.js').then(m => {
	  const box = document.createElement('div');
	  document.body.append(box);
	  const ev = (seq, type, payload) => ({seq, type, payload, time: '2026-11-22T10:00:00.250Z', session: 's', execution: 'e'});
	  const add = (e) => { if (!(e.type === 'tool_result' && m.attachResult(box, e))) box.append(m.renderEvent(e)); };
	  add(ev(1, 'text', {text: '<img src=x onerror="window.__pwned=1">'}));
	  add(ev(2, 'tool_call', {id: 'toolu_1', name: 'Write', input: {file_path: '/w/outputs/a.md', content: 'hi'}}));
	  add(ev(3, 'tool_result', {id: 'toolu_1', output: 'written', is_error: false}));
	  add(ev(4, 'tool_result', {id: 'toolu_gone', output: 'no such file\nline 2', is_error: true}));
	  add(ev(5, 'budget', {limit: 'usd', used: 0.9, max: 1, level: 'warn'}));
	  add(ev(6, 'budget', {limit: 'turns', used: 20, max: 20, level: 'exceeded'}));
	  add(ev(7, 'model_call', {model: 'claude-haiku-4-5', input_tokens: 1200, output_tokens: 34, usd: 0.00137, latency_ms: 1500, status: 529, error: 'Overloaded'}));
	  add(ev(8, 'error', {message: 'the agent crashed'}));
	  add(ev(9, 'network', {method: 'GET', host: 'denied.test', port: 80, allowed: false, reason: 'not in the network list'}));
	  add(ev(10, 'status', {status: 'failed', error: 'exit status 1'}));
	  add(ev(11, 'mystery', {x: 1}));
	  add(ev(12, 'retry', {attempt: 1, max_retries: 10, status: 529, delay_ms: 609, error: 'overloaded'}));
	  add(ev(13, 'warning', {message: 'model "claude-opus-4-9" has no price of its own', model: 'claude-opus-4-9'}));
	  add(ev(14, 'system', {subtype: 'compact_boundary', payload: {trigger: '<img src=x onerror="window.__pwned=1">'}}));
	  add(ev(15, 'status', {status: 'agent_finished', outcome: 'completed', num_turns: 4}));
	  add(ev(16, 'child', {execution: 'exec-0000000a', session: 's2', agent: '<b>x</b>', status: 'pending', usd: 0}));
	  add(ev(17, 'child', {execution: 'exec-0000000a', session: 's2', agent: 'writer', status: 'budget_exceeded', usd: 0.15, error: '<img src=x onerror="window.__pwned=1">'}));
	  add(ev(18, 'claim', {op: 'taken_over', path: 's1/<img src=x onerror="window.__pwned=1">.md', holder: 'exec-2', previous: 'exec-1', expires: '2026-11-22T10:10:00Z'}));
	  add(ev(19, 'claim', {op: 'released', path: 's1/outputs/a.md', holder: 'exec-2', by: 'end'}));
	  add(ev(20, 'rewind', {op: 'rewound', execution: 'exec-1', call: 2, session_call: 5, snapshot: 'exec-1.call-3', undo: 'rewind-<img src=x onerror="window.__pwned=1">'}));
	  add(ev(21, 'rewind', {op: 'branched', execution: 'exec-1', call: 2, session_call: 5, snapshot: 'exec-1.call-3', branch: 'session-b'}));
	  return [...box.children].map(r => ({seq: r.dataset.seq, cls: r.className, text: r.innerText.replace(/\s+/g, ' ').trim(), imgs: String(r.querySelectorAll('img').length)}));
	})`)
	want := []struct{ seq, cls, text string }{
		{"1", "event t-text", `TEXT <img src=x onerror="window.__pwned=1">`},
		{"2", "event t-tool_call", "TOOL Write /w/outputs/a.md input"},
		{"4", "event t-tool_result bad", "RESULT error: no such file (+1 lines)"},
		{"5", "event t-budget warn", "BUDGET usd at $0.90 of $1.00: the agent is told to wrap up"},
		{"6", "event t-budget bad", "BUDGET model calls limit reached (20 of 20): model calls refused, the agent is stopped"},
		{"7", "event t-model_call bad", "MODEL claude-haiku-4-5: 1,200 in / 34 out tokens, $0.0014, 1.5s (HTTP 529: Overloaded)"},
		{"8", "event t-error bad", "ERROR the agent crashed"},
		{"9", "event t-network warn", "NETWORK GET denied.test:80: refused (not in the network list)"},
		{"10", "event t-status bad", "STATUS failed: exit status 1"},
		{"11", "event t-mystery", `MYSTERY {"x":1}`},
		{"12", "event t-retry warn", "RETRY the CLI retries a model call (HTTP 529 overloaded): attempt 1 of 10 in 609ms"},
		{"13", "event t-warning warn", `WARNING model "claude-opus-4-9" has no price of its own`},
		{"14", "event t-system", `SYSTEM compact_boundary {"trigger":"<img src=x onerror=\"window.__pwned=1\">"}`},
		{"15", "event t-status", "STATUS the agent finished: completed (CLI turns: 4)"},
		{"16", "event t-child", "CHILD exec-0000000a (<b>x</b>) started"},
		{"17", "event t-child warn", `CHILD exec-0000000a (writer) budget exceeded, $0.15: <img src=x onerror="window.__pwned=1">`},
		{"18", "event t-claim warn", `CLAIM taken over s1/<img src=x onerror="window.__pwned=1">.md until `},
		{"19", "event t-claim", "CLAIM released s1/outputs/a.md as the execution ended"},
		{"20", "event t-rewind warn", `REWIND session rewound after call 5 (exec-1 call 2); the state before is snapshot rewind-<img src=x onerror="window.__pwned=1">`},
		{"21", "event t-rewind warn", "REWIND session branched after call 5 (exec-1 call 2) as session-b"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d (the result of a shown call goes under it): %v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r["seq"] != w.seq || r["cls"] != w.cls || !strings.Contains(r["text"], w.text) || r["imgs"] != "0" {
			t.Errorf("row %d = %v, want seq %s, class %q, text containing %q, no image", i, r, w.seq, w.cls, w.text)
		}
	}
	if !strings.Contains(rows[1]["text"], "result: written") {
		t.Errorf("the Write call's row %q lacks its result", rows[1]["text"])
	}
	if eval[bool](t, ctx, `window.__pwned === 1`) {
		t.Error("an agent's text ran as HTML in the page")
	}
}
