package agents

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"hearth/agents/store"
	"hearth/fs"
)

// TestHostileCallSnapshotsPinnedBytes: an agent rewrites a 1 MiB file
// with new bytes before every model call, so that each call snapshot
// pins another version. Even with call_snapshots = "all", what the
// session's snapshots pin stays within call_snapshot_bytes (the oldest
// are dropped, the newest kept), and so does the store's disk; without
// the bound, 40 versions would be kept.
func TestHostileCallSnapshotsPinnedBytes(t *testing.T) {
	const mib, calls, limit = 1 << 20, 40, 8 << 20
	dir := filepath.Join(t.TempDir(), "store")
	s, err := fs.Open(fs.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateSession("victim", fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	ru := &run{r: &Runner{cfg: RunnerConfig{Workspace: fsWorkspace{s: s}, CallSnapshots: Retention{All: true, MaxBytes: limit}}},
		exec: store.Execution{ID: "exec-hostile", Session: "victim"}}
	for i := range calls {
		data := bytes.Repeat([]byte{byte(i)}, mib)
		if _, err := s.WriteFile("victim", "big.bin", bytes.NewReader(data), 0, fs.Owner{}); err != nil {
			t.Fatal(err)
		}
		if ru.snapshot("call") == "" {
			t.Fatalf("call %d: no snapshot", i+1)
		}
		holds, err := s.SnapshotHolds("victim")
		if err != nil {
			t.Fatal(err)
		}
		var pinned int64
		for _, h := range holds {
			pinned += h.Holds
		}
		if pinned > limit {
			t.Fatalf("after call %d the snapshots pin %d bytes, over the %d bound", i+1, pinned, limit)
		}
	}
	names, err := s.SnapshotNames("victim")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(names); n > limit/mib+1 || n < limit/mib-1 || names[n-1].Name != CallSnapshotName("exec-hostile", "call", calls) {
		t.Fatalf("%d snapshots kept, newest %q; want about %d, the newest call-%d among them", n, names[n-1].Name, limit/mib, calls)
	}
	// The blobs only dropped snapshots held are freed: the disk holds the
	// live file, what the kept snapshots pin and the journal.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.Sync()
		used := diskUse(t, dir)
		if used <= float64(limit+4*mib) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store takes %.1f MiB on disk, over the bound (%d MiB pinned, 1 MiB live)", used/mib, limit/mib)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
