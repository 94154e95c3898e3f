package appliance

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSessionsExpire: a browser session ends after sessionIdle unused,
// after sessionMax however used, when revoked, and when too many others
// were signed in after it.
func TestSessionsExpire(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	ss := newSessions()
	ss.now = func() time.Time { return now }

	idle := ss.create()
	if !ss.valid(idle) || ss.valid("") || ss.valid(idle+"x") {
		t.Fatal("a new session is not valid, or a made-up one is")
	}
	now = now.Add(sessionIdle - time.Minute)
	if !ss.valid(idle) {
		t.Fatal("a session used just under sessionIdle ago ended")
	}
	now = now.Add(sessionIdle)
	if ss.valid(idle) {
		t.Error("a session unused for sessionIdle is still valid")
	}

	busy := ss.create()
	for end := now.Add(sessionMax); now.Before(end.Add(-sessionIdle)); now = now.Add(sessionIdle / 2) {
		if !ss.valid(busy) {
			t.Fatalf("a session in use ended %v after sign-in, before sessionMax", now.Sub(end.Add(-sessionMax)))
		}
	}
	now = now.Add(sessionIdle / 2)
	if ss.valid(busy) {
		t.Error("a session in use is still valid after sessionMax")
	}

	a, b := ss.create(), ss.create()
	ss.revoke(a)
	if ss.valid(a) || !ss.valid(b) {
		t.Error("revoke ended the wrong session")
	}
	ss.revokeAll()
	if ss.valid(b) {
		t.Error("revokeAll left a session")
	}

	first := ss.create()
	for i := 0; i < maxSessions; i++ {
		now = now.Add(time.Second)
		ss.create()
	}
	if ss.valid(first) || len(ss.m) != maxSessions {
		t.Errorf("%d sessions kept, the oldest still valid: %v; want at most %d, the least recently used gone", len(ss.m), ss.valid(first), maxSessions)
	}
}

