package remote

import (
	"context"
	"runtime"
	"testing"
	"time"

	"hearth/fs"
)

// TestCloseLeavesNothing: Close ends every connection mid-transfer and
// mid-follow, and leaves no goroutine and no mounted view behind.
func TestCloseLeavesNothing(t *testing.T) {
	requireSSHFS(t)
	before := runtime.NumGoroutine()
	t.Cleanup(func() { // registered first: runs after the mount's and the store's
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	})
	tb := newTestbed(t, "alpha")
	if err := tb.write("alpha", "outputs/big", string(make([]byte, 1<<20))); err != nil {
		t.Fatal(err)
	}
	sc := sftpClient(t, tb, "alpha")
	f, err := sc.Open("alpha/outputs/big")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	followed := make(chan error, 1)
	go func() { followed <- Follow(ctx, tb.node("alpha"), nil, func(fs.Event) {}) }()
	tb.mount(t, "alpha")
	if err := tb.srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-followed; err == nil {
		t.Errorf("Follow after Close = nil, want the connection's end")
	}
	f.Close()
	sc.Close()
	if m := mountsUnder(t, tb.dir); len(m) > 0 {
		t.Errorf("views still mounted after Close: %v", m)
	}
}
