package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSessionsExpire: a browser session ends after sessionIdle unused,
// after sessionMax however used, when revoked (signed out), and when too
// many others were signed in after it.
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

	first := ss.create()
	for i := 0; i < maxSessions; i++ {
		now = now.Add(time.Second)
		ss.create()
	}
	if ss.valid(first) || len(ss.m) != maxSessions {
		t.Errorf("%d sessions kept, the oldest still valid: %v; want at most %d, the least recently used gone", len(ss.m), ss.valid(first), maxSessions)
	}
}

// TestHostileCrossOriginAPI: even with the dashboard's session attached
// (which a browser does not do for a page of another origin: it is no
// cookie), what a page of another origin could make the browser send (its Origin or
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
	session := signInSession(t, base, d.Token())
	foreign := "http://127.0.0.1:1" // another port of the same host: same site, other origin

	type route struct{ name, method, path, body string }
	routes := []route{
		{"add credits", "POST", "/v1/credits", `{"usd":100}`},
		{"exec", "POST", "/v1/sandboxes/victim/exec", `{"argv":["sh","-c","echo pwned > /tmp/pwned"]}`},
		{"make a workspace session", "POST", "/v1/workspace/sessions", `{"id":"intruder"}`},
		{"upload", "PUT", "/v1/sandboxes/victim/files?path=/tmp/pwned", `pwned`},
		{"archive upload", "POST", "/v1/workspace/sessions/s1/archive", "\x1f\x8bpwned"},
		{"sign out", "POST", logoutPath, ``},
		{"mcp", "POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`},
		// The dashboard's start and resume forms send these, with the files uploaded.
		{"delegate with inputs", "POST", "/v1/executions", "--x\r\nContent-Disposition: form-data; name=\"request\"\r\n\r\n{\"agent\":\"a\",\"prompt\":\"p\"}\r\n--x--\r\n"},
		{"resume with inputs", "POST", "/v1/sessions/s1/resume", "--x\r\nContent-Disposition: form-data; name=\"request\"\r\n\r\n{\"prompt\":\"p\"}\r\n--x--\r\n"},
	}
	uploads := map[string]bool{"upload": true, "archive upload": true, "delegate with inputs": true, "resume with inputs": true}
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
			if uploads[rt.name] && !at.uploads || rt.body == "" && at.want == http.StatusUnsupportedMediaType {
				continue
			}
			status, body := send(t, rt.method, base+rt.path, rt.body, session, at.headers)
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
	if ents, err := os.ReadDir(filepath.Join(cfg.Workspace.Mount, "s1", "inputs")); err != nil || len(ents) != 0 {
		t.Errorf("the session's inputs/ after the attacks: %v, %v; want empty", ents, err)
	}
	if got, _ := send(t, "GET", base+"/v1/credits", "", session, nil); got != http.StatusOK {
		t.Errorf("after the attacks the browser's session gives %d, want 200", got)
	}

	// The dashboard's own requests (same-origin) and API clients work.
	same := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": base, "Content-Type": "application/json"}
	if status, body := send(t, "POST", base+"/v1/credits", `{"usd":1}`, session, same); status != http.StatusOK {
		t.Fatalf("same-origin add credits: %d %s", status, body)
	}
	if cr, err := NewTCPClient(d.TCPAddr(), d.Token()).AddCredits(ctx, 2, "cli"); err != nil || cr.Available != 3 {
		t.Fatalf("bearer AddCredits = %+v, %v; want $3 available", cr, err)
	}
	if status, _ := send(t, "POST", base+logoutPath, "", session, map[string]string{"Sec-Fetch-Site": "same-origin"}); status != http.StatusNoContent {
		t.Fatalf("sign out: %d, want 204", status)
	}
	if got, _ := send(t, "GET", base+"/v1/credits", "", session, nil); got != http.StatusUnauthorized {
		t.Errorf("after signing out the session gives %d, want 401", got)
	}
}

