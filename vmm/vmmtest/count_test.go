package vmmtest

import (
	"strings"
	"testing"
)

func TestUnbrokenCount(t *testing.T) {
	for _, c := range []struct {
		lines, told string
		missing     int
		ok          bool
	}{
		{"1 2 3", "", 0, true},
		{"", "", 0, true},
		{"1 3", "2", 1, true},
		{"1 3", "", 0, false},     // skipped silently
		{"1 2 2 3", "", 0, false}, // repeated
		{"1 2 1 2", "", 0, false}, // restarted
		{"2 3", "1", 1, true},
		{"1 4", "2 3", 2, true},
		{"1 3", "5", 0, false},
	} {
		n, err := UnbrokenCount(strings.Fields(c.lines), strings.Fields(c.told))
		if (err == nil) != c.ok || c.ok && n != c.missing {
			t.Errorf("UnbrokenCount(%q, told %q) = %d, %v; want %d missing, ok %v", c.lines, c.told, n, err, c.missing, c.ok)
		}
	}
}
