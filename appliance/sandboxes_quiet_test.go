package appliance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSandboxPauseQuietWaitsForLookups: a daemon about to stop pauses a
// sandbox only at a moment when its workspace view has resolved no name
// for lookupGap: a process caught between resolving a path and opening
// it would fail to open it after the restart (seen at the pause test's
// restart while running, under QEMU). Here names are resolved through
// the view without a pause every millisecond for 1.5 s; the pause kept
// must come after them.
func TestSandboxPauseQuietWaitsForLookups(t *testing.T) {
	cfg := sandboxConfig(t)
	d, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "quiet", Session: "qs", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	s, err := d.sbx.get("quiet")
	if err != nil {
		t.Fatal(err)
	}
	busy := 1500 * time.Millisecond
	stop := time.Now().Add(busy)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; time.Now().Before(stop); i++ {
			os.Stat(filepath.Join(s.view.Dir(), "qs", "outputs", fmt.Sprintf("nothing%d", i)))
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(20 * time.Millisecond) // the first lookups are in
	s.mu.Lock()
	open, err := d.sbx.pauseQuiet(ctx, s)
	kept := time.Now()
	s.mu.Unlock()
	<-done
	if err != nil || open != 0 {
		t.Fatalf("pauseQuiet = %d open, %v", open, err)
	}
	if kept.Before(stop) {
		t.Fatalf("pauseQuiet kept a pause %v before the lookups ended", stop.Sub(kept))
	}
	if last := s.view.LastLookup(); last.IsZero() {
		t.Fatal("the view saw no lookup: the test resolved nothing through it")
	}
	if err := s.m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}