// TestSignIn: POST /ui/session exchanges the token for a session, and
// only the token: a GET, a wrong token or a body that is not JSON get
// none; the dashboard's files need nothing, the API needs the session.
func TestSignIn(t *testing.T) {
	token := strings.Repeat("t", 32)
	ss := newSessions()
	h := guardBrowsers(requireToken(token, ss, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) })))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, tc := range []struct {
		name, method, ctype, body string
		want                      int
	}{
		{"GET", "GET", "", "", http.StatusMethodNotAllowed},
		{"wrong token", "POST", "application/json", `{"token":"` + strings.Repeat("x", 32) + `"}`, http.StatusUnauthorized},
		{"empty token", "POST", "application/json", `{"token":""}`, http.StatusUnauthorized},
		{"text/plain", "POST", "text/plain", `{"token":"` + token + `"}`, http.StatusUnsupportedMediaType},
		{"form", "POST", "application/x-www-form-urlencoded", "token=" + token, http.StatusUnsupportedMediaType},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+sessionPath, strings.NewReader(tc.body))
		if tc.ctype != "" {
			req.Header.Set("Content-Type", tc.ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want || len(ss.m) != 0 {
			t.Errorf("%s: %d, %d sessions; want %d and none", tc.name, resp.StatusCode, len(ss.m), tc.want)
		}
	}
	id := signInSession(t, srv.URL, token)
	for _, tc := range []struct {
		name, path string
		auth       map[string]string
		want       int
	}{
		{"the page", "/ui/", nil, 299},
		{"the API without anything", "/v1/credits", nil, http.StatusUnauthorized},
		{"the API with the session as a cookie", "/v1/credits", map[string]string{"Cookie": "hearth_session=" + id}, http.StatusUnauthorized},
		{"the API with the session", "/v1/credits", map[string]string{"Authorization": "Bearer " + id}, 299},
		{"a stream with ?session=", "/v1/executions/x/events?session=" + id, map[string]string{"Accept": "text/event-stream"}, 299},
		{"a JSON read with ?session=", "/v1/executions/x/events?session=" + id, nil, http.StatusUnauthorized},
	} {
		if status, _ := send(t, "GET", srv.URL+tc.path, "", "", tc.auth); status != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, status, tc.want)
		}
	}
}

// signInSession signs in as the dashboard does and returns the session
// id.
func signInSession(t *testing.T, base, token string) string {
	t.Helper()
	status, body := send(t, "POST", base+sessionPath, `{"token":"`+token+`"}`, "", map[string]string{"Content-Type": "application/json"})
	var out struct{ Session string }
	if status != http.StatusCreated || json.Unmarshal([]byte(body), &out) != nil || len(out.Session) < 32 || strings.Contains(body, token) {
		t.Fatalf("sign in: %d %s; want 201 and a session id", status, body)
	}
	return out.Session
}

// send makes one request with the session (if any) as bearer token and
// headers, and returns the status and the start of the body.
func send(t *testing.T, method, url, body, session string, headers map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if session != "" {
		req.Header.Set("Authorization", "Bearer "+session)
	}
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
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
	return resp.StatusCode, string(b)
}

// FuzzGuardBrowsers: whatever the method, path, headers and body, a
// state-changing request gets past guardBrowsers only if no browser
// sent it for another origin and, unless it is an upload, its body is
// JSON or absent.
func FuzzGuardBrowsers(f *testing.F) {
	f.Add("POST", "/v1/credits", "text/plain", "", "", "127.0.0.1:8080", 11)
	f.Add("POST", "/v1/credits", "application/json", "same-site", "http://127.0.0.1:1", "127.0.0.1:8080", 11)
	f.Add("POST", "/v1/credits", "application/json; charset=utf-8", "", "http://127.0.0.1:8080", "127.0.0.1:8080", 11)
	f.Add("PUT", "/v1/sandboxes/x/files", "text/plain", "same-origin", "", "127.0.0.1:8080", 5)
	f.Add("DELETE", "/v1/schedules/x", "", "", "null", "h", 0)
	f.Add("post", "/v1/sandboxes//files", "Application/JSON", "none", "", "h", -1)
	f.Add("POST", "/v1/executions", "multipart/form-data; boundary=x", "cross-site", "", "h", 100)
	f.Add("POST", "/v1/sessions/s1/resume", "multipart/form-data; boundary=x", "", "http://evil.example", "h", 100)
	f.Add("POST", "/v1/sessions//resume", "multipart/form-data; boundary=x", "", "", "h", 100)
	f.Fuzz(func(t *testing.T, method, path, ctype, site, origin, host string, length int) {
		if !validMethod(method) || strings.ContainsAny(path+ctype+site+origin+host, "\r\n\x00") || !strings.HasPrefix(path, "/") {
			return
		}
		r := httptest.NewRequest("GET", "http://h/", nil)
		r.Method, r.URL.Path, r.Host, r.ContentLength = method, path, host, int64(length)
		for k, v := range map[string]string{"Content-Type": ctype, "Sec-Fetch-Site": site, "Origin": origin} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		reached := false
		guardBrowsers(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true })).ServeHTTP(httptest.NewRecorder(), r)
		if !reached || safeMethod(method) {
			return
		}
		if site != "" && site != "same-origin" && site != "none" {
			t.Errorf("%s %s with Sec-Fetch-Site %q got through", method, path, site)
		}
		if site == "" && origin != "" {
			if u, err := url.Parse(origin); err != nil || u.Host != host {
				t.Errorf("%s %s from Origin %q to Host %q got through", method, path, origin, host)
			}
		}
		if !isUpload(r) && !isJSON(ctype) && (ctype != "" || length != 0) {
			t.Errorf("%s %s with a %q body of %d bytes got through", method, path, ctype, length)
		}
	})
}

// validMethod is an HTTP token, as a server would read one.
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range m {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, c) {
			return false
		}
	}
	return true
}
