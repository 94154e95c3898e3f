package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Dialer connects a forwarded connection to a host service.
type Dialer func(ctx context.Context) (net.Conn, error)

// Client is the host's side: it talks to one machine's agent.
type Client struct {
	sess     *yamux.Session
	hc       *http.Client
	mu       sync.Mutex
	services map[string]Dialer
	wg       sync.WaitGroup
	closed   chan struct{}
	once     sync.Once
}

// NewClient starts the protocol on conn, the machine's host channel.
func NewClient(conn io.ReadWriteCloser) (*Client, error) {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	// No keepalive from the host: a paused machine cannot answer a ping,
	// and yamux ends a session whose ping goes unanswered for 10 s, so
	// every sandbox paused for more than 40 s lost its agent session
	// (TestSandboxLongPause). The host learns that a machine is gone
	// from its process (the jail's agent, QEMU), not from pings.
	cfg.EnableKeepAlive = false
	// Streams the machine opens and the host has not taken yet (see
	// acceptForwards); more are reset at once.
	cfg.AcceptBacklog = forwardBacklog
	sess, err := yamux.Client(conn, cfg)
	if err != nil {
		return nil, err
	}
	c := &Client{sess: sess, services: map[string]Dialer{}, closed: make(chan struct{})}
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return openStream(sess) },
		DisableCompression: true,
		MaxIdleConns:       16,
	}
	c.hc = &http.Client{Transport: tr}
	c.wg.Add(1)
	go c.acceptForwards()
	return c, nil
}

// streamConn is a yamux stream whose Close also ends a Read in progress.
// A yamux Close is only a half-close: a Read waits on for the agent's
// bytes, so when a call's context ended (http.Transport closes the
// connection then) a reader would wait for as long as the agent keeps the
// stream open: forever for a hostile agent, or while a process left in the
// background holds its output open (TestHostileGuestNeverAnswers).
type streamConn struct{ *yamux.Stream }

func openStream(sess *yamux.Session) (net.Conn, error) {
	st, err := sess.OpenStream()
	if err != nil {
		return nil, err
	}
	return streamConn{st}, nil
}

// Close half-closes the stream (the agent sees the end and stops the
// call's process) and fails any Read, now or later.
func (s streamConn) Close() error {
	s.Stream.SetReadDeadline(time.Now())
	return s.Stream.Close()
}

// Open starts a session over conn, the byte stream to a machine's agent,
// and returns its client once the agent has answered a health check
// within timeout. On failure conn is closed.
func Open(ctx context.Context, conn io.ReadWriteCloser, timeout time.Duration) (*Client, error) {
	gc, err := NewClient(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := gc.Health(hctx); err != nil {
		gc.Close()
		return nil, err
	}
	return gc, nil
}

// Close ends the session; calls in flight fail. Idempotent.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		close(c.closed)
		err = c.sess.Close()
		c.hc.CloseIdleConnections()
		c.wg.Wait()
	})
	return err
}

// Done is closed when the session with the agent ends.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

func (c *Client) url(path string, q url.Values) string {
	u := "http://guest" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q), body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("guest %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if err := responseError(resp); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func responseError(resp *http.Response) error {
	if resp.StatusCode < 300 {
		return nil
	}
	var e Error
	if json.NewDecoder(resp.Body).Decode(&e) != nil {
		return fmt.Errorf("guest: HTTP %d", resp.StatusCode)
	}
	switch e.Code {
	case "not_found":
		return fmt.Errorf("%w: %s", ErrNotFound, e.Message)
	case "too_large":
		return fmt.Errorf("%w: %s", ErrTooLarge, e.Message)
	case "outside":
		return fmt.Errorf("%w: %s", ErrOutside, e.Message)
	case "not_supported":
		return fmt.Errorf("%w: %s", ErrNotSupported, e.Message)
	}
	return &e
}

// Health asks the agent about the machine.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	return h, c.do(ctx, "GET", "/v1/health", nil, nil, &h)
}

// Process is a running exec.
type Process struct {
	PID  int
	ctx  context.Context // the Start call's (nil: none); when it ends, so does Wait
	resp *http.Response
	out  io.Writer
	errw io.Writer
}

