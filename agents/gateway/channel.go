package gateway

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

// A token alone does not say who sends it: an agent's outputs are read by
// others, and a token that leaks through them could be spent from another
// machine and charged to the execution it was issued to. So each
// connection to the gateway carries the identity of the machine channel
// it came through, written by the host side of that channel (DialChannel)
// before any byte of the machine's, and read back by the gateway's
// listener (Listener); an Execution registered with a Channel is admitted
// only on its own.

// channelPreamble starts every connection DialChannel makes.
const channelPreamble = "hearth-channel "

// maxPreamble bounds the preamble line.
const maxPreamble = 256

// DialChannel returns a dialer that connects with dial and first names
// channel on the connection, for the gateway's Listener to read. The
// host side of a machine's channel dials with it, so whatever the machine
// sends comes after, and cannot change, the name.
func DialChannel(dial func(ctx context.Context) (net.Conn, error), channel string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		if channel == "" || strings.ContainsAny(channel, "\r\n") || len(channel) > maxPreamble-len(channelPreamble)-1 {
			return nil, fmt.Errorf("gateway: channel name %q: give a short name on one line", channel)
		}
		c, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := io.WriteString(c, channelPreamble+channel+"\n"); err != nil {
			c.Close()
			return nil, fmt.Errorf("gateway: name the channel %s: %w", channel, err)
		}
		return c, nil
	}
}

// Listener wraps ln, on which the gateway is served to DialChannel's
// connections: each must start with the preamble, or its first read
// fails and the server drops it. Serve the gateway with ConnContext too.
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

var errNoPreamble = errors.New("gateway: connection without a channel preamble")

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

// ConnContext is the http.Server ConnContext of a gateway served on a
// Listener: it lets requests find the channel their connection named.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*channelConn); ok {
		return context.WithValue(ctx, channelKey{}, cc)
	}
	return ctx
}

// channelOf is the channel a request came through, "" if unknown.
func channelOf(ctx context.Context) string {
	if cc, ok := ctx.Value(channelKey{}).(*channelConn); ok {
		return cc.name()
	}
	return ""
}
