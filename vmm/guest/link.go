package guest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The port handshake. A VM's virtio-serial port is one byte pipe that
// every host connection shares: a daemon that reconnects (a restart, a
// Recover, a retry) writes into the same pipe its predecessor did. The
// guest learns of a hang-up only if it reads while no host is connected,
// and a host that reconnects at once can beat it to that read: then the
// guest's old session reads the new host's bytes as its own, and either
// side may see the other's stale frames (a desync seen as "frame of
// 578121844 bytes" in CI). So every connection starts with a handshake
// that delimits it in the byte stream:
//
//   - the host sends "HEARTH-HELLO <nonce>\n", a fresh random nonce per
//     connection, again every helloResend until the guest answers;
//   - the guest, which drops everything until a whole hello line, answers
//     "HEARTH-READY <nonce>\n" and starts its session with the next byte
//     that is not a repeat of that hello;
//   - the host drops everything until that answer, then starts its
//     session.
//
// An old session that reads a hello fails on its first byte ('H' is no
// yamux version) and ends, and the guest goes back to waiting for a
// hello: the next resend. Neither a claim ('{') nor a yamux session (a
// zero version byte) starts with 'H', so repeats are told from the
// session by their first byte.

const (
	helloPrefix = "HEARTH-HELLO "
	readyPrefix = "HEARTH-READY "
	nonceLen    = 32 // hex digits
	// helloResend is how long the host waits for the answer before it
	// sends its hello again; a guest under emulation can take a while.
	helloResend = 250 * time.Millisecond
	// maxPreamble bounds what the host reads, and drops, before the
	// answer: a stale session's last frames.
	maxPreamble = 4 << 20
)

// HostHandshake starts a connection to a guest's port: it sends the
// hello, waits up to timeout for the guest's answer and returns the
// connection to run the session on (claim, then protocol) from the byte
// after it. On error conn is closed.
func HostHandshake(ctx context.Context, conn net.Conn, timeout time.Duration) (io.ReadWriteCloser, error) {
	var raw [nonceLen / 2]byte
	rand.Read(raw[:])
	nonce := hex.EncodeToString(raw[:])
	hello := []byte(helloPrefix + nonce + "\n")
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(helloResend)
		defer t.Stop()
		for {
			if _, err := conn.Write(hello); err != nil {
				return // the read below fails too
			}
			select {
			case <-stop:
				return
			case <-ctx.Done():
				conn.SetReadDeadline(time.Now()) // ends the read below
				return
			case <-t.C:
			}
		}
	}()
	br := bufio.NewReaderSize(conn, 64)
	err := scanFor(br, []byte(readyPrefix+nonce+"\n"), maxPreamble)
	close(stop)
	wg.Wait() // no hello is written after the session's first byte
	if err == nil {
		err = conn.SetReadDeadline(time.Time{})
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("guest port handshake: no answer within %v", timeout)
		}
		return nil, fmt.Errorf("guest port handshake: %w", err)
	}
	return &linkConn{r: br, Conn: conn}, nil
}

// linkConn is a connection whose first bytes were read into r.
type linkConn struct {
	r io.Reader
	net.Conn
}