// Start starts a process; its output goes to stdout and stderr as it is
// produced, once Wait runs. stdin (may be nil) is copied to the process
// when req.Stdin is set.
func (c *Client) Start(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*Process, error) {
	line, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	// Without stdin the body is the line alone, of a length known: sent
	// with the request's headers, with no chunks and no probe of the
	// body (net/http reads a body of unknown length ahead, on a goroutine
	// and a timer of its own).
	var body io.Reader = bytes.NewReader(append(line, '\n'))
	if req.Stdin && stdin != nil {
		body = io.MultiReader(body, stdin)
	}
	hreq, err := http.NewRequestWithContext(ctx, "POST", c.url("/v1/exec", nil), body)
	if err != nil {
		return nil, err
	}
	hreq.Close = true // each exec has its own stream, never reused
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("guest exec %s: %w", req.Argv[0], err)
	}
	if err := responseError(resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	p, err := startedProcess(resp, stdout, stderr)
	if err != nil {
		return nil, fmt.Errorf("guest exec %s: %w", req.Argv[0], err)
	}
	p.ctx = ctx
	return p, nil
}

// startedProcess reads the first frame of an exec response: the process
// started (its pid) or never did (its exit status says why). The body is
// closed unless a Process is returned.
func startedProcess(resp *http.Response, stdout, stderr io.Writer) (*Process, error) {
	kind, payload, err := readFrame(resp.Body)
	if err != nil {
		resp.Body.Close()
		return nil, err
	}
	switch kind {
	case FrameStarted:
		pid, err := strconv.Atoi(string(payload))
		if err != nil || pid <= 0 {
			resp.Body.Close()
			return nil, fmt.Errorf("guest protocol: started frame with pid %q", payload)
		}
		return &Process{PID: pid, resp: resp, out: stdout, errw: stderr}, nil
	case FrameExit: // it never started
		resp.Body.Close()
		var st ExitStatus
		if err := json.Unmarshal(payload, &st); err != nil {
			return nil, fmt.Errorf("guest protocol: exit frame: %w", err)
		}
		if st.Error == "" {
			return nil, errors.New("the process never started and the agent gave no reason")
		}
		return nil, errors.New(st.Error)
	}
	resp.Body.Close()
	return nil, fmt.Errorf("guest protocol: unexpected frame %d", kind)
}

// Wait copies output until the process ends and returns how it ended. If
// the session breaks first it says so instead of hanging.
func (p *Process) Wait() (ExitStatus, error) {
	defer p.resp.Body.Close()
	for {
		kind, payload, err := readFrame(p.resp.Body)
		if err != nil {
			if p.ctx != nil && p.ctx.Err() != nil {
				err = p.ctx.Err() // the stream was cut because the call's context ended
			}
			return ExitStatus{Code: -1}, fmt.Errorf("guest exec pid %d: output ended without an exit status: %w", p.PID, err)
		}
		switch kind {
		case FrameStdout:
			if p.out != nil {
				p.out.Write(payload)
			}
		case FrameStderr:
			if p.errw != nil {
				p.errw.Write(payload)
			}
		case FrameExit:
			var st ExitStatus
			if err := json.Unmarshal(payload, &st); err != nil {
				return ExitStatus{Code: -1}, err
			}
			return st, nil
		}
	}
}

// Exec runs a process to the end.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (ExitStatus, error) {
	p, err := c.Start(ctx, req, stdin, stdout, stderr)
	if err != nil {
		return ExitStatus{Code: -1}, err
	}
	return p.Wait()
}

// Signal sends sig ("TERM", "KILL", ...) to the process group of pid.
func (c *Client) Signal(ctx context.Context, pid int, sig string) error {
	return c.do(ctx, "POST", fmt.Sprintf("/v1/signal/%d/%s", pid, url.PathEscape(sig)), nil, nil, nil)
}

// Upload writes r to path in the machine (atomically) with mode, owned
// by the machine's default user.
func (c *Client) Upload(ctx context.Context, path string, r io.Reader, mode uint32) (int64, error) {
	return c.upload(ctx, path, r, url.Values{"mode": {strconv.FormatUint(uint64(mode), 8)}})
}

// UploadAs is Upload with the file owned by uid:gid instead of the
// machine's default user.
func (c *Client) UploadAs(ctx context.Context, path string, r io.Reader, mode, uid, gid uint32) (int64, error) {
	return c.upload(ctx, path, r, url.Values{"mode": {strconv.FormatUint(uint64(mode), 8)},
		"uid": {strconv.FormatUint(uint64(uid), 10)}, "gid": {strconv.FormatUint(uint64(gid), 10)}})
}

func (c *Client) upload(ctx context.Context, path string, r io.Reader, q url.Values) (int64, error) {
	var out struct{ Size int64 }
	q.Set("path", path)
	return out.Size, c.do(ctx, "PUT", "/v1/files/content", q, r, &out)
}

