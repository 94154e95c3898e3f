package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"hearth/agents/channel"
	"hearth/agents/modeltest"
	"hearth/agents/stream"
)

// channelHarness serves a harness's gateway as the appliance does: on a
// unix socket, through Listener, each machine's requests dialled with
// channel.Dial.
func channelHarness(t *testing.T, turns []modeltest.Turn) (h *harness, sock string) {
	h = newHarness(t, turns)
	sock = filepath.Join(t.TempDir(), "gateway.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h.gw, ConnContext: channel.ConnContext}
	go srv.Serve(channel.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return h, sock
}

// machineClient is an HTTP client whose connections come through the
// channel of one machine.
func machineClient(sock, name string) *http.Client {
	dial := func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }
	d := channel.Dial(dial, name)
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d(ctx) }}}
}

func postVia(t *testing.T, c *http.Client, token string) (int, apiError) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://gateway/v1/messages", strings.NewReader(request(false, hello)))
	req.Header.Set("x-api-key", token)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct{ Error apiError }
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error
}

// TestHostileGatewayTokenFromOtherMachine: execution A's token, leaked
// through its outputs, is spent from machine B. The gateway refuses it
// there (401, nothing reaches the provider, nothing is charged to A) and
// tells A's stream; from A's own machine it still works.
func TestHostileGatewayTokenFromOtherMachine(t *testing.T) {
	h, sock := channelHarness(t, nil)
	victim := &Limits{}
	tokA := h.gw.Register(Execution{Session: "s", ID: "exec-a", Budget: victim, Channel: "exec-a"})
	h.gw.Register(Execution{Session: "s2", ID: "exec-b", Channel: "exec-b"})
	machineA, machineB := machineClient(sock, "exec-a"), machineClient(sock, "exec-b")

	if status, e := postVia(t, machineB, tokA); status != 401 || e.Type != "authentication_error" {
		t.Errorf("A's token from machine B: %d %+v, want 401 authentication_error", status, e)
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Fatalf("the stolen token's call reached the provider (%d requests)", n)
	}
	if usd, turns := victim.Spent(); usd != 0 || turns != 0 {
		t.Errorf("the victim was charged $%v and %d turns", usd, turns)
	}
	errs := h.eventsOf(stream.Error)
	if len(errs) != 1 || errs[0].Execution != "exec-a" || !strings.Contains(string(errs[0].Payload), `another channel (\"exec-b\")`) {
		t.Errorf("error events %+v, want one in A's stream naming the channel it came through", errs)
	}

	if status, e := postVia(t, machineA, tokA); status != 200 {
		t.Errorf("A's token from machine A: %d %+v, want 200", status, e)
	}
	if _, turns := victim.Spent(); turns != 1 {
		t.Errorf("A's own call charged %d turns, want 1", turns)
	}
}

// TestChannelPreambleRequired: a connection to the gateway's listener
// that does not start by naming its channel is dropped unanswered, and
// one whose channel the guest tries to rename keeps its first name.
func TestChannelPreambleRequired(t *testing.T) {
	h, sock := channelHarness(t, nil)
	tokA := h.gw.Register(Execution{Session: "s", ID: "exec-a", Channel: "exec-a"})
	raw := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	req, _ := http.NewRequest("POST", "http://gateway/v1/messages", strings.NewReader(request(false, hello)))
	req.Header.Set("x-api-key", tokA)
	if resp, err := raw.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("a connection without a preamble was answered %d", resp.StatusCode)
	}

	// Machine B's guest sends a preamble of its own after the host's.
	c, err := channel.Dial(func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }, "exec-b")(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := request(false, hello)
	io.WriteString(c, "hearth-channel exec-a\nPOST /v1/messages HTTP/1.1\r\nHost: g\r\nanthropic-version: 2023-06-01\r\nContent-Type: application/json\r\nx-api-key: "+tokA+"\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
	b, _ := io.ReadAll(io.LimitReader(c, 4096))
	if strings.HasPrefix(string(b), "HTTP/1.1 200") {
		t.Errorf("a guest-written preamble renamed the channel: %s", b)
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Errorf("%d calls reached the provider", n)
	}
}
