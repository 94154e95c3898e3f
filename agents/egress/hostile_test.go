package egress

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"hearth/agents/channel"
)

// TestHostileEgressTokenFromOtherMachine: execution A's egress token,
// leaked through its outputs (which every session reads), is used by
// another machine through that machine's own channel. The proxy must
// refuse it (407) and reach nothing; through A's channel it still works.
func TestHostileEgressTokenFromOtherMachine(t *testing.T) {
	w := newWorld(t)
	up := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, "reached") }))
	defer up.Close()
	w.host("allowed.test", "203.0.113.10", 80, up.Listener.Addr().String())
	token := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{"allowed.test"}, Channel: "exec-a"})

	// The proxy served as the appliance serves it: on a unix socket whose
	// connections name the machine channel they come through.
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: w.proxy, ConnContext: channel.ConnContext}
	go srv.Serve(channel.Listener(ln))
	defer srv.Close()
	through := func(name string) *http.Client {
		dial := channel.Dial(func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}, name)
		tr := &http.Transport{
			Proxy:       http.ProxyURL(&url.URL{Scheme: "http", Host: "egress", User: url.UserPassword("exec", token)}),
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}

	if code, body := get(t, through("exec-b"), "http://allowed.test/"); code != http.StatusProxyAuthRequired {
		t.Errorf("A's token through machine B's channel = %d %q, want 407", code, body)
	}
	w.mu.Lock()
	dialed := len(w.dialed)
	w.mu.Unlock()
	if dialed != 0 {
		t.Errorf("the proxy dialled %d upstreams for a stolen token, want none", dialed)
	}
	if code, body := get(t, through("exec-a"), "http://allowed.test/"); code != 200 || body != "reached" {
		t.Errorf("A's token through A's channel = %d %q, want 200 reached", code, body)
	}
	w.event()
}