// Download copies the file at path in the machine to w.
func (c *Client) Download(ctx context.Context, path string, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.url("/v1/files/content", url.Values{"path": {path}}), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("guest download %s: %w", path, err)
	}
	defer resp.Body.Close()
	if err := responseError(resp); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("guest download %s: got %d of %d bytes", path, n, resp.ContentLength)
	}
	return n, err
}

// Stat describes the file at path in the machine.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	return fi, c.do(ctx, "GET", "/v1/files/stat", url.Values{"path": {path}}, nil, &fi)
}

// List lists the directory at path in the machine.
func (c *Client) List(ctx context.Context, path string) ([]FileInfo, error) {
	var out []FileInfo
	return out, c.do(ctx, "GET", "/v1/files/list", url.Values{"path": {path}}, nil, &out)
}

// Forward makes the agent listen on listen (a loopback address inside the
// machine) and carries each connection to the host service name, which
// must have been registered with Serve.
func (c *Client) Forward(ctx context.Context, listen, name string) (string, error) {
	c.mu.Lock()
	_, ok := c.services[name]
	c.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("forward %s: no host service %q registered", listen, name)
	}
	body, _ := json.Marshal(map[string]string{"listen": listen, "name": name})
	var out struct{ Listen string }
	return out.Listen, c.do(ctx, "POST", "/v1/forward", nil, bytes.NewReader(body), &out)
}

// Serve registers the host service that forwarded connections named name
// are connected to.
func (c *Client) Serve(name string, dial Dialer) {
	c.mu.Lock()
	c.services[name] = dial
	c.mu.Unlock()
}

// maxForwardStreams bounds the forwarded connections of one machine that
// the host serves at once, and forwardBacklog those it holds waiting for
// one of them to end. Each served one is a descriptor and goroutines here
// and at its service, and each stream up to a 256 KiB window of data the
// machine sent: a process inside that opened connections in a loop would
// otherwise spend the daemon's descriptors and memory, and with them every
// other machine's services and the API. The host takes (acknowledges) a
// stream only when a slot is free; until then it waits in the session's
// backlog, and the machine's end, which keeps no more unacknowledged
// streams than that (the agent's own config), waits to open more. A
// machine that sends more anyway has them reset. Agents' own use (model
// calls, MCP tools, the egress proxy's connections) stays far below.
const (
	maxForwardStreams = 256
	forwardBacklog    = 64
)

// acceptForwards connects each stream the agent opens to its service, at
// most maxForwardStreams at once.
func (c *Client) acceptForwards() {
	defer c.wg.Done()
	slots := make(chan struct{}, maxForwardStreams)
	for {
		select {
		case slots <- struct{}{}:
		case <-c.closed:
			return
		}
		st, err := c.sess.AcceptStream()
		if err != nil {
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() { <-slots }()
			defer st.Close()
			br := bufio.NewReader(io.LimitReader(st, 4096))
			line, err := br.ReadBytes('\n')
			var fw Forward
			if err != nil || json.Unmarshal(line, &fw) != nil {
				return
			}
			c.mu.Lock()
			dial := c.services[fw.Name]
			c.mu.Unlock()
			if dial == nil {
				return
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-c.closed:
				case <-ctx.Done():
				}
				cancel()
			}()
			defer cancel()
			conn, err := dial(ctx)
			if err != nil {
				return
			}
			defer conn.Close()
			if br.Buffered() > 0 { // bytes the agent sent after the header
				buf, _ := br.Peek(br.Buffered())
				conn.Write(buf)
			}
			splice(conn, st)
		}()
	}
}

// StartJob runs req in the background; the job outlives this call and this
// session.
func (c *Client) StartJob(ctx context.Context, req ExecRequest) (JobStatus, error) {
	body, _ := json.Marshal(req)
	var st JobStatus
	return st, c.do(ctx, "POST", "/v1/jobs", nil, bytes.NewReader(body), &st)
}

// Jobs lists every job the agent has started, oldest first.
func (c *Client) Jobs(ctx context.Context) ([]JobStatus, error) {
	var out []JobStatus
	return out, c.do(ctx, "GET", "/v1/jobs", nil, nil, &out)
}

// Job returns one job's status.
func (c *Client) Job(ctx context.Context, id string) (JobStatus, error) {
	var st JobStatus
	return st, c.do(ctx, "GET", "/v1/jobs/"+url.PathEscape(id), nil, nil, &st)
}

