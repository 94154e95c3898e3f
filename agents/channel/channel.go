// Package channel names the machine channel a connection to a host
// service comes through. A token alone does not say who sends it: an
// agent's outputs are read by others, and a token that leaks through them
// could be spent from another machine and charged to the execution it was
// issued to. So the host side of each machine's channel writes the
// channel's name on every connection it makes to a host service (Dial),
// before any byte of the machine's, and the service's listener (Listener,
// ConnContext) reads it back, so a request can be checked against the
// channel its token was issued to (Of). The model gateway and the egress
// proxy (packages agents/gateway and agents/egress) admit a token only
// on its own channel; the agents runner dials, and the appliance serves,
// through this package.
package channel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
)

// channelPreamble starts every connection DialChannel makes.
const channelPreamble = "hearth-channel "

// maxPreamble bounds the preamble line.
const maxPreamble = 256

// Dial returns a dialer that connects with dial and first names
// channel on the connection, for the service's Listener to read. The
// host side of a machine's channel dials with it, so whatever the machine
// sends comes after, and cannot change, the name.
func Dial(dial func(ctx context.Context) (net.Conn, error), channel string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		if channel == "" || strings.ContainsAny(channel, "\r\n") || len(channel) > maxPreamble-len(channelPreamble)-1 {
			return nil, fmt.Errorf("channel: name %q: give a short name on one line", channel)
		}
		c, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := io.WriteString(c, channelPreamble+channel+"\n"); err != nil {
			c.Close()
			return nil, fmt.Errorf("channel: name the channel %s: %w", channel, err)
		}
		return c, nil
	}
}

// Listener wraps ln, on which a service is served to Dial's
// connections: each must start with the preamble, or its first read
// fails and the server drops it. Serve with ConnContext too.
func Listener(ln net.Listener) net.Listener { return channelListener{ln} }

type channelListener struct{ net.Listener }

func (l channelListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// The preamble is read on the connection's first read, in its own
	// goroutine, so a slow one does not hold up the accept loop.
	return &channelConn{Conn: c, r: bufio.NewReaderSize(c, 4096)}, nil
}

// channelConn is a connection whose first line named its channel.
type channelConn struct {
	net.Conn
	r *bufio.Reader

	mu      sync.Mutex
	read    bool
	channel string
	err     error
}

var errNoPreamble = errors.New("channel: connection without a channel preamble")

func (c *channelConn) Read(p []byte) (int, error) {
	if err := c.preamble(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (c *channelConn) preamble() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read {
		return c.err
	}
	c.read = true
	line, err := readLine(c.r, maxPreamble)
	name, ok := strings.CutPrefix(line, channelPreamble)
	switch {
	case err != nil:
		c.err = err
	case !ok || name == "":
		c.err = errNoPreamble
	default:
		c.channel = name
		return nil
	}
	// A read error: net/http drops the connection without answering it.
	c.err = &net.OpError{Op: "read", Net: "unix", Addr: c.LocalAddr(), Err: c.err}
	return c.err
}

// readLine reads up to a newline, at most limit bytes.
func readLine(r *bufio.Reader, limit int) (string, error) {
	var b []byte
	for len(b) < limit {
		c, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		if c == '\n' {
			return string(b), nil
		}
		b = append(b, c)
	}
	return "", errNoPreamble
}

func (c *channelConn) name() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.channel
}

type channelKey struct{}

// ConnContext is the http.Server ConnContext of a service served on a
// Listener: it lets requests find the channel their connection named.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*channelConn); ok {
		return context.WithValue(ctx, channelKey{}, cc)
	}
	return ctx
}

// Of is the channel a request came through, "" if unknown.
func Of(ctx context.Context) string {
	if cc, ok := ctx.Value(channelKey{}).(*channelConn); ok {
		return cc.name()
	}
	return ""
}
