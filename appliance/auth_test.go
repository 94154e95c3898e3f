package appliance

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAPIOverTCP serves the API on loopback TCP: without the token every
// path is refused with a JSON 401 (nothing is done), the bearer token and
// the dashboard's cookie get through, the token survives a restart, and
// the unix socket needs none.
func TestAPIOverTCP(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	dir := t.TempDir()
	cfg := Config{StateDir: filepath.Join(dir, "state"), Workspace: WorkspaceConfig{Mount: filepath.Join(dir, "agents")},
		API: APIConfig{TCP: "127.0.0.1:0"}}
	d, err := Start(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { d.Close() }()
	addr, token := d.TCPAddr(), d.Token()
	if addr == "" || len(token) < 32 {
		t.Fatalf("TCPAddr %q, token %q: want an address and a long token", addr, token)
	}
	if b, err := os.ReadFile(cfg.TokenPath()); err != nil || strings.TrimSpace(string(b)) != token {
		t.Fatalf("token file = %q, %v; want the token", b, err)
	}
	if st, _ := os.Stat(cfg.TokenPath()); st.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", st.Mode().Perm())
	}
	ctx := context.Background()

	for name, c := range map[string]*Client{"no token": NewTCPClient(addr, ""), "wrong token": NewTCPClient(addr, strings.Repeat("x", 64))} {
		err := c.CreateSession(ctx, "intruder")
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || ae.Code != "unauthorized" || !strings.Contains(ae.Message, "api.token") {
			t.Errorf("%s: CreateSession = %v, want a 401 unauthorized that says where the token is", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.Workspace.Mount, "intruder")); err == nil {
		t.Error("a request without the token made a session")
	}
	if err := NewTCPClient(addr, token).CreateSession(ctx, "tcp"); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	if _, err := NewClient(cfg.SocketPath()).Sessions(ctx); err != nil {
		t.Fatalf("unix socket: %v", err)
	}

	// A browser: ?token= sets a session's cookie (not the token) and
	// redirects to the same page without it; the cookie then opens the API.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get("http://" + addr + "/v1/workspace/sessions?token=" + token + "&x=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/v1/workspace/sessions?x=1" || cookie == nil || !cookie.HttpOnly ||
		cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" || cookie.MaxAge <= 0 {
		t.Fatalf("?token= gave %d to %q, cookie %+v; want 303 to the page without the token and an HttpOnly, SameSite=Strict, expiring cookie for /", resp.StatusCode, resp.Header.Get("Location"), cookie)
	}
	for _, c := range resp.Cookies() {
		if strings.Contains(c.Value, token) || strings.Contains(c.Raw, token) {
			t.Fatalf("cookie %s carries the API token", c.Name)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/workspace/sessions", nil)
	req.AddCookie(cookie)
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("with the cookie: %v %v", resp.Status, err)
	}
	resp.Body.Close()

	// The session survives no restart; the token does.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.API.TCP = addr
	if d, err = Start(cfg, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	if d.Token() != token {
		t.Error("the token changed across a restart")
	}
	if got := getWithCookie(t, addr, cookie); got != http.StatusUnauthorized {
		t.Errorf("a session cookie from before the restart: %d, want 401", got)
	}
}

// getWithCookie GETs the sessions list with cookie and returns the status.
func getWithCookie(t *testing.T, addr string, cookie *http.Cookie) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/workspace/sessions", nil)
	req.AddCookie(cookie)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTokenFileTooShort: a token file someone wrote by hand with a weak
// token stops the daemon with a message that says what to do.
func TestTokenFileTooShort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.token")
	os.WriteFile(path, []byte("secret\n"), 0o600)
	if _, err := loadToken(path); err == nil || !strings.Contains(err.Error(), "shorter than 16") {
		t.Fatalf("loadToken = %v, want it refused as too short", err)
	}
}
