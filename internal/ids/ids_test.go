package ids

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	good := []string{"a", "analyst", "cp-20261125-150405", "exec-0a1b", "a-", strings.Repeat("a", 63)}
	bad := []string{"", "0", "1abc", "-x", "A", "Upper", "a.b", "a_b", "a/b", "../etc", "a b", "é", strings.Repeat("a", 64), "a\x00"}
	for _, n := range good {
		if err := Check("machine id", n); err != nil {
			t.Errorf("Check(%q) = %v, want nil", n, err)
		}
	}
	for _, n := range bad {
		err := Check("machine id", n)
		if err == nil || !strings.Contains(err.Error(), "machine id") || !strings.Contains(err.Error(), "starting with a letter") {
			t.Errorf("Check(%q) = %v, want an error naming the thing and the rule", n, err)
		}
	}
}

func FuzzCheck(f *testing.F) {
	for _, s := range []string{"a", "0", "a.b", "exec-1", "-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !Valid(s) {
			return
		}
		// What passes is a plain file name: no separator, no dot, no
		// leading dash, short enough for any file system.
		if len(s) == 0 || len(s) > 63 || strings.ContainsAny(s, "/.\x00_ ") || s[0] < 'a' || s[0] > 'z' {
			t.Fatalf("Valid(%q), which is not a plain name", s)
		}
	})
}
