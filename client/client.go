package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"hearth/appliance/api"
)

// Client talks to a daemon's API over its unix socket or TCP. It never
// touches the daemon's state directly. It wraps the client
// generated from api/openapi.yaml: every call gets a timeout (streams are
// bounded by their context instead), and error responses become
// *APIError, a daemon that does not answer ErrDaemonDown.
type Client struct {
	socket string
	hc     *http.Client
	api    *api.Client
	// Timeout bounds each call that does not stream.
	Timeout time.Duration
}

// Types of the API, for the client's callers.
type (
	Sandbox              = api.Sandbox
	ForkResult           = api.ForkResult
	CreateSandboxRequest = api.CreateSandboxRequest
	ExecRequest          = api.ExecRequest
	ExitStatus           = api.ExitStatus
	FileInfo             = api.FileInfo
	Image                = api.Image
	ImageList            = api.ImageList
	ImageManifest        = api.ImageManifest
	Package              = api.Package
	BranchRequest        = api.BranchRequest
	Usage                = api.Usage
	Checkpoint           = api.Checkpoint
	JobRequest           = api.JobRequest
	Job                  = api.Job
	ExposePortRequest    = api.ExposePortRequest
	ExposedPort          = api.ExposedPort
	PortSignIn           = api.PortSignIn
	SessionInfo          = api.SessionInfo
	SnapshotInfo         = api.SnapshotInfo
	Health               = api.Health
)

// APIError is the body of an error response, with its HTTP status.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Step is the build step that failed, for build_failed.
	Step   string `json:"step,omitempty"`
	Status int    `json:"-"`
}

func (e *APIError) Error() string { return e.Message }

// New returns a client for the daemon serving socket.
func New(socket string) *Client {
	return newClient(socket, "", func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	})
}

// NewTCP returns a client for a daemon serving its API on addr
// (host:port, the config's api.tcp), sending token with every request.
func NewTCP(addr, token string) *Client {
	return newClient(addr, token, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
}

func newClient(where, token string, dial func(context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		// Streams send their header as soon as they start; a daemon that
		// says nothing for this long is stuck.
		ResponseHeaderTimeout: 2 * time.Minute,
	}
	hc := &http.Client{Transport: tr}
	opts := []api.ClientOption{api.WithHTTPClient(hc)}
	if token != "" {
		opts = append(opts, api.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	}
	ac, _ := api.NewClient("http://hearth", opts...) // fails only for a bad option
	return &Client{socket: where, hc: hc, api: ac, Timeout: 60 * time.Second}
}

// ErrDaemonDown means nothing answers on the socket.
var ErrDaemonDown = errors.New("the hearth daemon is not running")

// send makes one request with the generated client and turns a failure to
// connect and an error status into Go errors. The caller closes the body.
func (c *Client) send(ctx context.Context, call func(context.Context) (*http.Response, error)) (*http.Response, error) {
	resp, err := call(ctx)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (no answer on %s): start it with 'hearth up'", ErrDaemonDown, c.socket)
		}
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, responseError(resp)
	}
	return resp, nil
}

func responseError(resp *http.Response) error {
	var e struct{ Error *APIError }
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(body, &e) != nil || e.Error == nil {
		return fmt.Errorf("%s %s: HTTP %d", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode)
	}
	e.Error.Status = resp.StatusCode
	return e.Error
}

// call makes a request that does not stream, within c.Timeout, and
// decodes the JSON answer into out (nil: discard it).
func (c *Client) call(ctx context.Context, out any, call func(context.Context) (*http.Response, error)) error {
	return c.callWithin(ctx, c.Timeout, out, call)
}

// callWithin is call within timeout instead of c.Timeout.
func (c *Client) callWithin(ctx context.Context, timeout time.Duration, out any, call func(context.Context) (*http.Response, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.send(ctx, call)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: answer: %w", resp.Request.Method, resp.Request.URL.Path, err)
	}
	return nil
}

// Sessions lists the workspace sessions.
func (c *Client) Sessions(ctx context.Context) ([]SessionInfo, error) {
	var out []SessionInfo
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.ListSessions(ctx) })
}

// CreateSession makes a session with inputs/, outputs/ and .home/.
func (c *Client) CreateSession(ctx context.Context, id string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) {
		return c.api.CreateSession(ctx, api.CreateSessionRequest{Id: id})
	})
}

// DeleteSession removes a session and its snapshots.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) { return c.api.DeleteSession(ctx, id) })
}

// Snapshot takes a snapshot and returns its name (generated when empty).
func (c *Client) Snapshot(ctx context.Context, session, name string) (string, error) {
	var out api.SnapshotRequest
	err := c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.CreateSnapshot(ctx, api.SnapshotRequest{Session: session, Name: name})
	})
	return out.Name, err
}

// Snapshots lists a session's snapshots ("" for whole-tree ones).
func (c *Client) Snapshots(ctx context.Context, session string) ([]SnapshotInfo, error) {
	var out []SnapshotInfo
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) {
		return c.api.ListSnapshots(ctx, &api.ListSnapshotsParams{Session: session})
	})
}

// DeleteSnapshot deletes a snapshot of a session ("" for a whole-tree one).
func (c *Client) DeleteSnapshot(ctx context.Context, session, name string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) {
		return c.api.DeleteSnapshot(ctx, &api.DeleteSnapshotParams{Session: session, Name: name})
	})
}

// Restore rolls a session back to a snapshot.
func (c *Client) Restore(ctx context.Context, session, snapshot string) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) {
		return c.api.RestoreSnapshot(ctx, api.RestoreRequest{Session: session, Snapshot: snapshot})
	})
}

// Branch starts a new session from a snapshot.
func (c *Client) Branch(ctx context.Context, req BranchRequest) error {
	return c.call(ctx, nil, func(ctx context.Context) (*http.Response, error) { return c.api.BranchSession(ctx, req) })
}

// Health asks the daemon what it knows is wrong with its own state.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var out Health
	return out, c.call(ctx, &out, func(ctx context.Context) (*http.Response, error) { return c.api.GetHealth(ctx) })
}

// HTTP returns the HTTP client c sends with, connected to the daemon (any
// host name reaches it): for requests the API's operations do not make,
// such as a test's malformed body, and to close idle connections.
func (c *Client) HTTP() *http.Client { return c.hc }