func (c *linkConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// scanFor reads r until it has read want, which ends in a newline,
// dropping what comes before it; it fails after limit bytes without it.
func scanFor(r io.ByteReader, want []byte, limit int) error {
	var window []byte // the last len(want) bytes
	for n := 0; n < limit; n++ {
		c, err := r.ReadByte()
		if err != nil {
			return err
		}
		if len(window) == len(want) {
			window = append(window[:0], window[1:]...)
		}
		window = append(window, c)
		if c == '\n' && bytes.Equal(window, want) {
			return nil
		}
	}
	return fmt.Errorf("no answer in %d bytes", limit)
}

// ErrHostGone is what GuestHandshake returns when the host hung up
// before a whole hello: wait for the next host and call it again.
var ErrHostGone = errors.New("the host hung up before its hello")

// GuestHandshake answers a host's hello on the port rw: it drops
// everything until a whole hello line, answers it, and returns the
// reader to run the session on, which drops repeats of that hello before
// the session's first byte. It reads a byte at a time, so that nothing
// after the hello is taken from the port. A read of nothing (the port
// with no host) is ErrHostGone.
func GuestHandshake(rw io.ReadWriter) (io.Reader, error) {
	br := byteReader{rw}
	const helloLen = len(helloPrefix) + nonceLen + 1
	var window []byte // the last helloLen bytes
	for {
		c, err := br.ReadByte()
		if err != nil {
			return nil, err
		}
		if len(window) == helloLen {
			window = append(window[:0], window[1:]...)
		}
		window = append(window, c)
		if c != '\n' || len(window) < helloLen || !bytes.HasPrefix(window, []byte(helloPrefix)) {
			continue
		}
		nonce := window[len(helloPrefix) : helloLen-1]
		if bytes.IndexFunc(nonce, func(r rune) bool { return !isHex(byte(r)) }) >= 0 {
			continue
		}
		if _, err := rw.Write([]byte(readyPrefix + string(nonce) + "\n")); err != nil {
			return nil, err
		}
		return &afterHello{r: br, hello: window}, nil
	}
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// byteReader reads one byte at a time; a read of nothing is the host
// gone (a virtio-serial port with no host reads as end of file).
type byteReader struct{ r io.Reader }

func (b byteReader) ReadByte() (byte, error) {
	var one [1]byte
	n, err := b.r.Read(one[:])
	switch {
	case n == 1:
		return one[0], nil
	case err == nil || errors.Is(err, io.EOF):
		return 0, ErrHostGone
	}
	return 0, err
}

// afterHello is the port after the handshake: repeats of the hello that
// were in flight when the host read the answer are dropped, then it
// reads through. Anything else starting with 'H' there is not from this
// host's session, and fails it.
type afterHello struct {
	r       byteReader
	hello   []byte
	through bool
}

func (a *afterHello) Read(p []byte) (int, error) {
	if a.through {
		return a.r.r.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		c, err := a.r.ReadByte()
		if err != nil {
			return 0, err
		}
		if c != a.hello[0] {
			a.through = true
			p[0] = c
			return 1, nil
		}
		rest := make([]byte, len(a.hello)-1)
		for i := range rest {
			if rest[i], err = a.r.ReadByte(); err != nil {
				return 0, err
			}
		}
		if !bytes.Equal(rest, a.hello[1:]) {
			return 0, fmt.Errorf("guest port: %q after the handshake, not the session", append([]byte{c}, rest...))
		}
	}
}

// AcceptHost waits for a host on a port that every host connection
// shares (a VM's virtio-serial port) and answers its handshake; it
// returns the reader of the session. waitHost blocks until a host may
// be connected. A host that hangs up before its hello is waited through;
// an error of the port itself is returned.
func AcceptHost(port io.ReadWriter, waitHost func()) (io.Reader, error) {
	for {
		waitHost()
		r, err := GuestHandshake(port)
		if !errors.Is(err, ErrHostGone) {
			return r, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ServePort serves one host connection after another on port, each
// from its handshake (AcceptHost) with a fresh protocol session, until
// the port fails. first, if not nil, is the session reader of a
// connection whose handshake (and claim) is done already. logf, if not
// nil, is told how each session ended.
func (s *Server) ServePort(port io.ReadWriter, waitHost func(), first io.Reader, logf func(string, ...any)) error {
	for {
		r := first
		first = nil
		if r == nil {
			var err error
			if r, err = AcceptHost(port, waitHost); err != nil {
				return fmt.Errorf("host port: %w", err)
			}
		}
		err := s.Serve(portSession{r: r, w: port})
		if logf != nil && err != nil && !errors.Is(err, io.EOF) {
			logf("session ended: %v", err)
		}
	}
}

// portSession is one session's view of the port: it reads what the
// handshake left, and Close ends the session without closing the port,
// which the next session reuses.
type portSession struct {
	r io.Reader
	w io.Writer
}

func (p portSession) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n == 0 && (err == nil || errors.Is(err, ErrHostGone)) {
		err = io.EOF
	}
	return n, err
}
func (p portSession) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p portSession) Close() error                { return nil }
