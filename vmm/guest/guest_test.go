package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// pair runs a Server and a Client over a real unix socket pair, the way
// the jail tier connects them.
func pair(t testing.TB, opts ServerOptions) *Client {
	t.Helper()
	return serveOn(t, NewServer(opts))
}

// serveOn connects a new client to srv over a fresh socket pair.
func serveOn(t testing.TB, srv *Server) *Client {
	t.Helper()
	hostEnd, guestEnd := socketPair(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(guestEnd) }()
	c, err := NewClient(hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		guestEnd.Close()
		<-served
	})
	return c
}

func run(t *testing.T, c *Client, req ExecRequest, stdin string) (string, string, ExitStatus) {
	t.Helper()
	var out, errb bytes.Buffer
	var in io.Reader
	if stdin != "" {
		req.Stdin, in = true, strings.NewReader(stdin)
	}
	st, err := c.Exec(context.Background(), req, in, &out, &errb)
	if err != nil {
		t.Fatalf("Exec(%v) = %v", req.Argv, err)
	}
	return out.String(), errb.String(), st
}

func TestExec(t *testing.T) {
	c := pair(t, ServerOptions{})
	tests := []struct {
		name           string
		argv           []string
		stdin          string
		env            map[string]string
		wantOut, wantE string
		want           ExitStatus
	}{
		{"echo", []string{"echo", "hello"}, "", nil, "hello\n", "", ExitStatus{}},
		{"separate streams", []string{"sh", "-c", "echo out1; echo err1 >&2; echo out2"}, "", nil, "out1\nout2\n", "err1\n", ExitStatus{}},
		{"exit code", []string{"sh", "-c", "exit 3"}, "", nil, "", "", ExitStatus{Code: 3}},
		{"signal", []string{"sh", "-c", "kill -KILL $$"}, "", nil, "", "", ExitStatus{Code: -1, Signal: "killed"}},
		{"stdin", []string{"cat"}, "piped in", nil, "piped in", "", ExitStatus{}},
		{"env", []string{"sh", "-c", "echo $GREETING"}, "", map[string]string{"GREETING": "hi"}, "hi\n", "", ExitStatus{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, st := run(t, c, ExecRequest{Argv: tc.argv, Env: tc.env}, tc.stdin)
			if out != tc.wantOut || errOut != tc.wantE || st != tc.want {
				t.Errorf("Exec(%v) = %q, %q, %+v; want %q, %q, %+v", tc.argv, out, errOut, st, tc.wantOut, tc.wantE, tc.want)
			}
		})
	}
	if _, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"/no/such/binary"}}, nil, nil, nil); err == nil {
		t.Errorf("Exec of a missing binary = nil error, want one")
	}
}

// timedWriter records when the first byte arrived.
type timedWriter struct {
	mu    sync.Mutex
	first time.Time
	buf   bytes.Buffer
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() {
		w.first = time.Now()
	}
	return w.buf.Write(p)
}

// TestExecFastOutput: a process that writes before the agent has sent the
// started frame must not break the stream.
func TestExecFastOutput(t *testing.T) {
	c := pair(t, ServerOptions{})
	for i := 0; i < 200; i++ {
		if out, _, st := run(t, c, ExecRequest{Argv: []string{"echo", "fast"}}, ""); out != "fast\n" || st.Code != 0 {
			t.Fatalf("run %d: echo fast = %q, %+v", i, out, st)
		}
	}
}

func TestExecStreamsWhileRunning(t *testing.T) {
	c := pair(t, ServerOptions{})
	var w timedWriter
	start := time.Now()
	st, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "echo first; sleep 1; echo second"}}, nil, &w, nil)
	if err != nil || st.Code != 0 {
		t.Fatalf("Exec = %+v, %v", st, err)
	}
	if lag := w.first.Sub(start); lag > 700*time.Millisecond {
		t.Errorf("first output arrived %v after start, want it before the process ends (~1s)", lag)
	}
	if w.buf.String() != "first\nsecond\n" {
		t.Errorf("output = %q", w.buf.String())
	}
}

func TestExecTimeoutAndSignal(t *testing.T) {
	c := pair(t, ServerOptions{})
	start := time.Now()
	_, _, st := run(t, c, ExecRequest{Argv: []string{"sleep", "30"}, Timeout: Duration(200 * time.Millisecond)}, "")
	if !st.TimedOut || st.Signal != "killed" || time.Since(start) > 5*time.Second {
		t.Errorf("sleep 30 with a 200ms timeout = %+v after %v, want timed out and killed at once", st, time.Since(start))
	}
	p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"sleep", "30"}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(context.Background(), p.PID, "TERM"); err != nil {
		t.Fatalf("Signal(TERM) = %v", err)
	}
	if st, err := p.Wait(); err != nil || st.Signal != "terminated" {
		t.Errorf("after TERM: %+v, %v; want terminated", st, err)
	}
	if err := c.Signal(context.Background(), 1, "KILL"); err == nil {
		t.Errorf("Signal to a process the agent did not start = nil, want an error")
	}
}

