package appliance

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"hearth/fs"
	"hearth/image"
	"hearth/vmm"
	"hearth/vmm/jail"
	"hearth/vmm/qemu"
)

// TestAttestIsolationJail attests the jail tier for real: a machine
// boots, the probe runs inside, every check passes.
func TestAttestIsolationJail(t *testing.T) {
	cfg := agentConfig(t)
	d, err := jail.New(filepath.Join(cfg.StateDir, "jail"), cfg.Sandbox.Agent)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	store, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	a := AttestIsolation(context.Background(), d, TierJail, cfg.Sandbox.Agent, filepath.Join(cfg.StateDir, "attest"), store)
	for _, c := range a.Checks {
		t.Logf("%s: ok=%v %s", c.Name, c.OK, c.Detail)
	}
	t.Logf("jail attestation took %v", a.Took)
	if !a.OK {
		t.Fatalf("jail attestation failed: %s", a.Failed())
	}
	want := map[string]bool{"network": true, "host paths": true, "vsock": true, "seccomp": true,
		"capabilities": true, "other session": true, "limits": true, "pids": true}
	for _, c := range a.Checks {
		delete(want, c.Name)
	}
	if len(want) > 0 {
		t.Errorf("checks not made: %v", want)
	}
}

// TestAttestIsolationQEMU attests the qemu tier: a real VM under TCG
// (what is under test is the attestation, not KVM; it takes several
// seconds), the workspace over virtio-fs.
func TestAttestIsolationQEMU(t *testing.T) {
	cfg := agentConfig(t)
	for _, tool := range []string{"qemu-system-x86_64", "mkfs.ext4", "apt-cache"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the qemu tier needs %s", tool)
		}
	}
	if _, err := os.Stat("/usr/lib/qemu/virtiofsd"); err != nil {
		t.Skip("/usr/lib/qemu/virtiofsd missing: apt-get install qemu-system-common")
	}
	b, err := image.NewBuilder(filepath.Join(os.TempDir(), "hearth-test-vm-boot"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := b.Boot(context.Background(), cfg.Sandbox.Agent)
	if err != nil {
		t.Fatalf("VM kernel and initramfs: %v", err)
	}
	d, err := qemu.New(qemu.Config{Dir: filepath.Join(cfg.StateDir, "qemu"), Kernel: boot.Kernel, Initramfs: boot.Initramfs, AllowTCG: true, NoKVM: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	store, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	a := AttestIsolation(context.Background(), d, TierQEMU, cfg.Sandbox.Agent, filepath.Join(cfg.StateDir, "attest"), store)
	for _, c := range a.Checks {
		t.Logf("%s: ok=%v %s", c.Name, c.OK, c.Detail)
	}
	t.Logf("qemu attestation took %v", a.Took)
	if !a.OK {
		t.Fatalf("qemu attestation failed: %s", a.Failed())
	}
}

// TestDaemonAttestsTier: a daemon attests its tier when it starts, and
// hearth doctor shows the result.
func TestDaemonAttestsTier(t *testing.T) {
	cfg := agentConfig(t)
	startSandboxDaemon(t, cfg)
	var found bool
	for _, c := range Doctor(cfg).Checks {
		if c.Name == "isolation (jail)" {
			found = true
			if !c.OK || !strings.Contains(c.Detail, "attested when the daemon last started") {
				t.Errorf("doctor's isolation check = %+v, want the jail attested", c)
			}
		}
	}
	if !found {
		t.Errorf("doctor after a daemon start shows no isolation check: %+v", Doctor(cfg).Checks)
	}
}

// TestFailedTierNotUsed: a tier whose attestation fails (here a qemu
// driver whose kernel is no kernel, so no machine of it ever answers) is
// not used: auto falls back to an attested jail, a forced tier keeps the
// daemon from starting.
func TestFailedTierNotUsed(t *testing.T) {
	cfg := agentConfig(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not on PATH: apt-get install qemu-system-x86")
	}
	notKernel := filepath.Join(t.TempDir(), "not-a-kernel")
	if err := os.WriteFile(notKernel, []byte("not a kernel\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	broken := func() vmm.Driver {
		d, err := qemu.New(qemu.Config{Dir: filepath.Join(cfg.StateDir, "qemu"), Kernel: notKernel, Initramfs: notKernel, AllowTCG: true, NoKVM: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	cfg.Sandbox.Tier = TierAuto
	d, c, err := attestTier(context.Background(), cfg, broken(), tierChoice{Tier: TierQEMU}, cfg.Sandbox.Agent, store, testLogger(t))
	if err != nil || d == nil || d.Name() != "jail" || c.Tier != TierJail || !strings.Contains(c.Why, "isolation attestation failed") {
		t.Fatalf("auto with a failing qemu tier: %v, %+v, %v; want the jail, saying why", d, c, err)
	}
	closeDriver(d)
	got := map[string]bool{}
	for _, a := range lastAttestations(cfg.StateDir) {
		got[a.Tier] = a.OK
	}
	if ok, found := got[TierQEMU]; !found || ok || !got[TierJail] {
		t.Errorf("saved attestations %v, want qemu failed and jail passed", got)
	}
	cfg.Sandbox.Tier = TierQEMU
	if d, _, err := attestTier(context.Background(), cfg, broken(), tierChoice{Tier: TierQEMU}, cfg.Sandbox.Agent, store, testLogger(t)); d != nil || !errors.Is(err, errTierUnavailable) || !errors.Is(err, errIsolationFailed) {
		t.Errorf("forced qemu failing its attestation: %v, %v; want no driver and the daemon refused", d, err)
	}
}
