package appliance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"hearth/appliance/appliancetest"
	"hearth/client"
)

// previewEnv is a daemon on api.tcp with a sandbox of the base image
// running testdata/preview/server.py on port 8000.
type previewEnv struct {
	d  *Daemon
	c  *Client
	id string
}

const previewPort = 8000

func startPreviewEnv(t testing.TB) *previewEnv {
	t.Helper()
	cfg := agentConfig(t)
	appliancetest.LinkImages(t, cfg.StateDir, appliancetest.Images(t, "base"))
	cfg.Sandbox.DefaultImage = "base"
	cfg.API.TCP = "127.0.0.1:0"
	d, c := startSandboxDaemon(t, cfg)
	env := &previewEnv{d: d, c: c, id: "web"}
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: env.id, IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Exec(ctx, env.id, ExecRequest{Argv: []string{"mkdir", "-p", "/tmp/site"}}, io.Discard, io.Discard); err != nil || st.Code != 0 {
		t.Fatalf("mkdir: %+v, %v", st, err)
	}
	for _, name := range []string{"server.py", "index.html", "hostile.html"} {
		f, err := os.Open(filepath.Join("testdata", "preview", name))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Upload(ctx, env.id, "/tmp/site/"+name, f, 0o644)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	env.serve(t, previewPort)
	return env
}

// serve starts the dev server on port in the sandbox.
func (env *previewEnv) serve(t testing.TB, port int) {
	t.Helper()
	if _, err := env.c.StartJob(context.Background(), env.id, JobRequest{Argv: []string{"python3", "server.py", fmt.Sprint(port)}, Cwd: "/tmp/site"}); err != nil {
		t.Fatal(err)
	}
}

// expose exposes port and waits until its server answers through it.
func (env *previewEnv) expose(t testing.TB, port int, public bool) client.ExposedPort {
	t.Helper()
	p, err := env.c.ExposePort(context.Background(), env.id, client.ExposePortRequest{Port: port, Public: public})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := env.get(p.Url, env.d.Token())
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server on port %d never answered through %s: %v %v", port, p.Url, resp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// get fetches u, with bearer if not "".
func (env *previewEnv) get(u, bearer string) (*http.Response, error) {
	req, _ := http.NewRequest("GET", u, nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	return hc.Do(req)
}

func status(t testing.TB, hc *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func newReq(method, u string, hdr ...string) *http.Request {
	req, _ := http.NewRequest(method, u, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// chromium starts a headless Chromium, or skips saying what is missing.
func chromium(t testing.TB) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium not installed: apt-get install chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

func navigate(t testing.TB, ctx context.Context, u string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(c, chromedp.Navigate(u)); err != nil {
		t.Fatalf("navigate to %s: %v", u, err)
	}
}

func poll(t testing.TB, ctx context.Context, what, expr string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(c, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(25*time.Second))); err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML.slice(0, 2000)`))
		t.Fatalf("waiting for %s (%s): %v\nthe page:\n%s", what, expr, err, text)
	}
}

func evalJS[T any](t testing.TB, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// TestSandboxPorts: a dev server in a sandbox, exposed, loads in headless
// Chromium through its preview URL after a one-time sign-in; its
// WebSocket echo answers and its server-sent events arrive one by one.
// The preview refuses requests without credentials; the sign-in link
// works once; the public link works without any and stops working when
// revoked; the dashboard lists the port; the port closes when the
// sandbox is destroyed.
func TestSandboxPorts(t *testing.T) {
	env := startPreviewEnv(t)
	ctx := context.Background()
	p := env.expose(t, previewPort, false)
	if !strings.HasPrefix(p.Url, "http://127.0.0.1:") || p.PublicUrl != "" || p.Port != previewPort || p.Sandbox != env.id {
		t.Fatalf("exposed port = %+v", p)
	}
	again, err := env.c.ExposePort(ctx, env.id, client.ExposePortRequest{Port: previewPort})
	if err != nil || again.Url != p.Url {
		t.Errorf("exposing again: %+v, %v; want the same URL %s", again, err, p.Url)
	}
	hc := &http.Client{Timeout: 10 * time.Second}

	// No credentials, a wrong token, a made-up sign-in: refused.
	for _, req := range []*http.Request{newReq("GET", p.Url), newReq("GET", p.Url, "Authorization", "Bearer not-the-token"),
		newReq("GET", strings.TrimSuffix(p.Url, "/")+previewSignIn+"?ticket=made-up")} {
		if code, body := status(t, hc, req); code != http.StatusUnauthorized || !strings.Contains(body, "sign") {
			t.Errorf("%s %v: %d %q, want 401 saying how to sign in", req.URL, req.Header, code, body)
		}
	}

	// Bad input at the door.
	for _, port := range []int{0, 65536, -80} {
		var ae *client.APIError
		if _, err := env.c.ExposePort(ctx, env.id, client.ExposePortRequest{Port: port}); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "between 1 and 65535") {
			t.Errorf("expose port %d: %v, want 400 naming the range", port, err)
		}
	}
	if _, err := env.c.ExposePort(ctx, "nope", client.ExposePortRequest{Port: 80}); err == nil || !strings.Contains(err.Error(), "no sandbox nope") {
		t.Errorf("expose on a missing sandbox: %v", err)
	}
	// Nothing listening: the preview says so.
	closed := env.expose502(t, 8009)
	if !strings.Contains(closed, "8009") || !strings.Contains(closed, "listening") {
		t.Errorf("a port nothing listens on answers %q", closed)
	}

	browser := chromium(t)
	var signInURL string
	t.Run("dashboard", func(t *testing.T) {
		navigate(t, browser, "http://"+env.d.TCPAddr()+"/ui/?token="+env.d.Token())
		poll(t, browser, "a session", `localStorage.getItem('hearth_session')?.length >= 32`)
		navigate(t, browser, "http://"+env.d.TCPAddr()+"/ui/#/sandboxes")
		link := `document.querySelector('#sandboxes tr[data-id="` + env.id + `"] .ports a[data-port="` + fmt.Sprint(previewPort) + `"]')`
		poll(t, browser, "the exposed port's link", link+`?.getAttribute('href') === '`+p.Url+`'`)
		// A click asks the API for a sign-in link and opens it in a new
		// tab: the tab is stood in for, to read where it is sent.
		evalJS[bool](t, browser, `window.open = () => (window.opened = {}); `+link+`.click(); true`)
		poll(t, browser, "the sign-in link the click opens", `typeof window.opened?.location === 'string'`)
		signInURL = evalJS[string](t, browser, `window.opened.location`)
		if !strings.HasPrefix(signInURL, strings.TrimSuffix(p.Url, "/")+previewSignIn+"?ticket=") {
			t.Fatalf("the dashboard opened %q", signInURL)
		}
	})

	t.Run("browser", func(t *testing.T) {
		if signInURL == "" {
			t.Skip("the dashboard gave no sign-in link")
		}
		navigate(t, browser, signInURL)
		poll(t, browser, "the page", `document.querySelector('#hello')?.textContent === 'served from the sandbox'`)
		if got := evalJS[string](t, browser, `location.href`); got != p.Url {
			t.Errorf("after signing in the browser is at %s, want %s", got, p.Url)
		}
		poll(t, browser, "the WebSocket echo", `window.results.ws === 'echo:hello'`)
		poll(t, browser, "three server-sent events", `window.results.events.length === 3`)
		events := evalJS[[]string](t, browser, `window.results.events`)
		times := evalJS[[]float64](t, browser, `window.results.gaps`)
		if strings.Join(events, ",") != "tick 0,tick 1,tick 2" {
			t.Errorf("events = %q", events)
		}
		for i := 1; i < len(times); i++ { // the server sleeps 400 ms between them
			if gap := times[i] - times[i-1]; gap < 250 {
				t.Errorf("event %d came %.0f ms after the one before: held back and sent together, not as they came", i, gap)
			}
		}
		// The link was for once.
		if code, _ := status(t, hc, newReq("GET", signInURL)); code != http.StatusUnauthorized {
			t.Errorf("a used sign-in link answers %d, want 401", code)
		}
		si, err := env.c.SignInPort(ctx, env.id, previewPort)
		if err != nil || !strings.HasPrefix(si.Url, strings.TrimSuffix(p.Url, "/")+previewSignIn) || time.Until(si.Expires) > signInTTL {
			t.Errorf("sign-in link from the API: %+v, %v", si, err)
		}
	})

	t.Run("public link", func(t *testing.T) {
		pub, err := env.c.ExposePort(ctx, env.id, client.ExposePortRequest{Port: previewPort, Public: true})
		if err != nil || !strings.HasPrefix(pub.PublicUrl, strings.TrimSuffix(p.Url, "/")+previewPublic) {
			t.Fatalf("public: %+v, %v", pub, err)
		}
		key := strings.TrimPrefix(pub.PublicUrl, strings.TrimSuffix(p.Url, "/")+previewPublic)
		if len(key) < 22 { // 128 bits in base64
			t.Errorf("public key %q is shorter than 128 bits", key)
		}
		jar, _ := cookiejar.New(nil)
		anon := &http.Client{Jar: jar, Timeout: 10 * time.Second}
		if code, body := status(t, anon, newReq("GET", pub.PublicUrl)); code != http.StatusOK || !strings.Contains(body, "served from the sandbox") {
			t.Fatalf("the public link: %d %q", code, body)
		}
		if code, _ := status(t, anon, newReq("GET", p.Url+"events")); code != http.StatusOK {
			t.Errorf("after the public link, another page: %d", code)
		}
		if code, _ := status(t, anon, newReq("GET", strings.TrimSuffix(p.Url, "/")+previewPublic+"x"+key)); code != http.StatusNotFound {
			t.Errorf("a wrong public key answers %d, want 404", code)
		}
		if r, err := env.c.RevokePublicPort(ctx, env.id, previewPort); err != nil || r.PublicUrl != "" {
			t.Fatalf("revoke: %+v, %v", r, err)
		}
		if code, _ := status(t, anon, newReq("GET", p.Url)); code != http.StatusUnauthorized {
			t.Errorf("a browser of the revoked public link still gets in: %d", code)
		}
		if code, _ := status(t, anon, newReq("GET", pub.PublicUrl)); code != http.StatusNotFound {
			t.Errorf("the revoked public link answers %d, want 404", code)
		}
		// The operator's signed-in browser is not signed out by it.
		navigate(t, browser, p.Url)
		poll(t, browser, "the page, still signed in", `document.querySelector('#hello')?.textContent === 'served from the sandbox'`)
	})

	t.Run("pause and resume", func(t *testing.T) {
		if _, err := env.c.PauseSandbox(ctx, env.id); err != nil {
			t.Fatal(err)
		}
		if code, body := status(t, hc, newReq("GET", p.Url, "Authorization", "Bearer "+env.d.Token())); code != http.StatusBadGateway || !strings.Contains(body, "paused") {
			t.Errorf("a paused sandbox's preview: %d %q, want 502 saying it is paused", code, body)
		}
		if _, err := env.c.ResumeSandbox(ctx, env.id); err != nil {
			t.Fatal(err)
		}
		if code, _ := status(t, hc, newReq("GET", p.Url, "Authorization", "Bearer "+env.d.Token())); code != http.StatusOK {
			t.Errorf("after resume: %d", code)
		}
	})

	ports, err := env.c.Ports(ctx, env.id)
	if err != nil || len(ports) != 2 || ports[0].Port != previewPort || ports[1].Port != 8009 {
		t.Errorf("ports = %+v, %v", ports, err)
	}
	if _, err := env.c.ClosePort(ctx, env.id, 8009); err != nil {
		t.Fatal(err)
	}
	if _, err := env.c.ClosePort(ctx, env.id, 8009); err == nil || !strings.Contains(err.Error(), "no exposed port 8009") {
		t.Errorf("closing it again: %v", err)
	}

	// A WebSocket open when the sandbox is destroyed ends; the port no
	// longer answers.
	ws := openWebSocket(t, p.Url, env.d.Token())
	if err := env.c.DestroySandbox(ctx, env.id); err != nil {
		t.Fatal(err)
	}
	ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := ws.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a WebSocket through the destroyed sandbox's port: %v, want it ended", err)
	}
	u := strings.TrimPrefix(strings.TrimSuffix(p.Url, "/"), "http://")
	if c, err := net.DialTimeout("tcp", u, 2*time.Second); err == nil {
		c.Close()
		t.Errorf("the destroyed sandbox's preview %s still accepts connections", u)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial the destroyed sandbox's preview: %v, want refused", err)
	}
}

// expose502 exposes port, where nothing listens, and returns what the
// preview answers.
func (env *previewEnv) expose502(t *testing.T, port int) string {
	t.Helper()
	p, err := env.c.ExposePort(context.Background(), env.id, client.ExposePortRequest{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := env.get(p.Url, env.d.Token())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("port %d with nothing listening: %d, want 502", port, resp.StatusCode)
	}
	return string(b)
}

// openWebSocket opens the dev server's /ws through the preview with the
// API token and checks one echo; the connection stays open.
func openWebSocket(t testing.TB, previewURL, token string) net.Conn {
	t.Helper()
	host := strings.TrimSuffix(strings.TrimPrefix(previewURL, "http://"), "/")
	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", host, token)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("WebSocket upgrade: %v %v", resp, err)
	}
	msg := []byte("hi")
	frame := append([]byte{0x81, 0x80 | byte(len(msg)), 0, 0, 0, 0}, msg...) // masked with zeros
	c.Write(frame)
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, hdr[1]&127)
	if _, err := io.ReadFull(br, body); err != nil || string(body) != "echo:hi" {
		t.Fatalf("WebSocket echo = %q, %v", body, err)
	}
	c.SetDeadline(time.Time{})
	return &bufConn{Conn: c, r: br}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestHostilePreviewPage: a page the sandbox serves, loaded through its
// preview in the operator's browser (signed in to the dashboard and to
// the preview), cannot ride the operator's session: it cannot read the
// dashboard's session from localStorage (its own origin's is empty, the
// dashboard's frame is another origin), the preview's cookie is HttpOnly,
// the API answers it 401 and refuses its blind POST (no sandbox made).
// The dev server never sees the daemon's credentials: the preview cookies
// and the API token are taken out of what is proxied, the sandbox's own
// cookies kept. And a request another preview's page makes the browser
// send with this preview's cookie (same site: another port) is refused
// unless it is a link followed. The sandbox cannot set a cookie under a
// preview's name.
func TestHostilePreviewPage(t *testing.T) {
	env := startPreviewEnv(t)
	ctx := context.Background()
	p := env.expose(t, previewPort, false)
	api := "http://" + env.d.TCPAddr()
	browser := chromium(t)
	navigate(t, browser, api+"/ui/?token="+env.d.Token())
	poll(t, browser, "a session", `localStorage.getItem('hearth_session')?.length >= 32`)
	session := evalJS[string](t, browser, `localStorage.getItem('hearth_session')`)
	si, err := env.c.SignInPort(ctx, env.id, previewPort)
	if err != nil {
		t.Fatal(err)
	}
	navigate(t, browser, si.Url)
	poll(t, browser, "the preview", `document.querySelector('#hello') !== null`)
	navigate(t, browser, p.Url+"hostile.html#"+api)
	poll(t, browser, "the hostile page's attempts", `window.loot && window.loot.done === true`)
	var loot map[string]any
	raw := evalJS[string](t, browser, `JSON.stringify(window.loot)`)
	json.Unmarshal([]byte(raw), &loot)
	t.Logf("the hostile page got: %s", raw)
	if loot["localStorage"] != nil {
		t.Errorf("the preview's origin has a session in localStorage: %v", loot["localStorage"])
	}
	if s, _ := loot["cookie"].(string); strings.Contains(s, previewCookiePrefix) {
		t.Errorf("the page reads the preview's cookie: %q", s)
	}
	if s, _ := loot["read"].(string); !strings.HasPrefix(s, "blocked") && !strings.HasPrefix(s, "401") || strings.Contains(s, env.id) {
		t.Errorf("the page read the API: %q", s)
	}
	if s, _ := loot["frame"].(string); !strings.HasPrefix(s, "blocked") || strings.Contains(s, session) {
		t.Errorf("the page read the dashboard's frame: %q", s)
	}
	if sbs, err := env.c.Sandboxes(ctx); err != nil || len(sbs) != 1 {
		t.Errorf("sandboxes after the page's POST: %d, %v; want only %s", len(sbs), err, env.id)
	}

	// What reaches the dev server.
	hc := &http.Client{Timeout: 10 * time.Second}
	cookies := evalCookies(t, browser, p.Url)
	req := newReq("GET", p.Url+"headers", "Authorization", "Bearer "+env.d.Token(), "Cookie", cookies+"; app=1")
	code, body := status(t, hc, req)
	if code != http.StatusOK || strings.Contains(body, previewCookiePrefix) || strings.Contains(body, env.d.Token()) || !strings.Contains(body, "app=1") {
		t.Errorf("the dev server saw %d %s; want the app's cookie only", code, body)
	}
	req = newReq("GET", p.Url+"headers", "Authorization", "Bearer "+session)
	if code, body := status(t, hc, req); code != http.StatusOK || strings.Contains(body, session) {
		t.Errorf("with the dashboard's session as bearer the dev server saw %d %s", code, body)
	}

	// The sandbox cannot set a preview's cookie (to sign the browser out
	// of another preview): those are taken out of its answer.
	resp, err := env.get(p.Url+"setcookies", env.d.Token())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Values("Set-Cookie"); len(got) != 1 || got[0] != "app=2; Path=/" {
		t.Errorf("the sandbox's Set-Cookie through the preview: %q, want only its own app=2", got)
	}

	// Another port's page making the browser send this preview's cookie.
	for _, c := range []struct {
		method, site, mode string
		want               int
	}{
		{"GET", "same-site", "cors", http.StatusForbidden},
		{"GET", "same-site", "no-cors", http.StatusForbidden},
		{"GET", "same-site", "websocket", http.StatusForbidden},
		{"POST", "same-site", "navigate", http.StatusForbidden},
		{"GET", "cross-site", "cors", http.StatusForbidden},
		{"GET", "same-site", "navigate", http.StatusOK},
		{"GET", "same-origin", "cors", http.StatusOK},
	} {
		req := newReq(c.method, p.Url+"headers", "Cookie", cookies, "Sec-Fetch-Site", c.site, "Sec-Fetch-Mode", c.mode)
		if code, _ := status(t, hc, req); code != c.want && !(c.want == http.StatusOK && c.method == "POST") {
			t.Errorf("%s with the cookie, Sec-Fetch-Site %s, mode %s: %d, want %d", c.method, c.site, c.mode, code, c.want)
		}
	}
	req = newReq("GET", p.Url+"headers", "Cookie", cookies, "Origin", "http://127.0.0.1:1")
	if code, _ := status(t, hc, req); code != http.StatusForbidden {
		t.Errorf("with the cookie and another Origin: %d, want 403", code)
	}
}

// evalCookies returns the browser's cookies for u, as a Cookie header
// (DevTools sees the HttpOnly ones).
func evalCookies(t testing.TB, ctx context.Context, u string) string {
	t.Helper()
	var parts []string
	err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		res, err := cdp.Call(ctx, tgt, network.GetCookies, network.GetCookiesParams{URLs: []string{u}})
		if err != nil {
			return err
		}
		for _, c := range res.Cookies {
			parts = append(parts, c.Name+"="+c.Value)
		}
		return nil
	}))
	if err != nil || len(parts) == 0 {
		t.Fatalf("the browser's cookies for %s: %v, %v", u, parts, err)
	}
	return strings.Join(parts, "; ")
}
