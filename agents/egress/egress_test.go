package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/agents/stream"
)

// world is a proxy on loopback whose names resolve through a fake
// resolver to documentation addresses (203.0.113.0/24, which the checks
// let through), and whose dials to those addresses reach local test
// servers. The address checks themselves are the real ones: a name that
// resolves to loopback is refused before any dial.
type world struct {
	t      *testing.T
	proxy  *Proxy
	addr   string // the proxy's listener
	names  map[string][]netip.Addr
	routes map[string]string // "ip:port" -> local listener

	mu     sync.Mutex
	dialed []string
	events []stream.Event
	evc    chan stream.Event
}

func newWorld(t *testing.T) *world {
	t.Helper()
	before := runtime.NumGoroutine()
	w := &world{t: t, names: map[string][]netip.Addr{}, routes: map[string]string{}, evc: make(chan stream.Event, 100)}
	w.proxy = New(Config{
		OnEvent: func(ev stream.Event) {
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
			w.evc <- ev
		},
		LookupIP: func(ctx context.Context, host string) ([]netip.Addr, error) {
			if ips, ok := w.names[host]; ok {
				return ips, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			w.mu.Lock()
			w.dialed = append(w.dialed, addr)
			to, ok := w.routes[addr]
			w.mu.Unlock()
			if !ok {
				return nil, errors.New("connection refused (no test route)")
			}
			return (&net.Dialer{}).DialContext(ctx, network, to)
		},
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: w.proxy}
	go srv.Serve(ln)
	w.addr = ln.Addr().String()
	t.Cleanup(func() {
		srv.Close()
		w.proxy.Close()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines after the proxy closed, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	})
	return w
}

// host makes name resolve to ip and ip:port lead to a test server.
func (w *world) host(name, ip string, port int, server string) {
	a := netip.MustParseAddr(ip)
	w.names[name] = append(w.names[name], a)
	if server != "" {
		w.routes[netip.AddrPortFrom(a, uint16(port)).String()] = server
	}
}

// client is an HTTP client using the proxy with token.
func (w *world) client(token string, roots *x509.CertPool) *http.Client {
	u := &url.URL{Scheme: "http", Host: w.addr}
	if token != "" {
		u.User = url.UserPassword("exec", token)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: roots}}
	w.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// event waits for the next network event.
func (w *world) event() NetworkPayload {
	w.t.Helper()
	select {
	case ev := <-w.evc:
		if ev.Type != stream.Network || ev.Session != "s1" || ev.Execution != "e1" {
			w.t.Errorf("event %s for %s/%s, want network for s1/e1", ev.Type, ev.Session, ev.Execution)
		}
		var p NetworkPayload
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			w.t.Fatal(err)
		}
		return p
	case <-time.After(5 * time.Second):
		w.t.Fatal("no network event")
		return NetworkPayload{}
	}
}

func (w *world) noEvent() {
	w.t.Helper()
	select {
	case ev := <-w.evc:
		w.t.Errorf("unexpected event %s %s", ev.Type, ev.Payload)
	case <-time.After(50 * time.Millisecond):
	}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPlainHTTP: an absolute-URI request to a listed name is forwarded
// without the proxy's credentials, and reported with its body sizes.
func TestPlainHTTP(t *testing.T) {
	w := newWorld(t)
	var seen http.Header
	up := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		body, _ := io.ReadAll(r.Body)
		io.WriteString(rw, "hello "+r.Host+r.URL.Path+" "+string(body))
	}))
	defer up.Close()
	w.host("allowed.test", "203.0.113.10", 80, up.Listener.Addr().String())
	token := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{"allowed.test"}})
	c := w.client(token, nil)
	resp, err := c.Post("http://Allowed.TEST/path", "text/plain", strings.NewReader("ping"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello Allowed.TEST/path ping" {
		t.Errorf("POST http://Allowed.TEST/path = %d %q", resp.StatusCode, body)
	}
	if seen.Get("Proxy-Authorization") != "" || seen.Get("Proxy-Connection") != "" {
		t.Errorf("upstream saw the proxy's headers: %v", seen)
	}
	ev := w.event()
	want := NetworkPayload{Host: "allowed.test", Port: 80, Method: "POST", Allowed: true, Rule: "allowed.test",
		Reason: "listed as allowed.test", Status: 200, BytesUp: 4, BytesDown: int64(len(body))}
	ev.DurationMS = 0
	if ev != want {
		t.Errorf("event = %+v, want %+v", ev, want)
	}
}

