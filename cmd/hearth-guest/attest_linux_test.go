package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestAttestUnconfined runs the probe outside any machine, where most
// checks must fail: a probe that passes everywhere would prove nothing.
func TestAttestUnconfined(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the probe's capability checks are about root")
	}
	dir := t.TempDir()
	marker := filepath.Join(dir, "marker")
	if err := os.WriteFile(marker, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	// No process limit holds here: starting 8 children past 4 succeeds.
	if err := runAttest([]string{"--host-path", marker, "--other-session", dir, "--pids", "4"}, &out); err != nil {
		t.Fatal(err)
	}
	var res struct{ Checks []AttestCheck }
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("probe output %q: %v", out.String(), err)
	}
	got := map[string]bool{}
	for _, c := range res.Checks {
		got[c.Name] = c.OK
	}
	for _, name := range []string{"host paths", "seccomp", "capabilities", "other session", "pids"} {
		if ok, found := got[name]; !found || ok {
			t.Errorf("unconfined probe: %s ok = %v (reported: %v), want a failure", name, ok, found)
		}
	}
	if !got["memory"] {
		t.Errorf("unconfined probe: memory check failed: %s", out.String())
	}
	if err := runAttest([]string{"--host-path", filepath.Join(dir, "absent")}, &out); err != nil {
		t.Fatal(err)
	}
}
