package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a client of QEMU's machine protocol (QMP) on a unix socket:
// JSON objects, one per line; commands are answered in order, and events
// may come between answers.
type qmp struct {
	conn    net.Conn
	mu      sync.Mutex // one command at a time
	replies chan qmpReply
	events  chan qmpEvent // dropped when nobody reads them
	closed  chan struct{} // closed when the connection ends: QEMU exited or the socket was closed
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

type qmpEvent struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// dialQMP connects to QEMU's QMP socket, reads the greeting and leaves
// capabilities negotiation mode.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &qmp{conn: conn, replies: make(chan qmpReply), events: make(chan qmpEvent, 16), closed: make(chan struct{})}
	r := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	greeting, err := r.ReadBytes('\n')
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	var g struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if json.Unmarshal(greeting, &g) != nil || g.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: unexpected %q", greeting)
	}
	conn.SetReadDeadline(time.Time{})
	go q.read(r)
	if _, err := q.execute(ctx, "qmp_capabilities", nil); err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

// read hands answers to execute and events to whoever listens, until the
// connection ends.
func (q *qmp) read(r *bufio.Reader) {
	defer close(q.closed)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var msg struct {
			qmpReply
			qmpEvent
		}
		if json.Unmarshal(line, &msg) != nil {
			continue
		}
		if msg.Event != "" {
			select {
			case q.events <- msg.qmpEvent:
			default:
			}
			continue
		}
		select {
		case q.replies <- msg.qmpReply:
		case <-time.After(5 * time.Second): // an answer to a command whose caller gave up
		}
	}
}

// errQMPClosed means QEMU closed its QMP socket: it has exited or is exiting.
var errQMPClosed = errors.New("qemu closed its QMP socket")

// execute runs a QMP command and returns its return value.
func (q *qmp) execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case r := <-q.replies:
		if r.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	case <-q.closed:
		return nil, fmt.Errorf("qmp %s: %w", cmd, errQMPClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// status returns the VM's run state: "running", "paused", "internal-error",
// "guest-panicked", "shutdown", ...
func (q *qmp) status(ctx context.Context) (string, error) {
	ret, err := q.execute(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(ret, &st); err != nil {
		return "", fmt.Errorf("qmp query-status: %w", err)
	}
	return st.Status, nil
}

func (q *qmp) close() error { return q.conn.Close() }
