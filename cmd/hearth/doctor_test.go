package main

import (
	"bytes"
	"encoding/json"
	"os"
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
	if d.Tier != "jail" || d.Why == "" {
		t.Errorf("tier = %q (%q), want jail with a reason", d.Tier, d.Why)
	}
	out.Reset()
	if code := run([]string{"doctor", "--config", cfg}, nil, &out, &errb); code != exitOK || !strings.Contains(out.String(), "tier: jail") {
		t.Errorf("doctor = exit %d, %q", code, out.String())
	}
}
