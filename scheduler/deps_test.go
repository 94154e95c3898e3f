package scheduler_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the package free of other hearth packages: the appliance
// imports it, not the other way round.
func TestDeps(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not in PATH: cannot list dependencies")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "hearth/") && dep != "hearth/scheduler" {
			t.Errorf("scheduler imports %s; it must not import other hearth packages", dep)
		}
	}
}
