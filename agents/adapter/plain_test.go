package adapter

import (
	"strings"
	"testing"
)

func TestPlain(t *testing.T) {
	tests := []struct {
		name           string
		stdout, stderr string
		want           []string
		malformed      int
	}{
		{"stdout only", "a\nb", "", []string{"output stdout a", "output stdout b"}, 0},
		{"JSON is just text", `{"type":"result","is_error":true}` + "\n", "", []string{`output stdout {"type":"result","is_error":true}`}, 0},
		{"long stdout line", strings.Repeat("x", 50) + "\nend\n", "", []string{"error stdout line 1", "output stdout end"}, 1},
		{"stderr only", "", "oops\n", []string{"output stderr oops"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			evs, sum := run(t, &Plain{MaxLine: 40}, strings.NewReader(tc.stdout), strings.NewReader(tc.stderr))
			diffLines(t, "events", describeAll(t, evs), tc.want)
			if sum.Status != Unknown || sum.Malformed != tc.malformed {
				t.Errorf("Status, Malformed = %q, %d; want %q, %d", sum.Status, sum.Malformed, Unknown, tc.malformed)
			}
		})
	}
}
