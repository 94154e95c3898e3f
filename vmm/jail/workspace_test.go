package jail

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

// TestWorkspaceInJail mounts the real workspace view of session a into a
// jail: a writes its own outputs, reads b's, and cannot write b's.
func TestWorkspaceInJail(t *testing.T) {
	d := newDriver(t)
	root := busyboxRoot(t)
	store, err := fs.Open(fs.Options{Dir: filepath.Join(t.TempDir(), "ws")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, s := range []string{"a", "b"} {
		if err := store.CreateSession(s, fs.Owner{UID: 1000 + IDBase, GID: 1000 + IDBase}); err != nil {
			t.Fatal(err)
		}
	}
	store.WriteFile("b", "outputs/report.md", strings.NewReader("b's report"), 0, fs.Owner{UID: 1000 + IDBase, GID: 1000 + IDBase})
	ids := viewIDs(t, d, "ws-a")
	view, err := store.Mount(filepath.Join(t.TempDir(), "view-a"), fs.ViewOptions{Session: "a", IDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	defer view.Unmount()
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "ws-a", RootFS: root, Workspace: view.Dir(), UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Destroy(ctx)
	checks := []struct{ name, script, want string }{
		{"write own outputs", "echo mine > /workspace/agents/a/outputs/x.md && cat /workspace/agents/a/outputs/x.md", "mine\n"},
		{"read other's outputs", "cat /workspace/agents/b/outputs/report.md", "b's report"},
		{"other's home hidden", "ls -a /workspace/agents/b", ".\n..\ninputs\noutputs\n"},
	}
	for _, c := range checks {
		if out, _ := vmmtest.Sh(t, m, c.script); out != c.want {
			t.Errorf("%s: %q = %q, want %q", c.name, c.script, out, c.want)
		}
	}
	// Refused by the view: EACCES (no write bits shown) or EROFS.
	out, _ := vmmtest.Sh(t, m, "(echo no > /workspace/agents/b/outputs/y.md) 2>&1; echo rc=$?")
	if !strings.HasSuffix(out, "rc=1\n") || !(strings.Contains(out, "Permission denied") || strings.Contains(out, "Read-only")) {
		t.Errorf("writing b's outputs from a's machine: %q, want refused", out)
	}
	got, err := store.ReadFile("a", "", "outputs/x.md", 0)
	if err != nil || string(got) != "mine\n" {
		t.Errorf("the host sees a's write as %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(view.Dir(), "b/outputs/y.md")); err == nil {
		t.Errorf("a's refused write to b exists")
	}
	// A new view replaces the old one in the running machine, as after a
	// daemon restart: here b's view, so b becomes the writable session.
	viewB, err := store.Mount(filepath.Join(t.TempDir(), "view-b"), fs.ViewOptions{Session: "b", IDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		m.Destroy(ctx) // a view in use cannot unmount
		viewB.Unmount()
	}()
	if err := m.(vmm.WorkspaceAttacher).AttachWorkspace(ctx, viewB.Dir()); err != nil {
		t.Fatalf("AttachWorkspace = %v", err)
	}
	if out, _ := vmmtest.Sh(t, m, "echo now > /workspace/agents/b/outputs/y.md && cat /workspace/agents/b/outputs/y.md"); out != "now\n" {
		t.Errorf("writing b's outputs through the attached view: %q, want now", out)
	}
	// Nothing holds the old view any more: it unmounts at once.
	done := make(chan error, 1)
	go func() { done <- view.Unmount() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("unmount the replaced view = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the replaced view is still busy after 10s")
	}
}

// TestMachinesAreSeparate: one machine's writable layer and processes are
// invisible to another, and one hitting its memory limit leaves the
// other working.
func TestMachinesAreSeparate(t *testing.T) {
	d := newDriver(t)
	root := busyboxRoot(t)
	ctx := context.Background()
	a, err := d.Create(ctx, vmm.Spec{ID: "sep-a", RootFS: root, UID: 1000, GID: 1000, Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy(ctx)
	b, err := d.Create(ctx, vmm.Spec{ID: "sep-b", RootFS: root, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy(ctx)
	// /home/agent is in each machine's writable layer, /tmp on its tmpfs.
	vmmtest.Sh(t, a, "echo secret > /home/agent/a-only; echo secret > /tmp/a-only; sleep 60 >/dev/null 2>&1 &")
	if out, _ := vmmtest.Sh(t, b, "ls /home/agent /tmp; ps -o args= | grep -c '[s]leep 60' || true"); strings.Contains(out, "a-only") || !strings.HasSuffix(out, "0\n") {
		t.Errorf("machine b sees a's files or processes: %q", out)
	}
	// No way out but loopback: no routes, and connecting elsewhere fails.
	if out, _ := vmmtest.Sh(t, b, "tail -n +2 /proc/net/route | wc -l; nc -w 1 192.0.2.1 80 </dev/null 2>&1 && echo connected || echo unreachable"); !strings.HasPrefix(out, "0\n") || !strings.HasSuffix(out, "unreachable\n") {
		t.Errorf("machine b's network: %q, want no routes and no connection", out)
	}
	vmmtest.Sh(t, a, "head -c 400000000 /dev/zero | tail -n 1 > /dev/null")
	if out, _ := vmmtest.Sh(t, b, "echo fine"); out != "fine\n" {
		t.Errorf("machine b after a hit its memory limit: %q", out)
	}
}

// viewIDs reserves machine's host ids and returns the shift its workspace
// view needs, as the appliance does.
func viewIDs(t testing.TB, d *Driver, machine string) fs.IDShift {
	t.Helper()
	base, size, err := d.HostIDs(machine)
	if err != nil {
		t.Fatal(err)
	}
	return fs.IDShift{From: d.Capabilities().HostIDOffset, To: base, Size: size}
}