// TestHostileCrossOriginAPI: with the dashboard's session cookie, what a
// page of another origin could make the browser send (its Origin or
// Sec-Fetch-Site, a text/plain or form body that needs no preflight) is
// refused on every state-changing route, and changes nothing: no credits
// added, no command run in a sandbox, no workspace session made, the
// browser not signed out. The same requests from the dashboard's own
// origin, and the bearer-token client, still work.
func TestHostileCrossOriginAPI(t *testing.T) {
	cfg := sandboxConfig(t)
	cfg.API.TCP = "127.0.0.1:0"
	d, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "victim", Session: "s1"}); err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.TCPAddr()
	cookie := signInCookie(t, base, d.Token())
	foreign := "http://127.0.0.1:1" // another port of the same host: same site, other origin

	type route struct{ name, method, path, body string }
	routes := []route{
		{"add credits", "POST", "/v1/credits", `{"usd":100}`},
		{"exec", "POST", "/v1/sandboxes/victim/exec", `{"argv":["sh","-c","echo pwned > /tmp/pwned"]}`},
		{"make a workspace session", "POST", "/v1/workspace/sessions", `{"id":"intruder"}`},
		{"upload", "PUT", "/v1/sandboxes/victim/files?path=/tmp/pwned", `pwned`},
		{"sign out", "POST", logoutPath, ``},
		{"mcp", "POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`},
	}
	type attack struct {
		name    string
		headers map[string]string
		want    int
		uploads bool // whether it applies to the upload route, whose body is not JSON
	}
	attacks := []attack{
		{"fetch from another port", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": foreign, "Content-Type": "application/json"}, http.StatusForbidden, true},
		{"cross-site fetch", map[string]string{"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}, http.StatusForbidden, true},
		{"foreign Origin only", map[string]string{"Origin": foreign, "Content-Type": "application/json"}, http.StatusForbidden, true},
		{"text/plain from another port", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": foreign, "Content-Type": "text/plain;charset=UTF-8"}, http.StatusForbidden, true},
		{"text/plain", map[string]string{"Content-Type": "text/plain;charset=UTF-8"}, http.StatusUnsupportedMediaType, false},
		{"form", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType, false},
		{"multipart form", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, http.StatusUnsupportedMediaType, false},
	}
	for _, rt := range routes {
		for _, at := range attacks {
			if rt.name == "upload" && !at.uploads || rt.body == "" && at.want == http.StatusUnsupportedMediaType {
				continue
			}
			status, body := send(t, rt.method, base+rt.path, rt.body, cookie, at.headers)
			if status != at.want {
				t.Errorf("%s, %s: %d %s; want %d", rt.name, at.name, status, body, at.want)
			}
		}
	}

	// Nothing changed.
	if cr, err := c.Credits(ctx); err != nil || cr.Available != 0 {
		t.Errorf("credits = %+v, %v; want none added", cr, err)
	}
	var out bytes.Buffer
	if st, err := c.Exec(ctx, "victim", ExecRequest{Argv: []string{"sh", "-c", "cat /tmp/pwned 2>&1"}}, &out, io.Discard); err != nil || st.Code == 0 {
		t.Errorf("the attack's file: exit %+v, %v, %q; want none", st, err, out.String())
	}
	infos, err := c.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range infos {
		if s.ID == "intruder" {
			t.Error("the attack made a workspace session")
		}
	}
	if got := getWithCookie(t, d.TCPAddr(), cookie); got != http.StatusOK {
		t.Errorf("after the attacks the browser's session gives %d, want 200", got)
	}

	// The dashboard's own requests (same-origin) and API clients work.
	same := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": base, "Content-Type": "application/json"}
	if status, body := send(t, "POST", base+"/v1/credits", `{"usd":1}`, cookie, same); status != http.StatusOK {
		t.Fatalf("same-origin add credits: %d %s", status, body)
	}
	if cr, err := NewTCPClient(d.TCPAddr(), d.Token()).AddCredits(ctx, 2, "cli"); err != nil || cr.Available != 3 {
		t.Fatalf("bearer AddCredits = %+v, %v; want $3 available", cr, err)
	}
	if status, _ := send(t, "POST", base+logoutPath, "", cookie, map[string]string{"Sec-Fetch-Site": "same-origin"}); status != http.StatusNoContent {
		t.Fatalf("sign out: %d, want 204", status)
	}
	if got := getWithCookie(t, d.TCPAddr(), cookie); got != http.StatusUnauthorized {
		t.Errorf("after signing out the cookie gives %d, want 401", got)
	}
}

// TestHostileCrossOriginRead: a page of another origin cannot use the
// session to start a read (a stream, a download) either, though the user
// following a link to the API still can.
func TestHostileCrossOriginRead(t *testing.T) {
	ss := newSessions()
	id := ss.create()
	h := requireToken(strings.Repeat("t", 32), ss, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) }))
	for _, tc := range []struct {
		site, mode string
		want       int
	}{
		{"same-site", "cors", 403}, {"cross-site", "no-cors", 403}, {"same-site", "navigate", 299},
		{"same-origin", "cors", 299}, {"none", "navigate", 299}, {"", "", 299},
	} {
		r, _ := http.NewRequest("GET", "http://hearth/v1/executions/x/events", nil)
		r.AddCookie(&http.Cookie{Name: sessionCookie, Value: id})
		if tc.site != "" {
			r.Header.Set("Sec-Fetch-Site", tc.site)
			r.Header.Set("Sec-Fetch-Mode", tc.mode)
		}
		w := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(w, r)
		if w.status != tc.want {
			t.Errorf("GET with the cookie, Sec-Fetch-Site %q, mode %q: %d, want %d", tc.site, tc.mode, w.status, tc.want)
		}
	}
}

type statusRecorder struct {
	header http.Header
	status int
}

func (w *statusRecorder) Header() http.Header         { return w.header }
func (w *statusRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (w *statusRecorder) WriteHeader(s int)           { w.status = s }

// signInCookie signs in as a browser does, with ?token=, and returns the
// session cookie.
func signInCookie(t *testing.T, base, token string) *http.Cookie {
	t.Helper()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(base + "/ui/?token=" + token)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			return c
		}
	}
	t.Fatalf("?token= set no %s cookie: %d", sessionCookie, resp.StatusCode)
	return nil
}

// send makes one request with cookie and headers and returns the status
// and the start of the body.
func send(t *testing.T, method, url, body string, cookie *http.Cookie, headers map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.AddCookie(cookie)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	return resp.StatusCode, string(b)
}
