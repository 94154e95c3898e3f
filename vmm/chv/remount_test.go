package chv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"hearth/vmm"
	"hearth/vmm/guest"
	"hearth/vmm/vmmtest"
)

// TestCheckpointRemountsWorkspace: a memory checkpoint unplugs the
// workspace and plugs a new one in, which kills the guest's mount of it
// (the double does that as a real guest's kernel would); the driver has
// the guest mount it again, so a write after the checkpoint lands in the
// workspace as one before it did. Without the remount the write fails,
// a failed remount is reported in the result and the audit event, and a
// restore from the memory snapshot mounts the workspace again too.
func TestCheckpointRemountsWorkspace(t *testing.T) {
	needVirtiofsd(t)
	d, spec := doubleDriver(t)
	var mu sync.Mutex
	var events []vmm.Event
	d.OnEvent(func(e vmm.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	lastEvent := func() vmm.Event { mu.Lock(); defer mu.Unlock(); return events[len(events)-1] }
	s := spec("remount")
	s.Workspace = t.TempDir()
	m := create(t, d, s)
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{serialLog, vmmLog} {
				b, _ := os.ReadFile(m.path(f))
				t.Logf("%s:\n%s", f, b)
			}
		}
	})
	ctx := context.Background()
	write := func(name string) bool {
		t.Helper()
		out, _ := vmmtest.Sh(t, m, fmt.Sprintf("echo %s > /workspace/agents/%s 2>/dev/null && echo wrote || echo failed", name, name))
		if out == "wrote\n" {
			if b, err := os.ReadFile(filepath.Join(s.Workspace, name)); err != nil || string(b) != name+"\n" {
				t.Errorf("the guest wrote %s, but the workspace has %q, %v", name, b, err)
			}
		}
		return out == "wrote\n"
	}
	if !write("before") {
		t.Fatal("writing to the workspace failed before any checkpoint")
	}

	snap, err := m.TakeSnapshot(ctx, "one")
	if err != nil {
		t.Fatalf("TakeSnapshot = %v", err)
	}
	if !snap.WorkspaceDetached || !snap.WorkspaceRemounted || snap.WorkspaceError != "" {
		t.Errorf("TakeSnapshot = %+v, want the workspace detached and mounted again", snap)
	}
	if !write("after") {
		t.Error("writing to the workspace after a memory checkpoint failed")
	}
	if e := lastEvent(); e.Kind != "checkpoint" || !strings.Contains(e.Detail, "mounted again in the guest") {
		t.Errorf("event %+v, want a checkpoint saying the workspace was mounted again", e)
	}

	// The driver skips the remount: the guest's workspace stays dead.
	m.remount = func(*guest.Client, context.Context) error { return nil }
	if _, err := m.TakeSnapshot(ctx, "skipped"); err != nil {
		t.Fatalf("TakeSnapshot(skipped) = %v; events %+v", err, events)
	}
	if write("lost") {
		t.Fatal("writing to the workspace after a checkpoint that did not remount it succeeded: the double does not kill the guest's mount on unplug")
	}

	// The guest fails to remount: the result and the event say so.
	m.remount = func(*guest.Client, context.Context) error {
		return fmt.Errorf("%w: remount refused by the test", guest.ErrNotSupported)
	}
	snap, err = m.TakeSnapshot(ctx, "failed")
	if err != nil {
		t.Fatalf("TakeSnapshot(failed) = %v, want the checkpoint saved", err)
	}
	if snap.WorkspaceRemounted || !strings.Contains(snap.WorkspaceError, "remount refused by the test") {
		t.Errorf("TakeSnapshot(failed) = %+v, want the remount's error", snap)
	}
	if e := lastEvent(); !strings.Contains(e.Detail, "NOT mounted again") || !strings.Contains(e.Detail, "remount refused") {
		t.Errorf("event %+v, want it to say the workspace was not mounted again, and why", e)
	}
	m.remount = nil

	// A restore from the memory snapshot brings the workspace back.
	if err := m.Restore(ctx, "one"); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	if e := lastEvent(); e.Kind != "restore" || !strings.Contains(e.Detail, "mounted again in the guest") {
		t.Errorf("event %+v, want a restore saying the workspace was mounted again", e)
	}
	if !write("restored") {
		t.Error("writing to the workspace after a restore failed")
	}
	// The guest can be asked again at any time; the workspace stays.
	if err := m.Guest().RemountWorkspace(ctx); err != nil {
		t.Errorf("RemountWorkspace = %v", err)
	}
	if !write("again") {
		t.Error("writing to the workspace after a second remount failed")
	}
}
