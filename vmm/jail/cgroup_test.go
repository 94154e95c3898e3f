package jail

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCgroupV2 runs the v2 code on the host's cgroup2 hierarchy. On a v1
// or hybrid host that hierarchy has no controllers (v1 holds them), so it
// checks what v2 gives without any: membership, freezing, CPU time, and
// clear errors for limits it cannot set.
func TestCgroupV2(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	root := cgroupRoot
	if !cgroupV2() {
		root = "/sys/fs/cgroup/unified" // hybrid hosts mount v2 here
	}
	saved := cgroupRoot
	cgroupRoot = root
	defer func() { cgroupRoot = saved }()
	if !cgroupV2() {
		t.Skipf("no cgroup2 hierarchy at %s or %s", saved, root)
	}
	parent := "hearth-test/jail-" + filepath.Base(t.TempDir())
	defer os.Remove(filepath.Join(cgroupRoot, "hearth-test")) // last
	defer removeCgroupParent(parent)
	cg, err := newCgroup(parent, "v2")
	if err != nil {
		t.Fatal(err)
	}
	if !cg.v2 || cg.dirs[""] == "" {
		t.Fatalf("newCgroup on %s = %+v, want a v2 cgroup", cgroupRoot, cg)
	}
	if !cg.enabled("memory") {
		if err := cg.limit(64<<20, 0, 0); err == nil || !strings.Contains(err.Error(), "memory is not available") {
			t.Errorf("limit(memory) without the memory controller = %v, want it named as missing", err)
		}
	}
	count := filepath.Join(t.TempDir(), "count")
	proc := exec.Command("sh", "-c", `while :; do echo x >> "$1"; sleep 0.01; done`, "sh", count)
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { proc.Process.Kill(); proc.Wait(); cg.remove() }()
	if err := cg.add(proc.Process.Pid); err != nil {
		t.Fatal(err)
	}
	size := func() int64 { fi, _ := os.Stat(count); return fi.Size() }
	time.Sleep(100 * time.Millisecond)
	if err := cg.freeze(true); err != nil {
		t.Fatalf("freeze = %v", err)
	}
	if !cg.frozen() {
		t.Errorf("frozen() = false after freeze")
	}
	before := size()
	time.Sleep(200 * time.Millisecond)
	if after := size(); after != before {
		t.Errorf("a frozen process wrote %d bytes", after-before)
	}
	if err := cg.freeze(false); err != nil {
		t.Fatalf("thaw = %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if size() == before {
		t.Errorf("the thawed process did not go on")
	}
	if u := cg.usage(); u.CPUTime <= 0 {
		t.Errorf("usage() = %+v, want CPU time", u)
	}
}

// A busy machine must not get as much CPU as the daemon: the machines'
// parent cgroup weighs less than the daemon's.
func TestHostileCPUShares(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	parent := "hearth-test-cpu/jail-" + filepath.Base(t.TempDir())
	defer os.Remove(filepath.Join(cgroupRoot, "cpu", "hearth-test-cpu"))
	defer os.Remove(filepath.Join(cgroupRoot, "hearth-test-cpu"))
	defer removeCgroupParent(parent)
	cg, err := newCgroup(parent, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer cg.remove()
	file, def := filepath.Join(cgroupRoot, "cpu", "hearth-test-cpu", "cpu.shares"), 1024
	if cg.v2 {
		file, def = filepath.Join(cgroupRoot, "hearth-test-cpu", "cpu.weight"), 100
	} else if cg.dirs["cpu"] == "" {
		t.Skip("no cgroup v1 cpu controller on this host")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Skipf("no CPU weight to read: %v", err)
	}
	if w, _ := strconv.Atoi(strings.TrimSpace(string(b))); w <= 0 || w >= def {
		t.Errorf("%s = %s: machines weigh as much as the daemon (default %d)", file, b, def)
	}
}
