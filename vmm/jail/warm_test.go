package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
	"hearth/vmm/vmmtest"

	"golang.org/x/sys/unix"
)

// warmDriver is newDriver keeping n jails prepared per shape.
func warmDriver(t *testing.T, n int) *Driver {
	d := newDriver(t)
	d.SetWarm(n)
	return d
}

// claimed reports whether machine id was made from a prepared jail, as
// the audit log says.
func claimed(t *testing.T, d *Driver, id string) bool {
	b, err := os.ReadFile(filepath.Join(d.dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"machine":"`+id+`"`) && strings.Contains(line, "claimed prepared jail") {
			return true
		}
	}
	return false
}

// warmCreate makes sure a spare of spec's shape is ready, then creates
// the machine, which must claim it.
func warmCreate(t *testing.T, d *Driver, spec vmm.Spec) *machine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Warm(ctx, spec); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	m, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", spec.ID, err)
	}
	t.Cleanup(func() { m.Destroy(context.Background()) })
	if !claimed(t, d, spec.ID) {
		t.Fatalf("Create(%s) did not claim the prepared jail", spec.ID)
	}
	return m.(*machine)
}

// TestWarmConformance runs the driver suite with prepared jails on: every
// create of the suite's shape claims one.
func TestWarmConformance(t *testing.T) {
	d := warmDriver(t, 1)
	root := busyboxRoot(t)
	vmmtest.Run(t, d, func(id string) vmm.Spec {
		return vmm.Spec{ID: id, RootFS: root, UID: 1000, GID: 1000, Memory: 256 << 20, Pids: 256}
	})
}

// TestHostileWarmJailSeesNoTrace: a sandbox that claims a prepared jail
// finds nothing another one left (files, processes), has ids and a
// cgroup of its own, its own hostname and user, and the limits its
// create asked for in force.
func TestHostileWarmJailSeesNoTrace(t *testing.T) {
	d := warmDriver(t, 1)
	root := busyboxRoot(t)
	a := warmCreate(t, d, vmm.Spec{ID: "first", RootFS: root, UID: 1000, GID: 1000, Disk: 64 << 20})
	// The sleep must not hold the exec's output open, or the exec lasts
	// until its 30 s limit (and, before the guest client cut its stream
	// on a context's end, could hang there).
	vmmtest.Sh(t, a, "echo secret > /home/agent/left; echo secret > /tmp/left; (sleep 600 >/dev/null 2>&1 &) ; true")
	b := warmCreate(t, d, vmm.Spec{ID: "second", RootFS: root, UID: 1000, GID: 1000, Disk: 64 << 20, Memory: 48 << 20, Pids: 16})
	checks := []struct{ name, script, want string }{
		{"no file of the other", "cat /home/agent/left /tmp/left 2>/dev/null; echo end", "end\n"},
		{"no process of the other", "ps -o args | grep -c '[s]leep 600' || true", "0\n"},
		{"own hostname", "hostname", "second\n"},
		{"own user", "id -u", "1000\n"},
		// A shell dies of a fork that fails (so the loop runs in a
		// subshell), and nothing is forked after it while the sleeps hold
		// the limit: a pipeline's later commands, forked while the loop
		// ran, could find the limit reached themselves (exit 2, in CI).
		// The sleeps keep the exec's output open, so it ends with them.
		{"pids limit in force", "(for i in $(seq 30); do sleep 5 & done) 2>/tmp/forks; while read -r l; do case $l in *fork*|*esource*) echo limited; break;; esac; done </tmp/forks", "limited\n"},
		{"memory limit in force", "head -c 120000000 /dev/zero | tail >/dev/null; echo $?", "137\n"},
	}
	for _, c := range checks {
		if out, st := vmmtest.Sh(t, b, c.script); out != c.want {
			t.Errorf("%s: %q = %q (exit %d), want %q", c.name, c.script, out, st.Code, c.want)
		}
	}
	ba, _, _ := d.HostIDs("first")
	bb, _, _ := d.HostIDs("second")
	if ba == bb {
		t.Errorf("both claimed jails run as host ids %d", ba)
	}
	for c, dir := range a.cg.dirs {
		if b.cg.dirs[c] == dir {
			t.Errorf("both claimed jails are in cgroup %s", dir)
		}
	}
	if ps := machineProcesses(t, b.agent().pid); len(ps) > 4 {
		t.Errorf("the claimed jail has %d processes: %v", len(ps), ps)
	}
	if got := b.cg.readInt("pids", "pids.max", ""); got != 16 {
		t.Errorf("pids.max of the claimed jail = %d, want 16", got)
	}
}

// spareState is what a driver's spares hold on the host.
type spareState struct {
	pids    []int
	cgroups []string
	dirs    []string
}

func sparesOf(t *testing.T, d *Driver) spareState {
	var s spareState
	for _, sp := range d.warm.List() {
		<-sp.Ready()
		if sp.Err != nil {
			t.Fatalf("a spare was not prepared: %v", sp.Err)
		}
		s.pids = append(s.pids, sp.M.m.agent().pid)
		s.dirs = append(s.dirs, sp.M.m.dir)
		for _, dir := range sp.M.m.cg.dirs {
			s.cgroups = append(s.cgroups, dir)
		}
	}
	return s
}

// checkGone fails unless nothing of the spares is left: no agent, no
// cgroup, no directory, no mount, no id claim.
func checkGone(t *testing.T, d *Driver, s spareState) {
	t.Helper()
	for _, pid := range s.pids {
		for deadline := time.Now().Add(5 * time.Second); syscall.Kill(pid, 0) == nil && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("spare agent %d still runs", pid)
		}
	}
	for _, p := range append(s.cgroups, s.dirs...) {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is left", p)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), d.sparesDir()) {
		t.Errorf("a spare's mount is left:\n%s", mounts)
	}
	claims, _ := os.ReadDir(hostIDClaims)
	for _, c := range claims {
		if b, _ := os.ReadFile(filepath.Join(hostIDClaims, c.Name())); strings.Contains(string(b), filepath.Join(d.dir, "ids", "spare-")) {
			t.Errorf("id claim %s still names a spare: %s", c.Name(), b)
		}
	}
}

// TestWarmRestartLeavesNothing: prepared jails are gone after the driver
// closes, and after a driver that died (never closed) is replaced by a
// new one over its directory; a machine made from one is recovered by
// the new driver and destroyed cleanly.
func TestWarmRestartLeavesNothing(t *testing.T) {
	root := busyboxRoot(t)
	ctx := context.Background()
	spec := vmm.Spec{ID: "kept", RootFS: root, UID: 1000, GID: 1000, Disk: 32 << 20}
	t.Run("close", func(t *testing.T) {
		d := warmDriver(t, 2)
		if err := d.Warm(ctx, spec); err != nil {
			t.Fatal(err)
		}
		s := sparesOf(t, d)
		if len(s.pids) != 2 {
			t.Fatalf("%d spares, want 2", len(s.pids))
		}
		d.Close()
		checkGone(t, d, s)
	})
	t.Run("crash", func(t *testing.T) {
		d := warmDriver(t, 2)
		m := warmCreate(t, d, spec)
		if err := d.Warm(ctx, spec); err != nil {
			t.Fatal(err)
		}
		s := sparesOf(t, d)
		// A new driver over the same state, the old one never closed
		// (its connection to the machine ended as a dead daemon's would).
		m.Guest().Close()
		d2, err := New(d.dir, d.agent)
		if err != nil {
			t.Fatal(err)
		}
		defer d2.Close()
		checkGone(t, d, s)
		r, err := d2.Recover(ctx, "kept")
		if err != nil {
			t.Fatalf("Recover(kept): %v", err)
		}
		if out, _ := vmmtest.Sh(t, r, "hostname"); out != "kept\n" {
			t.Errorf("recovered claimed jail's hostname = %q", out)
		}
		if err := r.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		for _, dir := range m.cg.dirs {
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("cgroup %s of the destroyed machine is left", dir)
			}
		}
		if _, err := os.Stat(d.idFile("kept")); err == nil {
			t.Errorf("id record of the destroyed machine is left")
		}
	})
}

// TestHostileWarmJailPrivileges: a prepared jail's agent is locked down
// (no_new_privs, the bounding set, its own capabilities, its seccomp
// filter) before its claim, on every thread; once claimed, root inside
// holds only the kept capabilities and cannot gain more, mount or change
// the hostname the host set.
func TestHostileWarmJailPrivileges(t *testing.T) {
	d := warmDriver(t, 1)
	root := busyboxRoot(t)
	m := warmCreate(t, d, vmm.Spec{ID: "privs", RootFS: root, UID: 1000, GID: 1000})
	checkLockedDown(t, "claimed agent", m.agent().pid)
	spares := d.warm.List()
	if len(spares) != 1 {
		t.Fatalf("%d spares prepared after a claim, want 1", len(spares))
	}
	<-spares[0].Ready()
	if spares[0].Err != nil {
		t.Fatal(spares[0].Err)
	}
	checkLockedDown(t, "prepared agent", spares[0].M.m.agent().pid)
	if out, _ := vmmtest.Sh(t, m, "hostname"); out != "privs\n" {
		t.Errorf("hostname of the claimed jail = %q, want privs", out)
	}
	zero := uint32(0)
	for script, want := range map[string]string{
		"grep -E 'CapBnd|NoNewPrivs' /proc/self/status | tr -d '\\t'":       "CapBnd:" + keptBounding + "\nNoNewPrivs:1\n",
		"mount -t tmpfs x /mnt 2>/dev/null && echo mounted || echo refused": "refused\n",
		"hostname other 2>/dev/null && echo changed || echo refused":        "refused\n",
		"unshare -U true 2>/dev/null && echo unshared || echo refused":      "refused\n",
	} {
		var out strings.Builder
		st, err := m.Guest().Exec(context.Background(), guest.ExecRequest{Argv: []string{"sh", "-c", script}, UID: &zero, GID: &zero}, nil, &out, &out)
		if err != nil || out.String() != want {
			t.Errorf("as root %q = %q (exit %d, %v), want %q", script, out.String(), st.Code, err, want)
		}
	}
}

// keptBounding is the bounding set of a machine's processes: the kept
// capabilities (hearth-guest's keptCaps), as /proc shows it.
const keptBounding = "00000000a80425fb"

// checkLockedDown fails unless every thread of agent pid holds only the
// kept capabilities (and CAP_SYS_TIME, its own), no_new_privs and a
// seccomp filter.
func checkLockedDown(t *testing.T, what string, pid int) {
	t.Helper()
	eff := fmt.Sprintf("%016x", 0xa80425fb|1<<unix.CAP_SYS_TIME)
	want := fmt.Sprintf("CapPrm:\t%s\nCapEff:\t%s\nCapBnd:\t%s\nNoNewPrivs:\t1\nSeccomp:\t2", eff, eff, keptBounding)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of the %s: %v", what, err)
	}
	for _, task := range tasks {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			continue // the thread ended
		}
		got := grepLines(string(status), "CapBnd", "CapEff", "CapPrm", "NoNewPrivs", "Seccomp:")
		if strings.TrimSpace(got) != want {
			t.Errorf("%s, thread %s:\n%s\nwant\n%s", what, task.Name(), got, want)
		}
	}
}

// TestWarmClaimNeverReplaces: a claim moves its prepared jail to the
// machine's directory only if none is there: one made by another create
// since Create looked is left whole, the claim fails with ErrExists, and
// the prepared jail is destroyed, not leaked or reused.
func TestWarmClaimNeverReplaces(t *testing.T) {
	d := warmDriver(t, 1)
	root := busyboxRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := vmm.Spec{ID: "taken", RootFS: root, UID: 1000, GID: 1000}
	if err := d.Warm(ctx, spec); err != nil {
		t.Fatal(err)
	}
	dir := d.machineDir(spec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "theirs")
	if err := os.WriteFile(marker, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := d.claimSpare(ctx, spec, dir)
	if !errors.Is(err, vmm.ErrExists) || m != nil {
		t.Fatalf("claim onto an existing directory = %v, %v; want ErrExists", m, err)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "x" {
		t.Errorf("the directory there was changed: %q, %v", b, err)
	}
	if _, reserved := d.readIDs(spec.ID); reserved {
		t.Errorf("ids are reserved for %s after its claim failed", spec.ID)
	}
	if ents, _ := os.ReadDir(d.sparesDir()); len(ents) > 1 {
		t.Errorf("spares left: %v (the failed one and at most its replacement)", ents)
	}
	for _, e := range mustReadDir(t, d.sparesDir()) {
		if b, _ := os.ReadFile(filepath.Join(d.sparesDir(), e.Name(), "spec.json")); strings.Contains(string(b), `"taken"`) {
			t.Errorf("the failed claim's spare %s is still there", e.Name())
		}
	}
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return ents
}
