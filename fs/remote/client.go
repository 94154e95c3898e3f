package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"hearth/fs"
)

// ClientConfig says how a node reaches the serving node's store.
type ClientConfig struct {
	Addr       string // the serving node's host:port
	KeyFile    string // this node's private key (OpenSSH format)
	KnownHosts string // a known_hosts file holding the serving node's host key
	// Retries bounds the reconnections one request makes while the
	// serving node is away (it restarts), RetryDelay apart; zero: 30 and
	// one second.
	Retries    int
	RetryDelay time.Duration
}

// requestTimeout bounds one request, a write's data included.
const requestTimeout = 10 * time.Minute

// ErrUnreachable means the serving node did not answer within the
// client's retries.
var ErrUnreachable = errors.New("workspace node unreachable")

// ErrConnectionLost means the connection dropped after a request that
// changes the store was sent: whether it took effect is unknown.
var ErrConnectionLost = errors.New("connection to the workspace node lost mid-request")

// Client runs store operations on the serving node over one SSH
// connection as ControlUser, reconnecting when the serving node
// restarts. It is safe for concurrent use.
type Client struct {
	cfg ClientConfig

	mu     sync.Mutex
	conn   *ssh.Client
	closed bool
	id     string // WorkspaceID of the first connection's host key
}

// Dial connects to the serving node once, so that a wrong address, key
// or host key is said at once.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if cfg.Addr == "" || cfg.KeyFile == "" || cfg.KnownHosts == "" {
		return nil, errors.New("workspace client: Addr, KeyFile and KnownHosts are required")
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 30
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = time.Second
	}
	c := &Client{cfg: cfg}
	if _, err := c.connection(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// WorkspaceID names the workspace this client reaches: the serving
// node's host key, as WorkspaceID gives it there.
func (c *Client) WorkspaceID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id
}

// WorkspaceID names the workspace a server with host key key serves: the
// key's SHA-256 fingerprint. Nodes that reach the same workspace, and the
// node serving it, get the same name whatever address they use.
func WorkspaceID(key ssh.PublicKey) string { return ssh.FingerprintSHA256(key) }

// Addr is the serving node's address.
func (c *Client) Addr() string { return c.cfg.Addr }

// Node is how this node mounts session's view on the serving node.
func (c *Client) Node(session string, ids fs.IDShift) Node {
	return Node{Addr: c.cfg.Addr, Session: session, KeyFile: c.cfg.KeyFile, KnownHosts: c.cfg.KnownHosts, IDs: ids}
}

// Close drops the connection; requests after it fail.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	return nil
}

func (c *Client) connection(ctx context.Context) (*ssh.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("workspace client %s: %w", c.cfg.Addr, os.ErrClosed)
	}
	if c.conn != nil {
		return c.conn, nil
	}
	conn, key, err := dialKey(ctx, Node{Addr: c.cfg.Addr, KeyFile: c.cfg.KeyFile, KnownHosts: c.cfg.KnownHosts}, ControlUser)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	if c.id == "" {
		c.id = WorkspaceID(key)
	}
	return conn, nil
}

// drop forgets conn if it is still the current connection.
func (c *Client) drop(conn *ssh.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == conn && conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// call runs req, reconnecting while nothing was sent; once the request
// is sent, only idempotent ones are sent again.
func (c *Client) call(req request, body io.Reader, idempotent bool) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		conn, err := c.connection(ctx)
		sent := false
		var a answer
		if err == nil {
			a, sent, err = c.try(ctx, conn, req, body)
			if err == nil {
				return a, a.err()
			}
			c.drop(conn)
		}
		switch {
		case errors.Is(err, os.ErrClosed) || ctx.Err() != nil:
			return answer{}, fmt.Errorf("workspace node %s: %s: %w", c.cfg.Addr, req.Op, err)
		case sent && !idempotent:
			return answer{}, fmt.Errorf("workspace node %s: %s %s: %w: %w", c.cfg.Addr, req.Op, req.Session, ErrConnectionLost, err)
		case attempt >= c.cfg.Retries:
			return answer{}, fmt.Errorf("%w: %s: %s after %d tries: %w", ErrUnreachable, c.cfg.Addr, req.Op, attempt, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.cfg.RetryDelay):
		}
	}
}

// try sends req (and body's data frames) on a new channel and reads the
// answer; sent says whether the request left this node.
func (c *Client) try(ctx context.Context, conn *ssh.Client, req request, body io.Reader) (answer, bool, error) {
	sess, err := conn.NewSession()
	if err != nil {
		return answer{}, false, err
	}
	defer sess.Close()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	in, err := sess.StdinPipe()
	if err != nil {
		return answer{}, false, err
	}
	out, err := sess.StdoutPipe()
	if err != nil {
		return answer{}, false, err
	}
	if err := sess.RequestSubsystem(subsystemControl); err != nil {
		return answer{}, false, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return answer{}, false, err
	}
	if err := writeFrame(in, b); err != nil {
		return answer{}, false, err
	}
	if body != nil {
		if err := sendData(in, body); err != nil {
			return answer{}, true, err
		}
	}
	ab, err := readFrame(out, maxAnswerFrame)
	if err != nil {
		return answer{}, true, err
	}
	var a answer
	if err := json.Unmarshal(ab, &a); err != nil {
		return answer{}, true, fmt.Errorf("workspace node answer: %w", err)
	}
	return a, true, nil
}

