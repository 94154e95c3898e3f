package guest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestPTY(t *testing.T) {
	c := pair(t, ServerOptions{})
	ctx := context.Background()
	var out bytes.Buffer
	st, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "tty; stty size; test -t 0 && echo interactive"}, PTY: true, Rows: 30, Cols: 100}, nil, &out, nil)
	if err != nil || st.Code != 0 {
		t.Fatalf("PTY exec = %+v, %v (%q)", st, err, out.String())
	}
	got := strings.ReplaceAll(out.String(), "\r\n", "\n")
	if !strings.Contains(got, "/dev/pts/") || !strings.Contains(got, "30 100\n") || !strings.Contains(got, "interactive\n") {
		t.Errorf("PTY exec output = %q, want a /dev/pts terminal of 30x100", got)
	}
	// Resize while it runs; stdin reaches it through the terminal.
	var out2 bytes.Buffer
	stdinR, stdinW := io.Pipe()
	p, err := c.Start(ctx, ExecRequest{Argv: []string{"sh", "-c", "read line; stty size; echo got $line"}, PTY: true, Stdin: true},
		stdinR, &out2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(ctx, p.PID, 40, 120); err != nil {
		t.Fatalf("Resize = %v", err)
	}
	stdinW.Write([]byte("hello\n")) // only now may the shell go on to stty
	defer stdinW.Close()
	done := make(chan struct{})
	go func() { p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("PTY exec with stdin did not finish")
	}
	got = strings.ReplaceAll(out2.String(), "\r\n", "\n")
	if !strings.Contains(got, "40 120\n") || !strings.Contains(got, "got hello\n") {
		t.Errorf("after Resize: %q, want 40 120 and the line read from stdin", got)
	}
	if err := c.Resize(ctx, 999999, 10, 10); err == nil {
		t.Errorf("Resize of no PTY exec = nil, want an error")
	}
}
