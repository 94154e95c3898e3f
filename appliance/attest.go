package appliance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/guest"
)

// Attested isolation: before a tier runs anyone's work, the daemon boots
// one machine of it and checks from inside that the machine is as
// isolated as the tier promises (hearth-guest --attest), and from the
// host that its limits hold. A tier that fails is not used. hearth doctor
// --isolation does the same on demand.

// errIsolationFailed is the error of a tier whose attestation failed.
var errIsolationFailed = errors.New("isolation attestation failed")

// attestTimeout bounds one attestation: a boot (seconds under QEMU's
// software emulation), a copy of the agent and the probe.
const attestTimeout = 3 * time.Minute

// Attestation is what one tier's attestation found.
type Attestation struct {
	Tier string `json:"tier"`
	OK   bool   `json:"ok"`
	// Skipped says why the tier was not attested: the host cannot run
	// it (hearth doctor --isolation only).
	Skipped string        `json:"skipped,omitempty"`
	Checks  []Check       `json:"checks"`
	Took    time.Duration `json:"took_ns"`
}

// Failed names the checks that failed, with what they saw.
func (a Attestation) Failed() string {
	var bad []string
	for _, c := range a.Checks {
		if !c.OK {
			bad = append(bad, c.Name+": "+c.Detail)
		}
	}
	return strings.Join(bad, "; ")
}

// attestPids is the process limit of the probe's machine, checked from
// inside a jail.
const attestPids = 64

// attestMemory is the memory limit of the probe's machine, checked from
// the host (the jail's cgroup) or from inside (a VM's memory).
const attestMemory = 256 << 20

// AttestIsolation boots a machine of driver d (tier names it), runs the
// probe agent (the hearth-guest binary) inside as the machine's root, and
// checks what it reports. dir holds the probe's root and a marker file
// that must stay invisible; store, when not nil, gets two throwaway
// sessions so the probe can look at another session through its view.
func AttestIsolation(ctx context.Context, d vmm.Driver, tier, agent, dir string, store *fs.Store) Attestation {
	start := time.Now()
	a := Attestation{Tier: tier}
	err := attest(ctx, d, agent, dir, store, &a)
	if err != nil {
		a.Checks = append(a.Checks, Check{Name: "probe", Detail: err.Error()})
	}
	a.OK = len(a.Checks) > 0
	for _, c := range a.Checks {
		a.OK = a.OK && c.OK
	}
	a.Took = time.Since(start)
	return a
}

func attest(ctx context.Context, d vmm.Driver, agent, dir string, store *fs.Store, a *Attestation) error {
	ctx, cancel := context.WithTimeout(ctx, attestTimeout)
	defer cancel()
	id := "attest-" + randomHex(4)
	root, marker, err := attestRoot(filepath.Join(dir, id))
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Join(dir, id))
	spec := vmm.Spec{ID: id, RootFS: root, Memory: attestMemory, Pids: attestPids}
	other := ""
	if store != nil {
		view, otherID, cleanup, err := attestSessions(store, filepath.Join(dir, id, "view"), id)
		if err != nil {
			return err
		}
		defer cleanup()
		spec.Workspace, other = view, otherID
	}
	m, err := d.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("boot a machine: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m.Destroy(ctx)
	}()
	args := []string{"--host-path", marker, "--host-path", dir}
	if a.Tier == TierJail {
		// A VM's processes live in its own kernel, bounded by its memory;
		// a jail's share the host's, so its pids limit must hold.
		args = append(args, "--pids", strconv.FormatInt(spec.Pids, 10))
	}
	if other != "" {
		args = append(args, "--other-session", path.Join("/workspace/agents", other))
	}
	checks, err := runProbe(ctx, m, agent, args)
	if err != nil {
		return err
	}
	var memory string // the probe's figure, not a verdict
	for _, c := range checks {
		if c.Name == "memory" {
			memory = c.Detail
			continue
		}
		a.Checks = append(a.Checks, c)
	}
	a.Checks = append(a.Checks, limitsCheck(ctx, m, a.Tier, memory))
	return nil
}