// JobOutput returns the output a job kept of stream ("stdout" or
// "stderr"): the newest bytes, up to 1 MiB.
func (c *Client) JobOutput(ctx context.Context, id, stream string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.url("/v1/jobs/"+url.PathEscape(id)+"/output", url.Values{"stream": {stream}}), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("guest job output %s: %w", id, err)
	}
	defer resp.Body.Close()
	if err := responseError(resp); err != nil {
		return nil, err
	}
	return io.ReadAll(resp.Body)
}

// FollowJob copies stream ("stdout" or "stderr") of a job to w from
// offset (counting every byte the job ever wrote) until the job has ended
// and all it wrote is copied, or ctx ends. It returns the offset reached,
// where a later call can go on. An offset older than the newest 1 MiB
// the job keeps is an error.
func (c *Client) FollowJob(ctx context.Context, id, stream string, offset int64, w io.Writer) (int64, error) {
	q := url.Values{"stream": {stream}, "offset": {strconv.FormatInt(offset, 10)}, "follow": {"true"}}
	req, err := http.NewRequestWithContext(ctx, "GET", c.url("/v1/jobs/"+url.PathEscape(id)+"/output", q), nil)
	if err != nil {
		return offset, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return offset, fmt.Errorf("guest job output %s: %w", id, err)
	}
	defer resp.Body.Close()
	if err := responseError(resp); err != nil {
		return offset, err
	}
	n, err := io.Copy(w, resp.Body)
	return offset + n, err
}

// StopJob sends TERM, then KILL after grace, and returns the final status.
func (c *Client) StopJob(ctx context.Context, id string, grace time.Duration) (JobStatus, error) {
	var st JobStatus
	return st, c.do(ctx, "POST", "/v1/jobs/"+url.PathEscape(id)+"/stop", url.Values{"grace": {grace.String()}}, nil, &st)
}

// Resize changes the terminal size of a running PTY exec.
func (c *Client) Resize(ctx context.Context, pid int, rows, cols uint16) error {
	q := url.Values{"rows": {strconv.Itoa(int(rows))}, "cols": {strconv.Itoa(int(cols))}}
	return c.do(ctx, "POST", fmt.Sprintf("/v1/resize/%d", pid), q, nil, nil)
}

// SetClock sets the machine's clock to t, the host's time: a VM's clock
// stood still while it was paused. An agent whose machine has no clock
// of its own (the jail tier's) answers ErrNotSupported.
func (c *Client) SetClock(ctx context.Context, t time.Time) error {
	body, _ := json.Marshal(map[string]int64{"time": t.UnixNano()})
	return c.do(ctx, "POST", "/v1/clock", nil, bytes.NewReader(body), nil)
}

// RemountWorkspace asks the agent to mount the machine's workspace again,
// after the host plugged its device back in. An agent that has no way to
// (the jail tier's, where the workspace never goes away) answers
// ErrNotSupported.
func (c *Client) RemountWorkspace(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/workspace/remount", nil, nil, nil)
}

// Dial opens a TCP connection to 127.0.0.1:port inside the machine (its
// own network namespace) and returns it, carried over a stream of its
// own. Nothing listening there is an error that says so.
func (c *Client) Dial(ctx context.Context, port int) (net.Conn, error) {
	if err := CheckPort(port); err != nil {
		return nil, fmt.Errorf("guest dial: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("guest dial %d: %w", port, err)
	}
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("guest dial %d: %w", port, err)
	}
	stop := context.AfterFunc(ctx, func() { st.Close() }) // the handshake ends with ctx
	conn, err := dialHandshake(st, port)
	if !stop() {
		st.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("guest dial %d: %w", port, err)
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	return conn, nil
}

func dialHandshake(st *yamux.Stream, port int) (net.Conn, error) {
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://guest/v1/dial/%d", port), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	if err := req.Write(st); err != nil {
		return nil, fmt.Errorf("guest dial %d: %w", port, err)
	}
	br := bufio.NewReader(st)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("guest dial %d: %w", port, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound && resp.Header.Get("Content-Type") != "application/json" {
			return nil, fmt.Errorf("%w: the agent cannot open connections to ports in the machine (it is older than the daemon): recreate the sandbox", ErrNotSupported)
		}
		if err := responseError(resp); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("guest dial %d: HTTP %d", port, resp.StatusCode)
	}
	return &dialedConn{Stream: st, r: br}, nil
}

// dialedConn is a dialled stream whose first bytes may already sit in the
// reader that parsed the handshake.
type dialedConn struct {
	*yamux.Stream
	r *bufio.Reader
}

func (c *dialedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
