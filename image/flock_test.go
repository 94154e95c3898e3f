package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFlockHonoursContext: waiting for the boot artifacts' lock, which
// another process holds while it builds them, ends when the context does
// (Ctrl-C during a daemon's start); once the lock is free it is taken.
func TestFlockHonoursContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".lock")
	other, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if unlock, err := flock(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			unlock()
		}
		t.Fatalf("flock while another holds the lock = %v, want the context's deadline", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("flock gave up %v after its context ended, want at once", took)
	}
	go func() { time.Sleep(100 * time.Millisecond); other.Close() }()
	unlock, err := flock(context.Background(), path)
	if err != nil {
		t.Fatalf("flock once the other let go: %v", err)
	}
	unlock()
}
