package appliance

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/client"
)

// TestAPIOverTCP serves the API on loopback TCP: without the token every
// path is refused with a JSON 401 (nothing is done), the bearer token and
// a browser session made with it get through, the token survives a
// restart (the sessions do not), and the unix socket needs none.
func TestAPIOverTCP(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	dir := t.TempDir()
	cfg := Config{StateDir: filepath.Join(dir, "state"), Workspace: WorkspaceConfig{Mount: filepath.Join(dir, "agents")},
		API: APIConfig{TCP: "127.0.0.1:0"}}
	d, err := Start(context.Background(), cfg, testLogger(t))
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
		var ae *client.APIError
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

	// A browser (the dashboard) exchanges the token for a session, which
	// then opens the API; a ?token= in an API address opens nothing.
	session := signInSession(t, "http://"+addr, token)
	if got, _ := send(t, "GET", "http://"+addr+"/v1/workspace/sessions", "", session, nil); got != http.StatusOK {
		t.Fatalf("with the session: %d", got)
	}
	if got, _ := send(t, "GET", "http://"+addr+"/v1/workspace/sessions?token="+token, "", "", nil); got != http.StatusUnauthorized {
		t.Fatalf("?token= on an API address: %d, want 401", got)
	}
	// An event stream (EventSource sends no header) takes ?session=.
	sse := map[string]string{"Accept": "text/event-stream"}
	if got, body := send(t, "GET", "http://"+addr+"/v1/executions/nope/events?session="+session, "", "", sse); got != http.StatusNotFound {
		t.Fatalf("an event stream with ?session=: %d %s, want the API's 404", got, body)
	}
	if got, _ := send(t, "GET", "http://"+addr+"/v1/executions/nope/events?session="+strings.Repeat("x", 43), "", "", sse); got != http.StatusUnauthorized {
		t.Fatalf("an event stream with a made-up ?session=: %d, want 401", got)
	}

	// The session survives no restart; the token does.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.API.TCP = addr
	if d, err = Start(context.Background(), cfg, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	if d.Token() != token {
		t.Error("the token changed across a restart")
	}
	if got, _ := send(t, "GET", "http://"+addr+"/v1/workspace/sessions", "", session, nil); got != http.StatusUnauthorized {
		t.Errorf("a session from before the restart: %d, want 401", got)
	}
}