func TestWaitDoesNotHangWhenSessionDies(t *testing.T) {
	c := pair(t, ServerOptions{})
	p, err := c.Start(context.Background(), ExecRequest{Argv: []string{"sleep", "30"}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		c.Close()
	}()
	done := make(chan error, 1)
	go func() { _, err := p.Wait(); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("Wait after the session died = nil error, want one")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait hangs after the session died")
	}
	c.Signal(context.Background(), p.PID, "KILL")
}

func TestFiles(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("no"), 0o600)
	os.Symlink(outside, filepath.Join(root, "escape"))
	c := pair(t, ServerOptions{Roots: []string{root}, MaxFileSize: 1 << 20})
	ctx := context.Background()
	p := filepath.Join(root, "a.txt")
	if n, err := c.Upload(ctx, p, strings.NewReader("content"), 0o640); err != nil || n != 7 {
		t.Fatalf("Upload = %d, %v", n, err)
	}
	var buf bytes.Buffer
	if _, err := c.Download(ctx, p, &buf); err != nil || buf.String() != "content" {
		t.Fatalf("Download = %q, %v", buf.String(), err)
	}
	fi, err := c.Stat(ctx, p)
	if err != nil || fi.Size != 7 || fi.Mode != 0o640 {
		t.Fatalf("Stat = %+v, %v", fi, err)
	}
	list, err := c.List(ctx, root)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %+v, %v; want a.txt and escape", list, err)
	}
	refused := []struct {
		name string
		err  error
		call func() error
	}{
		{"download outside", ErrOutside, func() error { _, err := c.Download(ctx, "/etc/passwd", io.Discard); return err }},
		{"download through symlink", ErrOutside, func() error {
			_, err := c.Download(ctx, filepath.Join(root, "escape/secret"), io.Discard)
			return err
		}},
		{"upload through symlink", ErrOutside, func() error {
			_, err := c.Upload(ctx, filepath.Join(root, "escape/new"), strings.NewReader("x"), 0o644)
			return err
		}},
		{"relative path", ErrOutside, func() error { _, err := c.Stat(ctx, "a.txt"); return err }},
		{"missing", ErrNotFound, func() error { _, err := c.Stat(ctx, filepath.Join(root, "nope")); return err }},
		{"too large", ErrTooLarge, func() error {
			_, err := c.Upload(ctx, filepath.Join(root, "big"), bytes.NewReader(make([]byte, 2<<20)), 0o644)
			return err
		}},
	}
	for _, tc := range refused {
		if err := tc.call(); !errors.Is(err, tc.err) {
			t.Errorf("%s = %v, want %v", tc.name, err, tc.err)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Errorf("an upload through a symlink wrote outside the root")
	}
	if _, err := os.Stat(filepath.Join(root, "big")); err == nil {
		t.Errorf("a refused upload left a file behind")
	}
}

// echoService is a host service for forwards: it dials an echo server on
// the host's loopback, which the test's end closes.
func echoService(t *testing.T) func(context.Context) (net.Conn, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(conn, conn); conn.Close() }()
		}
	}()
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
}

func TestForward(t *testing.T) {
	c := pair(t, ServerOptions{})
	c.Serve("echo", echoService(t))
	addr, err := c.Forward(context.Background(), "127.0.0.1:0", "echo")
	if err != nil {
		t.Fatalf("Forward = %v", err)
	}
	for i := 0; i < 3; i++ {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.Repeat("ping ", 1000)
		conn.Write([]byte(msg))
		conn.(*net.TCPConn).CloseWrite()
		got, _ := io.ReadAll(conn)
		conn.Close()
		if string(got) != msg {
			t.Errorf("through the forward: got %d bytes, want %d", len(got), len(msg))
		}
	}
	if _, err := c.Forward(context.Background(), "0.0.0.0:0", "echo"); err == nil {
		t.Errorf("Forward on a non-loopback address = nil error, want one")
	}
	if _, err := c.Forward(context.Background(), "127.0.0.1:0", "unregistered"); err == nil {
		t.Errorf("Forward to an unregistered service = nil error, want one")
	}
}