// sendData streams body as data frames and the empty frame that ends it.
func sendData(w io.Writer, body io.Reader) error {
	buf := make([]byte, maxDataFrame)
	for {
		n, err := io.ReadFull(body, buf)
		if n > 0 {
			if werr := writeFrame(w, buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return writeFrame(w, nil)
		}
		if err != nil {
			return fmt.Errorf("read data to write: %w", err)
		}
	}
}

// EnsureSession makes the session owned by owner with quota q on the
// serving node, or gives an existing one to owner and sets its quota.
func (c *Client) EnsureSession(session string, owner fs.Owner, q fs.Quota) error {
	_, err := c.call(request{Op: opEnsure, Session: session, UID: owner.UID, GID: owner.GID, Quota: &q}, nil, true)
	return err
}

// WriteFile puts r at p in session, owned by owner; the file appears
// whole or not at all.
func (c *Client) WriteFile(session, p string, r io.Reader, owner fs.Owner) error {
	_, err := c.call(request{Op: opWrite, Session: session, Path: p, UID: owner.UID, GID: owner.GID}, r, false)
	return err
}

// MkdirAll makes directory p and its parents in session.
func (c *Client) MkdirAll(session, p string, owner fs.Owner) error {
	_, err := c.call(request{Op: opMkdirAll, Session: session, Path: p, UID: owner.UID, GID: owner.GID}, nil, true)
	return err
}

// RemoveAll removes p in session and what it holds.
func (c *Client) RemoveAll(session, p string) error {
	_, err := c.call(request{Op: opRemoveAll, Session: session, Path: p}, nil, true)
	return err
}

// Chmod sets p's permission bits in session.
func (c *Client) Chmod(session, p string, mode os.FileMode) error {
	_, err := c.call(request{Op: opChmod, Session: session, Path: p, Mode: mode}, nil, true)
	return err
}

// Glob lists session's regular files matching pattern (fs.Store.Glob).
func (c *Client) Glob(session, pattern string) ([]string, error) {
	a, err := c.call(request{Op: opGlob, Session: session, Pattern: pattern}, nil, true)
	return a.Names, err
}

// ReadFile reads p in session's live tree, at most limit bytes (up to
// MaxRead), following no symbolic link (fs.Store.ReadFile).
func (c *Client) ReadFile(session, p string, limit int64) ([]byte, error) {
	a, err := c.call(request{Op: opRead, Session: session, Path: p, Limit: limit}, nil, true)
	return a.Data, err
}

// Restore rolls session back to its snapshot name (fs.Store.Restore).
func (c *Client) Restore(session, name string) error {
	_, err := c.call(request{Op: opRestore, Session: session, Name: name}, nil, false)
	return err
}

// Branch makes session newID from session's snapshot name.
func (c *Client) Branch(session, name, newID string) error {
	_, err := c.call(request{Op: opBranch, Session: session, Name: name, To: newID}, nil, false)
	return err
}

// Move renames from to to in session, replacing nothing (fs.Store.Move).
func (c *Client) Move(session, from, to string) error {
	_, err := c.call(request{Op: opMove, Session: session, Path: from, To: to}, nil, false)
	return err
}

// Snapshot takes snapshot name of session: O(1) on the serving node.
func (c *Client) Snapshot(session, name string) error {
	_, err := c.call(request{Op: opSnapshot, Session: session, Name: name}, nil, false)
	return err
}

// DeleteSnapshot deletes session's snapshot name.
func (c *Client) DeleteSnapshot(session, name string) error {
	_, err := c.call(request{Op: opDeleteSnapshot, Session: session, Name: name}, nil, false)
	return err
}

// Snapshots lists session's snapshots, oldest first.
func (c *Client) Snapshots(session string) ([]Snapshot, error) {
	a, err := c.call(request{Op: opSnapshots, Session: session}, nil, true)
	return a.Snapshots, err
}

// SnapshotHolds lists session's snapshots with the bytes each pins.
func (c *Client) SnapshotHolds(session string) ([]Snapshot, error) {
	a, err := c.call(request{Op: opSnapshotHolds, Session: session}, nil, true)
	return a.Snapshots, err
}

// OpenSession mounts session's view read-only at dir and opens the
// session's directory in it. The mount is detached at once: it lives
// until the returned root is closed, then sshfs exits.
func (c *Client) OpenSession(ctx context.Context, session, dir string) (*os.Root, error) {
	n := c.Node(session, fs.IDShift{})
	n.ReadOnly = true
	m, err := MountView(ctx, n, dir)
	if err != nil {
		return nil, err
	}
	defer os.Remove(dir)
	defer m.Detach()
	root, err := os.OpenRoot(filepath.Join(dir, session))
	if err != nil {
		return nil, fmt.Errorf("open session %s on the workspace node: %w", session, err)
	}
	return root, nil
}
