package appliance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"hearth/vmm"
)

// pauseTimes is a real machine whose pauses are timed.
type pauseTimes struct {
	vmm.Machine
	last time.Time // when the last Pause returned
}

func (p *pauseTimes) Pause(ctx context.Context) error {
	err := p.Machine.Pause(ctx)
	p.last = time.Now()
	return err
}

// TestSandboxPauseQuietWaitsForLookups: a daemon about to stop pauses a
// sandbox only at a moment when its workspace view has resolved no name
// for lookupGap: a process caught between resolving a path and opening
// it would fail to open it after the restart (seen at the pause test's
// restart while running, under QEMU). Here names are resolved through
// the view, each a new one, every millisecond or so for 1.5 s; no name
// may have been resolved in the lookupGap before the pause kept.
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
	type span struct{ start, end time.Time }
	var mu sync.Mutex
	var stats []span
	stop := time.Now().Add(1500 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; time.Now().Before(stop); i++ {
			began := time.Now()
			os.Stat(filepath.Join(s.view.Dir(), "qs", "outputs", fmt.Sprintf("nothing%d", i)))
			mu.Lock()
			stats = append(stats, span{began, time.Now()})
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(20 * time.Millisecond) // the first lookups are in
	s.mu.Lock()
	timed := &pauseTimes{Machine: s.m}
	s.m = timed
	open, err := d.sbx.pauseQuiet(ctx, s)
	s.m = timed.Machine
	s.mu.Unlock()
	<-done
	if err != nil || open != 0 {
		t.Fatalf("pauseQuiet = %d open, %v", open, err)
	}
	if s.view.LastLookup().IsZero() || len(stats) < 10 {
		t.Fatalf("the view saw no lookup (%d stats): the test resolved nothing through it", len(stats))
	}
	for _, st := range stats {
		if st.start.After(timed.last.Add(-lookupGap)) && st.end.Before(timed.last) {
			t.Fatalf("pauseQuiet kept a pause less than %v after a name was resolved (a stat that ended %v before it)",
				lookupGap, timed.last.Sub(st.end))
		}
	}
	if err := s.m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}
