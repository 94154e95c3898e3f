package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"hearth/fs"
)

// Client talks to a daemon's API over its unix socket. It is what the CLI
// uses; it never touches the daemon's state directly.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the daemon serving socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{socket: socket, hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// ErrDaemonDown means nothing answers on the socket.
var ErrDaemonDown = errors.New("the hearth daemon is not running")

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body bytes.Buffer
	if in != nil {
		json.NewEncoder(&body).Encode(in)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://hearth"+path, &body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%w (no answer on %s): start it with 'hearth up'", ErrDaemonDown, c.socket)
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct{ Error *APIError }
		if json.NewDecoder(resp.Body).Decode(&e) != nil || e.Error == nil {
			return fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
		}
		e.Error.Status = resp.StatusCode
		return e.Error
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// Sessions lists the workspace sessions.
func (c *Client) Sessions(ctx context.Context) ([]fs.SessionInfo, error) {
	var out []fs.SessionInfo
	return out, c.do(ctx, "GET", "/v1/workspace/sessions", nil, &out)
}

// CreateSession makes a session with inputs/, outputs/ and .home/.
func (c *Client) CreateSession(ctx context.Context, id string) error {
	return c.do(ctx, "POST", "/v1/workspace/sessions", CreateSessionRequest{ID: id}, nil)
}

// DeleteSession removes a session and its snapshots.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/workspace/sessions/"+url.PathEscape(id), nil, nil)
}

// Snapshot takes a snapshot and returns its name (generated when empty).
func (c *Client) Snapshot(ctx context.Context, session, name string) (string, error) {
	var out SnapshotRequest
	err := c.do(ctx, "POST", "/v1/workspace/snapshots", SnapshotRequest{Session: session, Name: name}, &out)
	return out.Name, err
}

// Snapshots lists a session's snapshots ("" for whole-tree ones).
func (c *Client) Snapshots(ctx context.Context, session string) ([]fs.SnapshotInfo, error) {
	var out []fs.SnapshotInfo
	return out, c.do(ctx, "GET", "/v1/workspace/snapshots?session="+url.QueryEscape(session), nil, &out)
}

// Restore rolls a session back to a snapshot.
func (c *Client) Restore(ctx context.Context, session, snapshot string) error {
	return c.do(ctx, "POST", "/v1/workspace/restore", RestoreRequest{Session: session, Snapshot: snapshot}, nil)
}

// Branch starts a new session from a snapshot.
func (c *Client) Branch(ctx context.Context, req BranchRequest) error {
	return c.do(ctx, "POST", "/v1/workspace/branch", req, nil)
}