// forwardedThenGone starts a guest server whose host forwards a port to
// an echo service and then goes away (a daemon restarting); it returns
// the server, the service for the next host to serve, and the port.
func forwardedThenGone(t *testing.T) (*Server, func(context.Context) (net.Conn, error), string) {
	t.Helper()
	echo := echoService(t)
	srv := NewServer(ServerOptions{})
	first := serveOn(t, srv)
	first.Serve("echo", echo)
	addr, err := first.Forward(context.Background(), "127.0.0.1:0", "echo")
	if err != nil {
		t.Fatalf("Forward = %v", err)
	}
	first.Close()
	return srv, echo, addr
}

// TestForwardOutlivesItsHost: a forwarded port stays open while its host
// is away (a daemon restarting, its agents left running), a connection
// made meanwhile waits for the next host that asks for the same forward
// and reaches its service, and the port is not taken from a connected
// host for another service. Before, the port closed with the session,
// and an agent CLI's MCP client, reconnecting at once, was refused until
// it gave the server up (TestAgentsInsideAfterReattach under load).
func TestForwardOutlivesItsHost(t *testing.T) {
	srv, echo, addr := forwardedThenGone(t)

	// A client inside connects while no host is there.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("connect to the forwarded port while its host is away: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte("still there?")); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	time.Sleep(100 * time.Millisecond) // it waits

	second := serveOn(t, srv)
	second.Serve("echo", echo)
	second.Serve("other", echo)
	if got, err := second.Forward(context.Background(), addr, "echo"); err != nil || got != addr {
		t.Fatalf("the next host's Forward(%s) = %q, %v; want the same port", addr, got, err)
	}
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "still there?" {
		t.Fatalf("through the forward kept for the next host: %q, %v", got, err)
	}
	if _, err := second.Forward(context.Background(), addr, "other"); err == nil {
		t.Errorf("Forward(%s) to another service while its host is connected = nil error, want a conflict", addr)
	}
}

// TestForwardWaitersCapped: while no host is there, a process inside
// that opens connections to a forwarded port in a loop gets forwardWaiting
// of them waiting and the rest closed at once, and those that waited still
// reach their service when the next host comes.
func TestForwardWaitersCapped(t *testing.T) {
	srv, echo, addr := forwardedThenGone(t)

	const extra = 10
	conns := make([]net.Conn, forwardWaiting+extra)
	for i := range conns {
		conns[i] = dial(t, addr)
	}
	// A closed connection reads EOF at once; a waiting one times out.
	closed := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := c.Read(make([]byte, 1))
			closed[i] = err == io.EOF
		}()
	}
	wg.Wait()
	var waiting []net.Conn
	for i, c := range conns {
		if !closed[i] {
			waiting = append(waiting, c)
		}
	}
	if len(waiting) != forwardWaiting {
		t.Fatalf("%d of %d connections wait for a host, want %d (the rest closed)", len(waiting), len(conns), forwardWaiting)
	}

	c := waiting[len(waiting)-1]
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("waited")); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	second := serveOn(t, srv)
	second.Serve("echo", echo)
	if _, err := second.Forward(context.Background(), addr, "echo"); err != nil {
		t.Fatalf("the next host's Forward(%s) = %v", addr, err)
	}
	if got, err := io.ReadAll(c); err != nil || string(got) != "waited" {
		t.Fatalf("a connection that waited, through the next host: %q, %v", got, err)
	}
}

func TestHealth(t *testing.T) {
	c := pair(t, ServerOptions{})
	h, err := c.Health(context.Background())
	if err != nil || h.MemTotal == 0 || h.Processes == 0 || h.AgentPID != os.Getpid() {
		t.Fatalf("Health = %+v, %v", h, err)
	}
}

// countingEcho is echoService that also counts the connections open to
// it now.
func countingEcho(t *testing.T) (func(context.Context) (net.Conn, error), *atomic.Int32) {
	echo := echoService(t)
	var open atomic.Int32
	return func(ctx context.Context) (net.Conn, error) {
		c, err := echo(ctx)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		return &countedConn{Conn: c, open: &open}, nil
	}, &open
}

