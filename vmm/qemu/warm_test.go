package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

func newWarmDriver(t testing.TB, dir string) *Driver {
	t.Helper()
	bt := boot(t)
	d, err := New(Config{Dir: dir, Kernel: bt.Kernel, Initramfs: bt.Initramfs, AllowTCG: true, NoKVM: testNoKVM, Warm: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reapAll(d) })
	return d
}

// spares lists the spare directories of a driver's state directory.
func spares(t testing.TB, dir string) []string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(dir, "spares"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestWarmMachines takes a machine booted ahead of time: it gets its
// session's hostname, default user and workspace view, survives a daemon
// restart (its directory moved after QEMU started), and a new spare of its
// shape is booted after it; Close shuts the spares down, and a driver
// that finds spares an earlier one left removes them.
func TestWarmMachines(t *testing.T) {
	requireVirtiofsd(t)
	root := busyboxImage(t)
	dir := filepath.Join(t.TempDir(), "qemu")
	d := newWarmDriver(t, dir)
	ctx := context.Background()
	view := t.TempDir()
	os.Chmod(view, 0o777)
	os.WriteFile(filepath.Join(view, "hello"), []byte("from the host\n"), 0o644)
	spec := vmm.Spec{ID: "warm-a", Hostname: "alpha", RootFS: root, Workspace: view, UID: 1000, GID: 1000, Memory: 256 << 20}
	if err := d.Warm(ctx, spec); err != nil {
		t.Fatalf("Warm = %v", err)
	}
	if got := spares(t, dir); len(got) != 1 {
		t.Fatalf("after Warm, spares/ holds %v, want one spare", got)
	}
	// The spare waits paused, its clock standing still.
	time.Sleep(3 * time.Second)
	start := time.Now()
	m, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	t.Cleanup(func() { m.Destroy(ctx) })
	took := time.Since(start)
	log, _ := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	if !strings.Contains(string(log), `took warm machine spare-`) {
		t.Fatalf("Create did not take the warm machine (%v); audit log:\n%s", took, log)
	}
	t.Logf("warm Create took %v", took)
	for _, c := range []struct{ script, want string }{
		{"hostname", "alpha\n"},
		{"id -u; id -g", "1000\n1000\n"},
		{"cat /workspace/agents/hello", "from the host\n"},
		{"echo back > /workspace/agents/reply && echo ok", "ok\n"},
	} {
		if out, _ := vmmtest.Sh(t, m, c.script); out != c.want {
			t.Errorf("%q in the warm machine = %q, want %q", c.script, out, c.want)
		}
	}
	out, _ := vmmtest.Sh(t, m, "date +%s")
	if guest, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); err != nil || guest < time.Now().Unix()-1 || guest > time.Now().Unix()+1 {
		t.Errorf("the warm machine's clock says %q, the host's %d", out, time.Now().Unix())
	}
	if b, err := os.ReadFile(filepath.Join(view, "reply")); err != nil || string(b) != "back\n" {
		t.Errorf("the guest's write reached the view as %q, %v", b, err)
	}
	// The next spare of the shape boots in the background.
	if err := d.Warm(ctx, spec); err != nil {
		t.Fatalf("Warm after a take = %v", err)
	}
	// A daemon restart: the machine's QEMU and virtiofsd were started in
	// spares/, their directory is now machines/warm-a.
	m.Guest().Close() // as the daemon's end would
	d.Close()
	if got := spares(t, dir); len(got) != 0 {
		t.Errorf("after Close, spares/ holds %v, want none", got)
	}
	d2 := newWarmDriver(t, dir)
	m2, err := d2.Recover(ctx, "warm-a")
	if err != nil {
		t.Fatalf("Recover of a machine that was warm = %v", err)
	}
	if out, _ := vmmtest.Sh(t, m2, "hostname; cat /workspace/agents/reply"); out != "alpha\nback\n" {
		t.Errorf("after Recover: %q", out)
	}
	if err := m2.Destroy(ctx); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "machines", "warm-a")); !os.IsNotExist(err) {
		t.Errorf("machines/warm-a after Destroy: %v", err)
	}
	if err := d2.Warm(ctx, spec); err != nil {
		t.Fatalf("Warm = %v", err)
	}
	// The driver dies with its spare running: the next one removes it.
	pid := readPID(filepath.Join(dir, "spares", spares(t, dir)[0], qemuPID))
	d2.audit.Close()
	d3 := newWarmDriver(t, dir)
	defer d3.Close()
	if got := spares(t, dir); len(got) != 0 {
		t.Errorf("a new driver left the dead one's spares: %v", got)
	}
	if pid <= 0 || processAlive(pid) {
		t.Errorf("the dead driver's spare QEMU (pid %d) still runs", pid)
	}
}

// TestWarmShapes: a machine of another shape than the spares' boots
// afresh, and a rebuilt image is another shape.
func TestWarmShapes(t *testing.T) {
	root := busyboxImage(t)
	dir := filepath.Join(t.TempDir(), "qemu")
	d := newWarmDriver(t, dir)
	defer d.Close()
	ctx := context.Background()
	spec := vmm.Spec{ID: "shape-a", RootFS: root, UID: 1000, GID: 1000, Memory: 256 << 20}
	if err := d.Warm(ctx, spec); err != nil {
		t.Fatalf("Warm = %v", err)
	}
	took := func(id string) bool {
		log, _ := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, `"`+id+`"`) && strings.Contains(l, "took warm machine") {
				return true
			}
		}
		return false
	}
	other := spec
	other.ID, other.Memory = "shape-b", 300<<20
	m, err := d.Create(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	m.Destroy(ctx)
	if took("shape-b") {
		t.Errorf("a machine with other memory took the spare")
	}
	// The image is rebuilt: its disk changes.
	later := time.Now().Add(time.Minute)
	os.Chtimes(root+".ext4", later, later)
	if m, err = d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	m.Destroy(ctx)
	if took("shape-a") {
		t.Errorf("a machine of a rebuilt image took a spare of the old one")
	}
	if out, _ := vmmtest.Sh(t, mustCreate(t, d, spec, "shape-c"), "echo up"); out != "up\n" {
		t.Errorf("a machine after the rebuild: %q", out)
	}
}

func mustCreate(t *testing.T, d *Driver, spec vmm.Spec, id string) vmm.Machine {
	t.Helper()
	spec.ID = id
	m, err := d.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(context.Background()) })
	return m
}

func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestClockAfterPause: a VM's clock stands still while it is paused;
// Resume puts it right.
func TestClockAfterPause(t *testing.T) {
	d := newDriver(t)
	root := busyboxImage(t)
	m := mustCreate(t, d, vmm.Spec{RootFS: root, UID: 1000, GID: 1000, Memory: 256 << 20}, "clock")
	ctx := context.Background()
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	out, _ := vmmtest.Sh(t, m, "date +%s")
	if guest, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); err != nil || guest < time.Now().Unix()-1 || guest > time.Now().Unix()+1 {
		t.Errorf("after a pause of 3 s the VM's clock says %q, the host's %d", out, time.Now().Unix())
	}
}
