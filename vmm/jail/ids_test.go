package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

// Debian and Ubuntu give the first user 100000-165535 in /etc/subuid: the
// old fixed range of every jail. A pool that any line overlaps is refused
// with the line and the config key to change.
func TestHostileIDRangeOverlap(t *testing.T) {
	dir := t.TempDir()
	subuid, subgid := filepath.Join(dir, "subuid"), filepath.Join(dir, "subgid")
	os.WriteFile(subuid, []byte("# users\nalice:100000:65536\nbob:1073872896:65536\n"), 0o644)
	os.WriteFile(subgid, []byte("alice:100000:65536\n"), 0o644)
	saved := subIDFiles
	subIDFiles = []string{subuid, subgid}
	defer func() { subIDFiles = saved }()

	for _, c := range []struct {
		pool IDPool
		line string // "" if the pool is fine
	}{
		{IDPool{Base: 100000, Machines: 4}, `subuid line 2 "alice:100000:65536"`},
		{IDPool{Base: 1 << 30, Machines: 4}, `subuid line 3 "bob:1073872896:65536"`}, // bob has the pool's 3rd range
		{IDPool{Base: 1 << 30, Machines: 1}, ""},
		{IDPool{Base: 200000, Machines: 16}, ""},
	} {
		err := c.pool.Check()
		switch {
		case c.line == "" && err != nil:
			t.Errorf("pool %+v: %v, want it accepted", c.pool, err)
		case c.line != "" && (!errors.Is(err, ErrIDPool) || !strings.Contains(err.Error(), c.line) || !strings.Contains(err.Error(), "sandbox.id_base")):
			t.Errorf("pool %+v: %v, want ErrIDPool naming %s and sandbox.id_base", c.pool, err, c.line)
		}
	}
	// The driver refuses to start on an overlapping pool.
	if _, err := NewWithIDs(filepath.Join(dir, "jail"), "/bin/true", IDPool{Base: 100000, Machines: 4}); !errors.Is(err, ErrIDPool) {
		t.Errorf("NewWithIDs on alice's range = %v, want ErrIDPool", err)
	}
}

// Two machines get distinct host ids: a process of one, on the host,
// cannot signal the other's; and a file the agent of one made in the
// workspace is the agent's in the other too.
func TestHostileMachineIDRanges(t *testing.T) {
	d := newDriver(t)
	root := busyboxRoot(t)
	store, err := fs.Open(fs.Options{Dir: filepath.Join(t.TempDir(), "ws")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	owner := d.Capabilities().HostIDOffset + 1000
	if err := store.CreateSession("s", fs.Owner{UID: owner, GID: owner}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := func(id string) (vmm.Machine, uint32) {
		ids := viewIDs(t, d, id)
		view, err := store.Mount(filepath.Join(t.TempDir(), "view-"+id), fs.ViewOptions{Session: "s", IDs: ids})
		if err != nil {
			t.Fatal(err)
		}
		m, err := d.Create(ctx, vmm.Spec{ID: id, RootFS: root, Workspace: view.Dir(), UID: 1000, GID: 1000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Destroy(ctx); view.Unmount() })
		return m, ids.To
	}
	a, baseA := start("ids-a")
	b, baseB := start("ids-b")
	if baseA == baseB || baseA < IDBase+IDCount || baseB < IDBase+IDCount {
		t.Fatalf("machines' ranges start at %d and %d: want distinct ranges after the workspace's", baseA, baseB)
	}
	if again, _, _ := d.HostIDs("ids-a"); again != baseA {
		t.Errorf("HostIDs(ids-a) again = %d, want the recorded %d", again, baseA)
	}
	// A process with a's root's host ids signals a's agent (PID 1 of a),
	// but not b's.
	signal := func(pid int) error {
		kill := exec.Command("kill", "-0", fmt.Sprint(pid))
		kill.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: baseA, Gid: baseA}}
		out, err := kill.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := signal(a.(*machine).agent().pid); err != nil {
		t.Fatalf("host uid %d cannot signal its own machine's agent: %v", baseA, err)
	}
	if pidB := b.(*machine).agent().pid; signal(pidB) == nil {
		t.Errorf("root of machine a (host uid %d) may signal machine b's agent (pid %d)", baseA, pidB)
	}
	// The workspace: a writes, b (another range) appends, as the agent.
	if out, _ := vmmtest.Sh(t, a, "echo from-a > /workspace/agents/s/outputs/f && stat -c %u /workspace/agents/s/outputs/f"); out != "1000\n" {
		t.Errorf("machine a's file owner inside: %q, want 1000", out)
	}
	if out, _ := vmmtest.Sh(t, b, "echo from-b >> /workspace/agents/s/outputs/f && stat -c %u /workspace/agents/s/outputs/f"); out != "1000\n" {
		t.Errorf("machine b appending to a's file: %q, want owner 1000 inside", out)
	}
	data, err := store.ReadFile("s", "", "outputs/f", 0)
	if err != nil || string(data) != "from-a\nfrom-b\n" {
		t.Errorf("the file holds %q, %v", data, err)
	}
}

// Two drivers on one host (two appliances, or tests) never hand out the
// same range; a range whose driver's state is gone is taken again.
func TestHostileIDRangesAcrossDrivers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the jail driver needs root")
	}
	saved := hostIDClaims
	hostIDClaims = filepath.Join(t.TempDir(), "claims")
	defer func() { hostIDClaims = saved }()
	pool := IDPool{Base: IDBase, Machines: 2}
	dirs := []string{filepath.Join(t.TempDir(), "one"), filepath.Join(t.TempDir(), "two")}
	var ds []*Driver
	for _, dir := range dirs {
		d, err := NewWithIDs(dir, "/bin/true", pool)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds = append(ds, d)
	}
	a, _, err1 := ds[0].HostIDs("m")
	b, _, err2 := ds[1].HostIDs("m")
	if err1 != nil || err2 != nil || a == b {
		t.Fatalf("machine m of two drivers: ranges %d (%v) and %d (%v), want two distinct", a, err1, b, err2)
	}
	if _, _, err := ds[1].HostIDs("n"); err == nil {
		t.Errorf("a third range from a pool of two: no error")
	}
	// The first driver's state goes (a test's temporary directory): its
	// range is free for the second.
	os.RemoveAll(dirs[0])
	if c, _, err := ds[1].HostIDs("n"); err != nil || c != a {
		t.Errorf("after the first driver's state is gone: %d, %v; want its range %d", c, err, a)
	}
	// Releasing frees the range for the next machine.
	ds[1].releaseIDs("m")
	if c, _, err := ds[1].HostIDs("o"); err != nil || c != b {
		t.Errorf("after releasing m: %d, %v; want m's range %d", c, err, b)
	}
}