// TestConnectTLS: a CONNECT tunnel to a wildcard-listed name carries TLS
// end to end (the client verifies the upstream's own certificate), and
// its event counts the bytes each way once it closes.
func TestConnectTLS(t *testing.T) {
	w := newWorld(t)
	up := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, "secret "+r.Host)
	}))
	defer up.Close()
	w.host("api.example.com", "203.0.113.20", 443, up.Listener.Addr().String())
	token := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{"*.example.com"}})
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	c := w.client(token, roots)
	if code, body := get(t, c, "https://api.example.com/x"); code != 200 || body != "secret api.example.com" {
		t.Errorf("GET https://api.example.com/x = %d %q", code, body)
	}
	c.CloseIdleConnections()
	ev := w.event()
	if ev.Method != "CONNECT" || ev.Host != "api.example.com" || ev.Port != 443 || !ev.Allowed || ev.Rule != "*.example.com" ||
		ev.Status != 200 || ev.BytesUp < 100 || ev.BytesDown < 500 {
		t.Errorf("event = %+v, want an allowed CONNECT with the TLS handshake's bytes both ways", ev)
	}
	// The apex is not a subdomain.
	if code, _ := get(t, c, "https://example.com/"); code != 0 {
		t.Errorf("GET https://example.com/ with only *.example.com listed: status %d, want the CONNECT refused", code)
	}
	if ev := w.event(); ev.Allowed || ev.Status != 403 || ev.Host != "example.com" {
		t.Errorf("event = %+v, want example.com refused", ev)
	}
}

// rawConnect sends a CONNECT with auth (if not empty) and returns the
// response.
func rawConnect(t *testing.T, proxy, target, auth string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	io.WriteString(conn, req+"\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, conn, br
}

func basic(user, token string) string { return "Basic " + b64(user+":"+token) }

// TestAuth: without a registered token, 407 asking for Basic
// credentials, and nothing is reported or dialed.
func TestAuth(t *testing.T) {
	w := newWorld(t)
	w.host("allowed.test", "203.0.113.10", 443, "")
	token := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{"allowed.test"}})
	w.proxy.Unregister(token)
	token2 := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{"allowed.test"}})
	for _, tc := range []struct{ name, auth string }{
		{"none", ""},
		{"unknown token", "Basic " + b64("exec:egress-nope")},
		{"unregistered token", "Basic " + b64("exec:"+token)},
		{"bearer", "Bearer " + token2},
		{"no password", "Basic " + b64(token2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _, _ := rawConnect(t, w.addr, "allowed.test:443", tc.auth)
			if resp.StatusCode != 407 || !strings.HasPrefix(resp.Header.Get("Proxy-Authenticate"), "Basic") {
				t.Errorf("CONNECT with %q = %d (Proxy-Authenticate %q), want 407 asking for Basic", tc.auth, resp.StatusCode, resp.Header.Get("Proxy-Authenticate"))
			}
		})
	}
	if code, _ := get(t, w.client("", nil), "http://allowed.test/"); code != 407 {
		t.Errorf("GET without credentials = %d, want 407", code)
	}
	w.noEvent()
	if len(w.dialed) != 0 {
		t.Errorf("dialed %v without a valid token", w.dialed)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestRefusals: unlisted names, unlisted ports, IP literals, localhost,
// and listed names that resolve to the host's own or private addresses
// (DNS rebinding) are answered 403 with a body that names the host and
// points at the network list; nothing refused is ever dialed.
func TestRefusals(t *testing.T) {
	w := newWorld(t)
	w.host("denied.test", "203.0.113.11", 80, "")
	w.host("rebind.test", "127.0.0.1", 80, "")
	w.host("mixed.test", "203.0.113.12", 80, "")
	w.host("mixed.test", "10.1.2.3", 80, "")
	w.host("meta.test", "169.254.169.254", 80, "")
	w.host("cgnat.test", "100.100.100.100", 80, "")
	w.host("v6local.test", "::1", 80, "")
	w.host("mapped.test", "::ffff:192.168.1.1", 80, "")
	token := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{
		"allowed.test", "rebind.test", "mixed.test", "meta.test", "cgnat.test", "v6local.test", "mapped.test", "localhost", "10.0.0.1", "127.0.0.1"}})
	c := w.client(token, nil)
	for _, tc := range []struct{ url, host, reason string }{
		{"http://denied.test/", "denied.test:80", "denied.test is not in the agent's network list"},
		{"http://allowed.test:8080/", "allowed.test:8080", "port 8080 of allowed.test is not in the agent's network list"},
		{"http://sub.allowed.test/", "sub.allowed.test:80", "not in the agent's network list"},
		{"http://203.0.113.11/", "203.0.113.11:80", "the IP address 203.0.113.11 is not in the agent's network list"},
		{"http://localhost/", "localhost:80", "the host itself"},
		{"http://rebind.test/", "rebind.test:80", "resolves to 127.0.0.1, a loopback address"},
		{"http://mixed.test/", "mixed.test:80", "resolves to 10.1.2.3, a private address"},
		{"http://meta.test/", "meta.test:80", "a link-local address"},
		{"http://cgnat.test/", "cgnat.test:80", "a reserved address"},
		{"http://v6local.test/", "v6local.test:80", "a loopback address"},
		{"http://mapped.test/", "mapped.test:80", "a private address"},
		{"http://10.0.0.1/", "10.0.0.1:80", "10.0.0.1 is a private address"},
		{"http://127.0.0.1/", "127.0.0.1:80", "a loopback address"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			code, body := get(t, c, tc.url)
			if code != 403 || !strings.Contains(body, tc.host+" refused") || !strings.Contains(body, tc.reason) || !strings.Contains(body, "`network` list") {
				t.Errorf("GET %s = %d %q, want 403 naming %s, saying %q and pointing at the network list", tc.url, code, body, tc.host, tc.reason)
			}
			if ev := w.event(); ev.Allowed || ev.Status != 403 || !strings.Contains(ev.Reason, tc.reason) || ev.Method != "GET" {
				t.Errorf("event = %+v, want a refused GET saying %q", ev, tc.reason)
			}
			// The same through CONNECT.
			target := strings.TrimSuffix(strings.TrimPrefix(tc.url, "http://"), "/")
			if !strings.Contains(target, ":") {
				target += ":443"
			}
			resp, _, _ := rawConnect(t, w.addr, target, basic("exec", token))
			body2, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 403 || !strings.Contains(string(body2), tc.reason) {
				t.Errorf("CONNECT %s = %d %q, want 403 saying %q", target, resp.StatusCode, body2, tc.reason)
			}
			if ev := w.event(); ev.Allowed || ev.Method != "CONNECT" {
				t.Errorf("event = %+v, want a refused CONNECT", ev)
			}
		})
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.dialed) != 0 {
		t.Errorf("dialed %v: refused requests must never reach a dial", w.dialed)
	}
}

