package guest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// sharedPort stands for a VM's virtio-serial port: one byte pipe that
// every host connection writes into and reads from in turn, as QEMU's
// chardev socket makes it. A host that hangs up is not seen by the guest
// here at all: the worst case of the real port, where a host that
// reconnects at once beats the guest's read of the hang-up.
type sharedPort struct {
	toGuest *io.PipeReader // what hosts wrote, in order
	in      *io.PipeWriter

	mu  sync.Mutex
	cur net.Conn // the router's end of the connected host's socket
}

func newSharedPort(t *testing.T) *sharedPort {
	r, w := io.Pipe()
	p := &sharedPort{toGuest: r, in: w}
	t.Cleanup(func() { w.Close(); r.Close() })
	return p
}

// Read and Write are the guest's side.
func (p *sharedPort) Read(b []byte) (int, error) { return p.toGuest.Read(b) }

// Write goes to the host connected now; with none, the bytes are lost, as
// QEMU drops what the guest writes to a port nobody is connected to.
func (p *sharedPort) Write(b []byte) (int, error) {
	p.mu.Lock()
	c := p.cur
	p.mu.Unlock()
	if c != nil {
		c.Write(b)
	}
	return len(b), nil
}

// connect is a new host connection to the port; the previous one's
// socket is closed.
func (p *sharedPort) connect(t *testing.T) net.Conn {
	t.Helper()
	host, router := socketPair(t)
	p.mu.Lock()
	if p.cur != nil {
		p.cur.Close()
	}
	p.cur = router
	p.mu.Unlock()
	go func() {
		// Copies until the host hangs up; a partial frame of a host cut
		// off stays in the pipe for the guest to read.
		io.Copy(p.in, router)
	}()
	return host
}

