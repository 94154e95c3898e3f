package guest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAwaitClaim: an agent made to await its claim answers health checks
// at once and runs nothing else until Claim, then runs what waited as the
// claim's user. A request given up on while it waits ends, and the agent
// serves on.
func TestAwaitClaim(t *testing.T) {
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	if uid == 0 {
		uid, gid = 65534, 65534 // the claim's user must show: not the agent's
	}
	srv := NewServer(ServerOptions{AwaitClaim: true})
	c := serveOn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Health(ctx); err != nil {
		t.Fatalf("Health before the claim: %v", err)
	}
	marker := t.TempDir() + "/ran"
	os.Chmod(marker[:strings.LastIndex(marker, "/")], 0o777)
	gaveUp, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if _, err := c.Exec(gaveUp, ExecRequest{Argv: []string{"touch", marker}}, nil, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec before the claim, given up after 200 ms = %v, want it still waiting (deadline exceeded)", err)
	}
	type result struct {
		out string
		st  ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		var out strings.Builder
		st, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "id -u; id -g"}}, nil, &out, nil)
		done <- result{out.String(), st, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("exec before the claim ran: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the exec given up on before the claim ran (stat: %v)", err)
	}
	srv.Claim(uid, gid)
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("exec waiting for the claim did not run within 10 s of it")
	}
	want := strconv.Itoa(int(uid)) + "\n" + strconv.Itoa(int(gid)) + "\n"
	if r.err != nil || r.st.Code != 0 || r.out != want {
		t.Fatalf("exec after the claim = %q, %+v, %v; want %q", r.out, r.st, r.err, want)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the exec given up on before the claim ran after it (stat: %v)", err)
	}
}
