package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/fs"
	"hearth/vmm"
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
		{"mounted over virtio-fs", "grep -c '^workspace /workspace/agents virtiofs' /proc/mounts", "1\n"},
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
