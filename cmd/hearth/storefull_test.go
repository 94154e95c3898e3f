package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestAgentStoreFull fills the file system under the daemon's store while
// an execution works through seven scripted model calls: through the API
// the execution ends failed within a bounded time saying the store is
// full, the health route says so, no further call is made, and once space
// is freed the store's file records why and the reservation is released.
func TestAgentStoreFull(t *testing.T) {
	var turns []modeltest.Turn
	for i := range 6 {
		turns = append(turns, bash(fmt.Sprintf("sleep 1; seq %d 8000", i)))
	}
	turns = append(turns, say("done"))
	_, cfg := agentDaemon(t, modeltest.Config{Turns: turns}, true, func(stateDir string) {
		if err := syscall.Mount("tmpfs", stateDir, "tmpfs", 0, "size=32m"); err != nil {
			t.Skipf("mount a tmpfs at %s: %v", stateDir, err)
		}
		t.Cleanup(func() { syscall.Unmount(stateDir, syscall.MNT_DETACH) })
	})
	c := client.New(cfg.SocketPath())
	ctx := context.Background()
	if _, err := c.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	x, err := c.Delegate(ctx, client.DelegateRequest{Agent: "analyst", Prompt: "count"})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		page, err := c.Events(ctx, x.Id, 0, 0)
		if err == nil && slices.ContainsFunc(page.Events, func(ev client.Event) bool { return ev.Type == "model_call" }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no model call within 2 minutes: %v", err)
		}
	}
	filler := filepath.Join(cfg.StateDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 64<<10); ; {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	filled := time.Now()
	for {
		x, err = c.Execution(ctx, x.Id)
		if err == nil && x.Status != "running" && x.Status != "pending" {
			break
		}
		if time.Since(filled) > 90*time.Second {
			t.Fatalf("the execution was still %s 90s after the disk filled (%v)", x.Status, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("ended %s %v after the disk filled, %d turns, $%.4f: %s", x.Status, time.Since(filled).Round(time.Millisecond), x.Turns, x.Usd, x.Error)
	if x.Status != "failed" || !strings.Contains(x.Error, "store") || !strings.Contains(x.Error, "full") {
		t.Fatalf("execution = %s %q; want failed saying the store is full", x.Status, x.Error)
	}
	if x.Turns >= 7 {
		t.Errorf("%d turns: the calls after the store failed were not refused", x.Turns)
	}
	// Writes that fit in pages SQLite already holds may go through again
	// on the full disk, so the health says either that writes fail or
	// that the last one refused was for a full disk.
	if h, err := c.Health(ctx); err != nil || !strings.Contains(h.Store, "full") {
		t.Errorf("health with the disk full = %+v, %v; want the store's write failing, or its last refusal, for a full disk", h, err)
	}

	os.Remove(filler)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(cfg.StateDir, "hearth.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var status, why string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := db.QueryRow("SELECT status, error FROM executions WHERE id = ?", x.Id).Scan(&status, &why)
		if err == nil && status == "failed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after freeing space the store's file says %q %q (%v); want failed with the reason", status, why, err)
		}
	}
	if why != x.Error {
		t.Errorf("the file's error = %q, want %q", why, x.Error)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		cr, err := c.Credits(ctx)
		if err == nil && cr.Reserved == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after freeing space: credits %+v, %v; want the reservation released", cr, err)
		}
	}
}
