package fs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestJournalDamageKept: a journal damaged in its middle (a flipped byte
// with intact records after it) replays what precedes the damage and
// keeps the rest in journal.<seq>.damaged, which Damage and
// DamagedJournals report; a journal only torn at its end (a crash
// mid-append) is cut without a report.
func TestJournalDamageKept(t *testing.T) {
	journal := realJournal(t)
	for _, tc := range []struct {
		name    string
		damage  func([]byte) []byte
		wantKep bool
	}{
		{"torn tail", func(b []byte) []byte { return b[:len(b)-3] }, false},
		{"flipped byte in the middle", func(b []byte) []byte {
			c := append([]byte(nil), b...)
			c[len(c)/2] ^= 0x40
			return c
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			damaged := tc.damage(journal)
			if err := os.WriteFile(filepath.Join(dir, "journal.0000000000000001"), damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(Options{Dir: dir, TidyInterval: time.Hour})
			if err != nil {
				t.Fatalf("Open of a damaged journal: %v", err)
			}
			damage := s.Damage()
			s.Close()
			kept := DamagedJournals(dir)
			if got := len(kept) == 1 && len(damage) == 1; got != tc.wantKep {
				t.Fatalf("kept %v, Damage() = %q; want kept: %v", kept, damage, tc.wantKep)
			}
			if !tc.wantKep {
				return
			}
			tail, err := os.ReadFile(kept[0])
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(string(damaged), string(tail)) || len(tail) <= len(damaged)/2 || len(tail) == len(damaged) {
				t.Errorf("kept %d bytes; want the journal's tail from the damage on (%d bytes in all)", len(tail), len(damaged))
			}
			if !strings.Contains(damage[0], "not replayed") || !strings.Contains(damage[0], kept[0]) {
				t.Errorf("Damage() = %q; want it to say what was not replayed and where it is kept", damage[0])
			}
		})
	}
}
