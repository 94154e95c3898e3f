package leftovers

import (
	"os"
	"slices"
	"testing"
)

func TestProcessesFindsThisOne(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(Processes(exe), os.Getpid()) {
		t.Fatalf("Processes(%s) = %v, want this process %d among them", exe, Processes(exe), os.Getpid())
	}
	if got := Processes("/nonexistent/exe"); len(got) != 0 {
		t.Fatalf("Processes of a missing executable = %v, want none", got)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/tab\011x`: "/tab\tx", `/plain`: "/plain", `/end\04`: `/end\04`} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountsSeesProc(t *testing.T) {
	if got := Mounts("/proc"); !slices.Contains(got, "/proc") {
		t.Fatalf("Mounts(/proc) = %v, want /proc among them", got)
	}
}
