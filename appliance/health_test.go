package appliance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"hearth/client"
)

// TestHealthStoreFull runs the daemon with its state on a small tmpfs and
// fills it: the health route and hearth doctor say the store's writes
// fail because the disk is full, and say it is fine again once space is
// freed and a write goes through.
func TestHealthStoreFull(t *testing.T) {
	cfg := agentConfig(t)
	if err := syscall.Mount("tmpfs", cfg.StateDir, "tmpfs", 0, "size=32m"); err != nil {
		t.Skipf("mount a tmpfs at %s: %v", cfg.StateDir, err)
	}
	t.Cleanup(func() { syscall.Unmount(cfg.StateDir, syscall.MNT_DETACH) })
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if h, err := c.Health(ctx); err != nil || !h.StoreOk || h.Store != "ok" {
		t.Fatalf("Health on a fresh daemon = %+v, %v; want ok", h, err)
	}
	filler := filepath.Join(cfg.StateDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	// Each entry is small: write until the database needs a page it
	// cannot get (bounded).
	var addErr error
	for i := 0; i < 100000 && addErr == nil; i++ {
		_, addErr = c.AddCredits(ctx, 0.01, strings.Repeat("n", 1000))
	}
	if addErr == nil {
		t.Fatal("the daemon's store took 100 MB of ledger entries on a full disk")
	}
	var apiErr *client.APIError
	if !errors.As(addErr, &apiErr) || apiErr.Code != codeUnavailable || !strings.Contains(apiErr.Message, "store write failed") {
		t.Errorf("AddCredits on a full disk = %v; want unavailable, saying the store's write failed", addErr)
	}
	h, err := c.Health(ctx)
	if err != nil || h.StoreOk || !strings.HasPrefix(h.Store, "write failed: ") || !strings.Contains(h.Store, "full") || h.StoreFailingSince.IsZero() {
		t.Errorf("Health with the disk full = %+v, %v; want store write failed: ... full", h, err)
	}
	var check Check
	for _, ch := range Doctor(cfg).Checks {
		if ch.Name == "store" {
			check = ch
		}
	}
	if check.OK || !strings.Contains(check.Detail, "write failed") || !strings.Contains(check.Detail, "full") {
		t.Errorf("doctor's store check with the disk full = %+v; want not ok, saying the disk is full", check)
	}
	t.Logf("AddCredits: %v; doctor: %s", addErr, check.Detail)

	os.Remove(filler)
	if _, err := c.AddCredits(ctx, 0.01, "after"); err != nil {
		t.Fatalf("AddCredits after freeing space: %v", err)
	}
	if h, err := c.Health(ctx); err != nil || !h.StoreOk || !strings.HasPrefix(h.Store, "ok; the last write refused, at ") || !strings.Contains(h.Store, "full") {
		t.Errorf("Health after freeing space = %+v, %v; want ok, naming the last refusal", h, err)
	}
}