// TestUpstreamDown: an allowed name whose server is not there is 502,
// reported as allowed with the error.
func TestUpstreamDown(t *testing.T) {
	w := newWorld(t)
	w.host("down.test", "203.0.113.30", 80, "")
	token := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{"down.test", "nxdomain.test"}})
	c := w.client(token, nil)
	for _, host := range []string{"down.test", "nxdomain.test"} {
		if code, body := get(t, c, "http://"+host+"/"); code != 502 || !strings.Contains(body, "could not be reached") {
			t.Errorf("GET http://%s/ = %d %q, want 502", host, code, body)
		}
		if ev := w.event(); !ev.Allowed || ev.Status != 502 || ev.Error == "" {
			t.Errorf("event = %+v, want allowed, 502, with the error", ev)
		}
		resp, _, _ := rawConnect(t, w.addr, host+":443", basic("exec", token))
		if resp.StatusCode != 502 {
			t.Errorf("CONNECT %s:443 = %d, want 502", host, resp.StatusCode)
		}
		if ev := w.event(); !ev.Allowed || ev.Status != 502 {
			t.Errorf("event = %+v, want allowed, 502", ev)
		}
	}
}

// TestUnregisterCutsTunnels: revoking a token ends its open tunnels, and
// their event is written with what went through.
func TestUnregisterCutsTunnels(t *testing.T) {
	w := newWorld(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an echo server that never closes first
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	w.host("echo.test", "203.0.113.40", 7000, ln.Addr().String())
	token := w.proxy.Register(Execution{Session: "s1", ID: "e1", Allow: []string{"echo.test:7000"}})
	resp, conn, br := rawConnect(t, w.addr, "echo.test:7000", basic("exec", token))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT echo.test:7000 = %d", resp.StatusCode)
	}
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); line != "ping\n" {
		t.Fatalf("through the tunnel: %q, %v", line, err)
	}
	w.proxy.Unregister(token)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("read after Unregister = %v, want EOF", err)
	}
	if ev := w.event(); ev.BytesUp != 5 || ev.BytesDown != 5 || !ev.Allowed || ev.Port != 7000 {
		t.Errorf("event = %+v, want 5 bytes each way on port 7000", ev)
	}
}