// attestRoot makes the probe machine's root, an empty tree with the
// directories a machine mounts over, and a marker file beside it on the
// host.
func attestRoot(dir string) (root, marker string, err error) {
	root = filepath.Join(dir, "rootfs")
	for _, d := range []string{"tmp", "proc", "sys", "dev", "etc", "workspace/agents"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", "", err
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		return "", "", err
	}
	marker = filepath.Join(dir, "host-marker")
	return root, marker, os.WriteFile(marker, []byte("a machine must not see this\n"), 0o644)
}

// attestSessions makes two sessions, puts a file in the second's .home,
// and mounts the first's view at dir: the probe looks at the second
// from it. cleanup unmounts and deletes both.
func attestSessions(store *fs.Store, dir, id string) (view, other string, cleanup func(), err error) {
	mine, other := id+"-a", id+"-b"
	owner := fs.Owner{UID: 1000, GID: 1000}
	drop := func() {
		store.DeleteSession(mine)
		store.DeleteSession(other)
	}
	err = store.CreateSession(mine, owner)
	if err == nil {
		err = store.CreateSession(other, owner)
	}
	if err == nil {
		_, err = store.WriteFile(other, fs.HomeDir+"/secret", strings.NewReader("private"), 1<<10, owner)
	}
	var v *fs.View
	if err == nil {
		v, err = store.Mount(dir, fs.ViewOptions{Session: mine})
	}
	if err != nil {
		drop()
		return "", "", nil, fmt.Errorf("attestation sessions: %w", err)
	}
	return dir, other, func() { v.Unmount(); drop() }, nil
}

// runProbe copies the agent binary into m and runs it there as root
// with --attest and args.
func runProbe(ctx context.Context, m vmm.Machine, agent string, args []string) ([]Check, error) {
	f, err := os.Open(agent)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	const probe = "/tmp/hearth-attest"
	if _, err := m.Guest().UploadAs(ctx, probe, f, 0o755, 0, 0); err != nil {
		return nil, fmt.Errorf("copy the probe in: %w", err)
	}
	var out, errb bytes.Buffer
	root := uint32(0)
	st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: append([]string{probe, "--attest"}, args...), UID: &root, GID: &root}, nil, &out, &errb)
	if err == nil && (st.Code != 0 || st.Error != "") {
		err = fmt.Errorf("exit %d %s: %s", st.Code, st.Error, strings.TrimSpace(errb.String()))
	}
	if err != nil {
		return nil, fmt.Errorf("run the probe: %w", err)
	}
	var res struct{ Checks []Check }
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("probe output %q: %w", out.String(), err)
	}
	return res.Checks, nil
}

// limitsCheck: the machine's memory is limited to attestMemory. A
// jail's limit is its cgroup's, which the host reads; a VM's is its RAM,
// which its kernel reported to the probe (memory, in bytes).
func limitsCheck(ctx context.Context, m vmm.Machine, tier, memory string) Check {
	c := Check{Name: "limits"}
	if tier == TierJail {
		ur, ok := m.(vmm.UsageReporter)
		if !ok {
			c.Detail = "the jail reports no usage"
			return c
		}
		u, err := ur.Usage(ctx)
		if err != nil {
			c.Detail = err.Error()
			return c
		}
		c.OK = u.MemoryLimit > 0 && u.MemoryLimit <= attestMemory
		c.Detail = fmt.Sprintf("cgroup memory limit %d bytes, want at most %d", u.MemoryLimit, attestMemory)
		return c
	}
	n, err := strconv.ParseInt(memory, 10, 64)
	c.OK = err == nil && n > 0 && n <= attestMemory
	c.Detail = fmt.Sprintf("the machine's kernel has %s bytes of memory, want at most %d", memory, attestMemory)
	return c
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