type countedConn struct {
	net.Conn
	open *atomic.Int32
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// dial connects to addr, closing the connection when t ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// echoes reports whether conn (a connection or a stream) echoes a byte
// within wait.
func echoes(conn interface {
	io.ReadWriter
	SetDeadline(time.Time) error
}, wait time.Duration) bool {
	conn.SetDeadline(time.Now().Add(wait))
	defer conn.SetDeadline(time.Time{})
	if _, err := conn.Write([]byte("x")); err != nil {
		return false
	}
	b := make([]byte, 1)
	_, err := io.ReadFull(conn, b)
	return err == nil && b[0] == 'x'
}

// TestForwardStreamsCapped: a process inside that opens connections to a
// forwarded port in a loop gets maxForwardStreams of them served at once;
// the next one waits (it is not refused) and is served when one of those
// ends.
func TestForwardStreamsCapped(t *testing.T) {
	c := pair(t, ServerOptions{})
	svc, open := countingEcho(t)
	c.Serve("echo", svc)
	addr, err := c.Forward(context.Background(), "127.0.0.1:0", "echo")
	if err != nil {
		t.Fatalf("Forward = %v", err)
	}
	conns := make([]net.Conn, maxForwardStreams+1)
	for i := range conns {
		conns[i] = dial(t, addr)
		if i < maxForwardStreams && !echoes(conns[i], 20*time.Second) {
			t.Fatalf("connection %d of %d is not served", i+1, maxForwardStreams)
		}
	}
	last := conns[maxForwardStreams]
	if echoes(last, 500*time.Millisecond) {
		t.Fatalf("connection %d was served with %d open: the cap is not kept", maxForwardStreams+1, maxForwardStreams)
	}
	if n := open.Load(); n != maxForwardStreams {
		t.Fatalf("%d connections open at the service, want %d", n, maxForwardStreams)
	}
	conns[0].Close()
	// The byte it sent while it waited comes back once it is served.
	last.SetDeadline(time.Now().Add(20 * time.Second))
	b := make([]byte, 1)
	if _, err := io.ReadFull(last, b); err != nil || b[0] != 'x' {
		t.Fatalf("the waiting connection, once another ended: %q, %v", b, err)
	}
	// Ended from the inside, as their processes would: a session closed
	// with hundreds of streams open takes the race detector most of a
	// minute (5 ms without it).
	for _, conn := range conns {
		conn.Close()
	}
	waitServiceIdle(t, open)
}

// TestHostileGuestForwardFlood: a machine that speaks the protocol itself
// and opens forwarded streams without waiting for the host to take them
// (a hostile agent that took over its end of the channel) gets
// maxForwardStreams served, forwardBacklog held, and every other one
// reset at once, however many it opens: the host's descriptors and
// buffers stay bounded.
func TestHostileGuestForwardFlood(t *testing.T) {
	hostEnd, guestEnd := socketPair(t)
	c, err := NewClient(hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	svc, open := countingEcho(t)
	c.Serve("echo", svc)
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.AcceptBacklog, cfg.StreamOpenTimeout = 4096, 0 // it does not wait
	guest, err := yamux.Server(guestEnd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	hdr, _ := json.Marshal(Forward{Name: "echo"})
	// stream opens a forwarded stream; one reset already fails its
	// header's write.
	stream := func() (*yamux.Stream, error) {
		st, err := guest.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.Write(append(hdr, '\n'))
		return st, err
	}
	served := make([]*yamux.Stream, maxForwardStreams)
	for i := range served {
		served[i], err = stream()
		if err != nil || !echoes(served[i], 20*time.Second) {
			t.Fatalf("stream %d of %d is not served", i, maxForwardStreams)
		}
	}
	const extra = 200
	var held, reset int
	var mu sync.Mutex
	var wg sync.WaitGroup
	var flood []*yamux.Stream
	for range forwardBacklog + extra {
		st, err := stream()
		flood = append(flood, st)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err == nil {
				st.SetReadDeadline(time.Now().Add(2 * time.Second))
				_, err = st.Read(make([]byte, 1))
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, yamux.ErrConnectionReset):
				reset++
			case errors.Is(err, yamux.ErrTimeout):
				held++
			default:
				t.Errorf("a stream beyond the cap read %v", err)
			}
		}()
	}
	wg.Wait()
	if held != forwardBacklog || reset != extra {
		t.Fatalf("beyond the %d served: %d streams held and %d reset, want %d and %d", maxForwardStreams, held, reset, forwardBacklog, extra)
	}
	if n := open.Load(); n != maxForwardStreams {
		t.Fatalf("%d connections open at the service, want %d", n, maxForwardStreams)
	}
	// Ended from the guest, as in TestForwardStreamsCapped; the held
	// ones are served as slots free, and end too.
	for _, st := range append(served, flood...) {
		st.Close()
	}
	waitServiceIdle(t, open)
}

// waitServiceIdle waits until no connection is open at the service whose
// count open is, for at most 20 s after the test closed its ends.
func waitServiceIdle(t *testing.T, open *atomic.Int32) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); open.Load() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open at the service 20s after theirs closed", open.Load())
		}
	}
}
