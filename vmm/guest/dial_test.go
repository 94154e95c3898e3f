package guest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestDial: a connection opened from the host reaches a server listening
// on the machine's loopback and carries bytes both ways, the first ones
// included; a port nothing listens on and an impossible port are clear
// errors, and a failed dial leaves the session usable.
func TestDial(t *testing.T) {
	c := pair(t, ServerOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // greets first, then echoes lines in upper case
				defer s.Close()
				io.WriteString(s, "hello\n")
				sc := bufio.NewScanner(s)
				for sc.Scan() {
					io.WriteString(s, strings.ToUpper(sc.Text())+"\n")
				}
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for i := 0; i < 3; i++ { // several at once, each its own stream
		conn, err := c.Dial(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(conn)
		if line, err := r.ReadString('\n'); err != nil || line != "hello\n" {
			t.Fatalf("greeting = %q, %v", line, err)
		}
		io.WriteString(conn, "ping\n")
		if line, err := r.ReadString('\n'); err != nil || line != "PING\n" {
			t.Fatalf("echo = %q, %v", line, err)
		}
	}

	free, _ := net.Listen("tcp", "127.0.0.1:0")
	freePort := free.Addr().(*net.TCPAddr).Port
	free.Close()
	if _, err := c.Dial(ctx, freePort); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("dial a closed port: %v, want connection refused", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := c.Dial(ctx, p); err == nil || !strings.Contains(err.Error(), "between 1 and 65535") {
			t.Errorf("dial port %d: %v, want a clear refusal", p, err)
		}
	}
	// The agent refuses them too, whatever a client sends.
	resp, err := c.hc.Post("http://guest/v1/dial/70000", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := responseError(resp); err == nil || !strings.Contains(err.Error(), "between 1 and 65535") {
		t.Errorf("agent, port 70000: %v", err)
	}
	resp.Body.Close()
	if _, err := c.Health(ctx); err != nil {
		t.Fatalf("session broken after failed dials: %v", err)
	}

	done, stop := context.WithCancel(ctx)
	stop()
	if _, err := c.Dial(done, port); !errors.Is(err, context.Canceled) {
		t.Errorf("dial with an ended context: %v", err)
	}
}