// socketPair is a connected pair of unix sockets, closed at cleanup.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "sock")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestPortReconnects is the daemon that reconnects at once (a Recover,
// a restart) while the guest's old session still reads the port: each
// new host must get a session of its own, its answers and none of the
// old one's, every time. Without the handshake the old session took the
// new host's bytes ("frame of 578121844 bytes", CI).
func TestPortReconnects(t *testing.T) {
	port := newSharedPort(t)
	srv := NewServer(ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- srv.ServePort(port, func() {}, nil, nil) }()
	t.Cleanup(func() {
		port.in.Close()
		port.toGuest.Close()
		select {
		case err := <-served:
			if err == nil {
				t.Error("ServePort on a closed port = nil, want its error")
			}
		case <-time.After(10 * time.Second):
			t.Error("ServePort still running 10s after its port closed")
		}
	})
	ctx := context.Background()
	for i := range 20 {
		conn, err := HostHandshake(ctx, port.connect(t), 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		c, err := Open(ctx, conn, 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: Open = %v", i, err)
		}
		var out bytes.Buffer
		want := fmt.Sprintf("run %d\n", i)
		st, err := c.Exec(ctx, ExecRequest{Argv: []string{"echo", strings.TrimSpace(want)}}, nil, &out, io.Discard)
		if err != nil || st.Code != 0 || out.String() != want {
			t.Fatalf("connection %d: exec = %q, %+v, %v; want %q", i, out.String(), st, err, want)
		}
		if i%2 == 1 {
			// Hang up in the middle of a call: the guest's session has a
			// stream open, and its answer may come after the next host
			// is there.
			c.Start(ctx, ExecRequest{Argv: []string{"sh", "-c", "sleep 0.05; echo late"}}, nil, io.Discard, io.Discard)
		}
		c.Close()
	}
}

// TestHostHandshakeDropsStaleBytes: what an older session left in the
// port before the guest's answer, and answers to other hellos, are not
// taken for the session; the session's first bytes after the answer are.
func TestHostHandshakeDropsStaleBytes(t *testing.T) {
	host, guest := socketPair(t)
	type result struct {
		rw  io.ReadWriteCloser
		err error
	}
	done := make(chan result, 1)
	go func() {
		rw, err := HostHandshake(context.Background(), host, 10*time.Second)
		done <- result{rw, err}
	}()
	// The guest's side, by hand: stale frames, a partial answer, another
	// host's answer, then the hello's and the session's first bytes.
	line := make([]byte, 0, 64)
	one := make([]byte, 1)
	for len(line) == 0 || line[len(line)-1] != '\n' {
		if _, err := guest.Read(one); err != nil {
			t.Fatal(err)
		}
		line = append(line, one[0])
	}
	nonce := strings.TrimSuffix(strings.TrimPrefix(string(line), helloPrefix), "\n")
	if len(nonce) != nonceLen {
		t.Fatalf("hello %q: want %q and %d hex digits", line, helloPrefix, nonceLen)
	}
	stale := "\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00\x00\x05stale" + "HEARTH-READY " + strings.Repeat("0", nonceLen) + "\n" + "HEARTHEARTH-READY "
	guest.Write([]byte(stale + readyPrefix + nonce + "\n" + "session"))
	r := <-done
	if r.err != nil {
		t.Fatalf("HostHandshake = %v", r.err)
	}
	got := make([]byte, len("session"))
	if _, err := io.ReadFull(r.rw, got); err != nil || string(got) != "session" {
		t.Fatalf("after the handshake read %q, %v; want the session's bytes", got, err)
	}
}

// TestHostHandshakeBounded: a port nobody answers on fails the
// handshake in its time, with the connection closed.
func TestHostHandshakeBounded(t *testing.T) {
	host, guest := socketPair(t)
	go io.Copy(io.Discard, guest)
	start := time.Now()
	_, err := HostHandshake(context.Background(), host, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Fatalf("HostHandshake on a silent port = %v, want no answer", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("HostHandshake took %v for a 300ms bound", took)
	}
	if _, err := host.Write([]byte("x")); err == nil {
		t.Error("the connection is still open after a failed handshake")
	}
}

// TestGuestHandshakeRepeats: repeats of the hello that were in flight
// when the host read the answer are dropped before the session; junk
// there fails it; a hello split by stale bytes is not one.
func TestGuestHandshakeRepeats(t *testing.T) {
	nonce := strings.Repeat("ab", nonceLen/2)
	hello := helloPrefix + nonce + "\n"
	for _, tc := range []struct {
		name, port, want string
		wantErr          bool
	}{
		{"plain", hello + "{claim}", "{claim}", false},
		{"repeats", "\x00junk" + "HEARTH-HEL" + hello + hello + hello + "\x00yamux", "\x00yamux", false},
		{"overlap", "HEARTHEARTH-HELLO " + nonce + "\n" + "x", "x", false},
		{"other hello after", hello + helloPrefix + strings.Repeat("cd", nonceLen/2) + "\n", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var answer bytes.Buffer
			rw := struct {
				io.Reader
				io.Writer
			}{strings.NewReader(tc.port), &answer}
			r, err := GuestHandshake(rw)
			if err != nil {
				t.Fatalf("GuestHandshake = %v", err)
			}
			if answer.String() != readyPrefix+nonce+"\n" {
				t.Errorf("answer %q", answer.String())
			}
			got, err := io.ReadAll(r)
			if tc.wantErr {
				if err == nil || strings.Contains(err.Error(), ErrHostGone.Error()) {
					t.Errorf("read %q, %v; want an error for a stranger's hello", got, err)
				}
				return
			}
			if string(got) != tc.want {
				t.Errorf("session read %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// A port whose host hangs up mid-hello.
	var sink bytes.Buffer
	if _, err := GuestHandshake(struct {
		io.Reader
		io.Writer
	}{strings.NewReader("HEARTH-HELLO 12"), &sink}); err != ErrHostGone {
		t.Errorf("GuestHandshake on a cut hello = %v, want ErrHostGone", err)
	}
}

// FuzzScanFor: the host drops what a guest (hostile, possibly) wrote
// before its answer; whatever those bytes, it stops right after the
// first answer, or fails without one.
func FuzzScanFor(f *testing.F) {
	want := []byte(readyPrefix + strings.Repeat("0f", nonceLen/2) + "\n")
	f.Add([]byte("junk"), true)
	f.Add([]byte("HEARTHEARTH-READY "), true)
	f.Add([]byte("\x00\x00\x00\x01"), false)
	f.Fuzz(func(t *testing.T, junk []byte, answer bool) {
		stream := append([]byte(nil), junk...)
		if answer {
			stream = append(stream, want...)
			stream = append(stream, "tail"...)
		}
		r := bytes.NewReader(stream)
		err := scanFor(r, want, 1<<20)
		idx := bytes.Index(stream, want)
		if (err == nil) != (idx >= 0) {
			t.Fatalf("scanFor(%q) = %v; the answer is at %d", stream, err, idx)
		}
		if err == nil {
			rest, _ := io.ReadAll(r)
			if !bytes.Equal(rest, stream[idx+len(want):]) {
				t.Fatalf("scanFor(%q) left %q, want what follows the first answer", stream, rest)
			}
		}
	})
}

// FuzzGuestHandshake: whatever a port holds, the guest's handshake ends
// (the port runs out), answers only a whole hello with its nonce, and
// the session after it never starts with a repeat of it.
func FuzzGuestHandshake(f *testing.F) {
	hello := helloPrefix + strings.Repeat("ab", nonceLen/2) + "\n"
	f.Add([]byte(hello + "{}"))
	f.Add([]byte("HEARTH-HELLO " + hello + hello + "\x00"))
	f.Add([]byte("HEARTH-HELLO zz\n"))
	f.Fuzz(func(t *testing.T, port []byte) {
		var answer bytes.Buffer
		r, err := GuestHandshake(struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(port), &answer})
		if err != nil {
			if answer.Len() != 0 {
				t.Fatalf("answered %q and failed %v", answer.String(), err)
			}
			return
		}
		a := answer.String()
		nonce := strings.TrimSuffix(strings.TrimPrefix(a, readyPrefix), "\n")
		if len(a) != len(readyPrefix)+nonceLen+1 || !strings.Contains(string(port), helloPrefix+nonce+"\n") {
			t.Fatalf("answer %q to a port holding %q", a, port)
		}
		if rest, err := io.ReadAll(r); err == nil && bytes.HasPrefix(rest, []byte(helloPrefix+nonce+"\n")) {
			t.Fatalf("session starts with a repeat of the hello: %q", rest)
		}
	})
}
