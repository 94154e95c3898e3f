package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/share"
	"hearth/vmm/vmmtest"
)

// TestWorkspaceOverVirtiofs gives a VM session a's real workspace view
// over virtio-fs: what the guest writes to a's outputs reaches the store
// and session b's view on the host, it reads b's outputs, and it cannot
// write them.
func TestWorkspaceOverVirtiofs(t *testing.T) {
	d := newDriver(t)
	requireVirtiofsd(t)
	root := busyboxImage(t)
	store, err := fs.Open(fs.Options{Dir: filepath.Join(t.TempDir(), "ws")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	agent := fs.Owner{UID: 1000, GID: 1000} // a VM's ids are the host's
	for _, s := range []string{"a", "b"} {
		if err := store.CreateSession(s, agent); err != nil {
			t.Fatal(err)
		}
	}
	store.WriteFile("b", "outputs/report.md", strings.NewReader("b's report"), 0, agent)
	views := map[string]*fs.View{}
	for _, s := range []string{"a", "b"} {
		v, err := store.Mount(filepath.Join(t.TempDir(), "view-"+s), fs.ViewOptions{Session: s})
		if err != nil {
			t.Fatal(err)
		}
		views[s] = v
	}
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "ws-a", RootFS: root, Workspace: views["a"].Dir(), UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		m.Destroy(ctx) // a view in use cannot unmount
		for _, v := range views {
			v.Unmount()
		}
	}()
	checks := []struct{ name, script, want string }{
		{"write own outputs", "echo mine > /workspace/agents/a/outputs/x.md && cat /workspace/agents/a/outputs/x.md", "mine\n"},
		{"read other's outputs", "cat /workspace/agents/b/outputs/report.md", "b's report"},
		{"share mounted over virtio-fs", "grep -c '^workspace " + share.GuestMount + " virtiofs' /proc/mounts", "1\n"},
		{"agents reached through the share", "readlink /workspace/agents", share.GuestAgents + "\n"},
	}
	for _, c := range checks {
		if out, _ := vmmtest.Sh(t, m, c.script); out != c.want {
			t.Errorf("%s: %q = %q, want %q", c.name, c.script, out, c.want)
		}
	}
	out, _ := vmmtest.Sh(t, m, "(echo no > /workspace/agents/b/outputs/y.md) 2>&1; echo rc=$?")
	if !strings.HasSuffix(out, "rc=1\n") || !(strings.Contains(out, "Permission denied") || strings.Contains(out, "Read-only")) {
		t.Errorf("writing b's outputs from a's VM: %q, want refused", out)
	}
	if got, err := store.ReadFile("a", "", "outputs/x.md", 0); err != nil || string(got) != "mine\n" {
		t.Errorf("the store has a's write as %q, %v; want mine", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(views["b"].Dir(), "a/outputs/x.md")); err != nil || string(got) != "mine\n" {
		t.Errorf("b's view shows a's write as %q, %v; want mine", got, err)
	}
	if _, err := os.Stat(filepath.Join(views["a"].Dir(), "b/outputs/y.md")); err == nil {
		t.Errorf("a's refused write to b exists")
	}
	// A restored machine boots again with a new virtiofsd on the view.
	c := m.(vmm.Checkpointer)
	if err := c.Checkpoint(ctx, "ws"); err != nil {
		t.Fatalf("Checkpoint = %v", err)
	}
	if err := c.Restore(ctx, "ws"); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	if out, _ := vmmtest.Sh(t, m, "cat /workspace/agents/a/outputs/x.md"); out != "mine\n" {
		t.Errorf("after Restore, a's output reads %q, want mine", out)
	}
}

// TestWorkspaceAttach does what a daemon restart does to a VM's
// workspace: the view it was given dies (unmounted, its FUSE connection
// aborted), a new view of the same session is mounted elsewhere, and
// AttachWorkspace puts it in place. New writes from the running VM then
// land in the store again, and it reads what it wrote before.
func TestWorkspaceAttach(t *testing.T) {
	d := newDriver(t)
	requireVirtiofsd(t)
	root := busyboxImage(t)
	store, old := sessionA(t, fs.Owner{UID: 1000, GID: 1000})
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "attach", RootFS: root, Workspace: old.Dir(), UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var fresh *fs.View
	defer func() {
		m.Destroy(ctx)
		if fresh != nil {
			fresh.Unmount()
		}
	}()
	if out, _ := vmmtest.Sh(t, m, "echo before > /workspace/agents/a/outputs/before.md && echo ok"); out != "ok\n" {
		t.Fatalf("writing through the first view: %q", out)
	}
	// The daemon dies: its view goes, though the machine still holds it.
	if err := old.Unmount(); err != nil {
		t.Fatalf("Unmount the old view = %v", err)
	}
	time.Sleep(entryTimeout + 100*time.Millisecond)
	if out, _ := vmmtest.Sh(t, m, "echo lost > /workspace/agents/a/outputs/lost.md 2>/dev/null && echo wrote || echo failed"); out != "failed\n" {
		t.Errorf("writing through the dead view: %q, want failed", out)
	}
	fresh, err = store.Mount(filepath.Join(t.TempDir(), "view-new"), fs.ViewOptions{Session: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.(vmm.WorkspaceAttacher).AttachWorkspace(ctx, fresh.Dir()); err != nil {
		t.Fatalf("AttachWorkspace = %v", err)
	}
	if out, _ := vmmtest.Sh(t, m, "cat /workspace/agents/a/outputs/before.md && echo after > /workspace/agents/a/outputs/after.md && echo ok"); out != "before\nok\n" {
		t.Errorf("after AttachWorkspace, reading and writing a's outputs: %q, want before and ok", out)
	}
	if got, err := store.ReadFile("a", "", "outputs/after.md", 0); err != nil || string(got) != "after\n" {
		t.Errorf("the store has the write made after AttachWorkspace as %q, %v; want after", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(fresh.Dir(), "a/outputs/after.md")); err != nil || string(got) != "after\n" {
		t.Errorf("the new view shows %q, %v; want after", got, err)
	}
	// Bad input leaves the machine with the view it has.
	if err := m.(vmm.WorkspaceAttacher).AttachWorkspace(ctx, filepath.Join(t.TempDir(), "none")); err == nil || !strings.Contains(err.Error(), "workspace view") {
		t.Errorf("AttachWorkspace(missing dir) = %v, want an error naming the workspace view", err)
	}
	if out, _ := vmmtest.Sh(t, m, "cat /workspace/agents/a/outputs/after.md"); out != "after\n" {
		t.Errorf("after a refused AttachWorkspace: %q, want the view as it was", out)
	}
	// A machine made without a workspace has nothing to attach to.
	bare, err := d.Create(ctx, vmm.Spec{ID: "attach-bare", RootFS: root, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Destroy(ctx)
	if err := bare.(vmm.WorkspaceAttacher).AttachWorkspace(ctx, fresh.Dir()); err == nil || !strings.Contains(err.Error(), "Spec.Workspace") {
		t.Errorf("AttachWorkspace on a machine made without a workspace = %v, want an error saying to give Spec.Workspace", err)
	}
}

// TestWorkspaceAttachWhilePaused does what a daemon restart does to a VM
// paused across it: the VM's view dies while the VM is paused, a new
// view is attached, and the VM resumes. A counter in the guest appends a
// line to the workspace every 50 ms through it all: the guest must
// reach the new view at once on resume: no line lost silently, and at
// most the write in flight at the pause failed (its file was opened in
// the dead view) and told so. It looked the share's entry up just before
// the pause: a guest that kept that entry would write into the dead view
// until it expired, in guest time, which stands still while paused.
func TestWorkspaceAttachWhilePaused(t *testing.T) {
	d := newDriver(t)
	requireVirtiofsd(t)
	root := busyboxImage(t)
	store, old := sessionA(t, fs.Owner{UID: 1000, GID: 1000})
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "attach-paused", RootFS: root, Workspace: old.Dir(), UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var fresh *fs.View
	defer func() {
		m.Destroy(ctx)
		if fresh != nil {
			fresh.Unmount()
		}
	}()
	const counter = "/workspace/agents/a/outputs/counter"
	if out, _ := vmmtest.Sh(t, m, `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i >> `+counter+` || echo lost $i >> /tmp/lost; sleep 0.05; done' </dev/null >/dev/null 2>&1 & echo ok`); out != "ok\n" {
		t.Fatalf("starting the counter: %q", out)
	}
	lines := func() []string {
		out, _ := vmmtest.Sh(t, m, "cat "+counter)
		return strings.Fields(out)
	}
	for deadline := time.Now().Add(10 * time.Second); len(lines()) < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the counter did not start: %q", lines())
		}
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	if err := old.Unmount(); err != nil {
		t.Fatalf("Unmount the old view = %v", err)
	}
	fresh, err = store.Mount(filepath.Join(t.TempDir(), "view-new"), fs.ViewOptions{Session: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.(vmm.WorkspaceAttacher).AttachWorkspace(ctx, fresh.Dir()); err != nil {
		t.Fatalf("AttachWorkspace = %v", err)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	before := len(lines())
	for deadline := time.Now().Add(10 * time.Second); len(lines()) < before+5; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the counter did not move on after the resume: %d lines", len(lines()))
		}
	}
	// A write whose file was opened before the pause fails (its view
	// died): the writer is told, and it can be only the first one.
	lost, _ := vmmtest.Sh(t, m, "cat /tmp/lost 2>/dev/null; echo")
	if n, err := vmmtest.UnbrokenCount(lines(), strings.Fields(strings.ReplaceAll(lost, "lost", ""))); err != nil || n > 1 {
		t.Fatalf("the counter across the pause: %v; %d writes failed (%q): the guest did not reach the new view at once", err, n, lost)
	}
}

// sessionA is a workspace store with session "a" of owner, and a view
// of it mounted, both gone when t ends.
func sessionA(t *testing.T, owner fs.Owner) (*fs.Store, *fs.View) {
	t.Helper()
	store, err := fs.Open(fs.Options{Dir: filepath.Join(t.TempDir(), "ws")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.CreateSession("a", owner); err != nil {
		t.Fatal(err)
	}
	v, err := store.Mount(filepath.Join(t.TempDir(), "view-old"), fs.ViewOptions{Session: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Unmount() })
	return store, v
}
