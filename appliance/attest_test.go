package appliance

import (
	"context"
	"path/filepath"
	"testing"

	"hearth/fs"
	"hearth/vmm/jail"
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
		"capabilities": true, "other session": true, "limits": true}
	for _, c := range a.Checks {
		delete(want, c.Name)
	}
	if len(want) > 0 {
		t.Errorf("checks not made: %v", want)
	}
}
