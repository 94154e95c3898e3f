package vmm

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestAuditLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := OpenAuditLog(path)
	if err != nil {
		t.Fatal(err)
	}
	var told []Event
	a.OnEvent(func(e Event) { told = append(told, e) })
	a.Record("m1", "create", "rootfs=/x")
	a.Record("m1", "destroy", "")
	a.Close()
	// Appended, not overwritten, across opens.
	a, _ = OpenAuditLog(path)
	a.Record("m2", "create", "")
	a.Close()
	f, _ := os.Open(path)
	defer f.Close()
	var got []Event
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, e)
	}
	if len(got) != 3 || got[0].Kind != "create" || got[0].Detail != "rootfs=/x" || got[2].Machine != "m2" || got[0].Time.IsZero() {
		t.Errorf("log = %+v", got)
	}
	if len(told) != 2 || told[1].Kind != "destroy" {
		t.Errorf("watcher told %+v, want the first log's two events", told)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	var nilLog *AuditLog
	nilLog.Record("scratch", "create", "") // a probe's machine: nothing, no panic
	if err := nilLog.Close(); err != nil {
		t.Error(err)
	}
}
