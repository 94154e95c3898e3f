package guest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// TestHostileGuestNeverAnswers: an agent that starts an exec and then
// keeps its stream open without a word (a hostile agent, or a process
// left in the background holding the output open) cannot hold the host:
// the call ends with its context, with the context's error, not a
// status. The fake agent stands for a hostile one (the real agent always
// answers); it speaks the real protocol: yamux, HTTP, frames.
func TestHostileGuestNeverAnswers(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	sess, err := yamux.Server(guestEnd, yamux.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeFrame(w, FrameStarted, []byte(strconv.Itoa(4242)))
		w.(http.Flusher).Flush()
		<-release // silent, stream open, until the test ends
	})}
	go srv.Serve(sess)
	c, err := NewClient(hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(release); c.Close(); srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Exec against a silent agent = %v, want the context's deadline error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Exec hangs on an agent that never answers, past its context")
	}
}

// TestExecEndsWhenHostGivesUp: when the host's call ends (its context),
// the agent ends the process, not leaving it to run to its end.
func TestExecEndsWhenHostGivesUp(t *testing.T) {
	c := pair(t, ServerOptions{})
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 30"}}, nil, io.Discard, io.Discard)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec past its context = %v, want the context's deadline error", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("the process (pid %d) still runs 10 s after the host gave up", pid)
}
