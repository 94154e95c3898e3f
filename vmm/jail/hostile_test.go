package jail

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// TestHostileProviderKeyNotInMachine: the daemon's environment holds the
// provider's key. A workload that reads every environment it can find,
// its PID 1's included, must not find it; nor must the host, looking at
// every process of the machine.
func TestHostileProviderKeyNotInMachine(t *testing.T) {
	d := newDriver(t)
	root := busyboxRoot(t)
	secret := make([]byte, 16)
	rand.Read(secret)
	key := "sk-ant-hostile-" + hex.EncodeToString(secret)
	marker := "hearth-marker-" + hex.EncodeToString(secret)
	t.Setenv("ANTHROPIC_API_KEY", key)
	t.Setenv("HEARTH_HOSTILE_MARKER", marker)
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "envleak", RootFS: root, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Destroy(ctx)
	// Inside, as root and as the agent user, with a process of each
	// running in the background.
	script := `sleep 30 >/dev/null 2>&1 & n=0; for f in /proc/[0-9]*/environ; do cat "$f" 2>/dev/null && n=$((n+1)); echo; done | tr '\0' '\n'; echo "read=$n"`
	for _, uid := range []uint32{0, 1000} {
		var out bytes.Buffer
		u := uid
		st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", script}, UID: &u, GID: &u}, nil, &out, &out)
		if err != nil || st.Code != 0 {
			t.Fatalf("read environments as uid %d: %+v, %v: %s", uid, st, err, &out)
		}
		if s := out.String(); strings.Contains(s, key) || strings.Contains(s, marker) || strings.Contains(s, "ANTHROPIC_API_KEY") {
			// The output is not printed: it would put the daemon's
			// environment in the test log.
			t.Errorf("as uid %d inside the machine, an environment holds the daemon's ANTHROPIC_API_KEY or marker", uid)
		}
		if !strings.Contains(out.String(), "PATH=") {
			t.Errorf("as uid %d the probe read no environment at all (%q): it proves nothing", uid, out.String())
		}
	}
	// From the host: PID 1 and every other process of the machine.
	pids := machineProcesses(t, m.(*machine).agent().pid)
	if len(pids) < 2 {
		t.Fatalf("machine processes seen from the host: %v, want the agent and the background sleeps", pids)
	}
	for _, pid := range pids {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue // it exited meanwhile
		}
		if bytes.Contains(env, []byte(key)) || bytes.Contains(env, []byte(marker)) {
			t.Errorf("process %d of the machine has the daemon's ANTHROPIC_API_KEY or marker in its environment", pid)
		}
	}
}

// machineProcesses lists the host pids of every process in the PID
// namespace of agent, the machine's PID 1.
func machineProcesses(t *testing.T, agent int) []int {
	t.Helper()
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", agent))
	if err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, dir := range dirs {
		var pid int
		fmt.Sscan(filepath.Base(dir), &pid)
		if ns, err := os.Readlink(dir + "/ns/pid"); err == nil && ns == want {
			pids = append(pids, pid)
		}
	}
	return pids
}
