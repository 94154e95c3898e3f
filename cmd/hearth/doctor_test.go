package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"hearth/appliance"
)

func TestDoctor(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "hearth.toml")
	agent := filepath.Join(dir, "no-agent-here")
	os.WriteFile(cfg, []byte("state_dir = \""+dir+"/state\"\n[workspace]\nmount = \""+dir+"/agents\"\n[sandbox]\nagent = \""+agent+"\"\n"), 0o644)
	var out, errb bytes.Buffer
	if code := run([]string{"doctor", "--config", cfg, "--json"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("doctor = exit %d: %s", code, errb.String())
	}
	var d appliance.Diagnosis
	if err := json.Unmarshal(out.Bytes(), &d); err != nil {
		t.Fatalf("doctor --json: %v: %s", err, out.String())
	}
	checks := map[string]appliance.Check{}
	for _, c := range d.Checks {
		checks[c.Name] = c
	}
	for _, name := range []string{"kvm", "cloud-hypervisor", "qemu", "fuse", "cgroups", "user namespaces", "guest agent", "images"} {
		if _, ok := checks[name]; !ok {
			t.Errorf("doctor has no %q check: %+v", name, d.Checks)
		}
	}
	if g := checks["guest agent"]; g.OK || !strings.Contains(g.Detail, "go build") {
		t.Errorf("guest agent check with a missing binary = %+v, want not ok and how to build it", g)
	}
	if img := checks["images"]; !strings.Contains(img.Detail, "hearth images build") {
		t.Errorf("images check with none built = %+v, want how to build one", img)
	}
	// Before any daemon ran: jail when no VM tier can run, else the
	// daemon's trial boot decides.
	if (d.Tier != "jail" && d.Tier != "auto") || d.Why == "" {
		t.Errorf("tier = %q (%q), want jail or auto with a reason", d.Tier, d.Why)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil && d.Tier != "jail" {
		t.Errorf("tier = %q without QEMU or Cloud Hypervisor, want jail", d.Tier)
	}
	// After a daemon picked one: what it picked and why.
	os.MkdirAll(filepath.Join(dir, "state"), 0o700)
	os.WriteFile(filepath.Join(dir, "state", "tier.json"), []byte(`{"tier":"jail","why":"no VM tier can run here: chv: not installed","when":"2026-11-22T02:00:00Z"}`), 0o600)
	out.Reset()
	if code := run([]string{"doctor", "--config", cfg}, nil, &out, &errb); code != exitOK ||
		!strings.Contains(out.String(), "tier: jail (picked when the daemon last started (2026-11-22T02:00:00Z): no VM tier can run here") {
		t.Errorf("doctor = exit %d, %q", code, out.String())
	}
	for _, name := range []string{"virtiofsd"} {
		if _, ok := checks[name]; !ok {
			t.Errorf("doctor has no %q check", name)
		}
	}
}
