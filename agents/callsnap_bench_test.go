package agents

import (
	"bytes"
	"fmt"
	iofs "io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/agents/store"
	"hearth/fs"
)

// BenchmarkCallSnapshots measures call snapshots on a session of 10,000
// files: two stores get the same 1,000 "calls", interleaved (each call
// rewrites one of the session's files, as an agent's turn does), and one
// of them is snapshotted after each call through the runner's own path
// (snapshot name, retention: "all", so that all 1,000 are kept, and the
// default "last 100"). It
// reports the time of a snapshot against that of the call's write, the
// heap each store holds after them, the disk its directory takes and
// how long closing it (writing its checkpoint) takes.
// Run it with -benchtime 1x: each iteration is the whole 1,000 calls.
func BenchmarkCallSnapshots(b *testing.B) {
	for _, ret := range []Retention{{All: true}, {Last: DefaultCallSnapshots}} {
		b.Run(strings.ReplaceAll(ret.String(), " ", "-"), func(b *testing.B) { benchCallSnapshots(b, ret) })
	}
}

func benchCallSnapshots(b *testing.B, ret Retention) {
	const files, calls = 10_000, 1_000
	for b.Loop() {
		b.StopTimer()
		dir := b.TempDir()
		stores := map[string]*fs.Store{}
		b.Cleanup(func() {
			for _, s := range stores {
				s.Close()
			}
		})
		open := func(name string) *fs.Store {
			s, err := fs.Open(fs.Options{Dir: filepath.Join(dir, name)})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.CreateSession("bench", fs.Owner{}); err != nil {
				b.Fatal(err)
			}
			stores[name] = s
			for d := range files / 100 {
				if err := s.MkdirAll("bench", fmt.Sprintf("d%03d", d), fs.Owner{}); err != nil {
					b.Fatal(err)
				}
			}
			content := bytes.Repeat([]byte("x"), 1024)
			for i := range files {
				if _, err := s.WriteFile("bench", fmt.Sprintf("d%03d/f%05d", i/100, i), bytes.NewReader(content), 0, fs.Owner{}); err != nil {
					b.Fatal(err)
				}
			}
			return s
		}
		snapStore, plainStore := open("snap"), open("plain")
		ru := &run{r: &Runner{cfg: RunnerConfig{Workspace: fsWorkspace{s: snapStore}, CallSnapshots: ret}},
			exec: store.Execution{ID: "exec-bench", Session: "bench"}}
		var snapTime, writeSnap, writePlain, copyTime time.Duration
		native := nativeTree(b, filepath.Join(dir, "native"), files)
		copies := 0
		content := bytes.Repeat([]byte("y"), 4096)
		for i := range calls {
			if i%(calls/naiveCopies) == calls/naiveCopies/2 { // the naive snapshot, interleaved
				t0 := time.Now()
				copyTree(b, native, filepath.Join(dir, "copies", fmt.Sprint(copies)))
				copyTime += time.Since(t0)
				copies++
			}
			p := fmt.Sprintf("d%03d/f%05d", (i*7)%files/100, (i*7)%files)
			for _, s := range []*fs.Store{plainStore, snapStore} { // interleaved
				t0 := time.Now()
				if _, err := s.WriteFile("bench", p, bytes.NewReader(content), 0, fs.Owner{}); err != nil {
					b.Fatal(err)
				}
				if s == plainStore {
					writePlain += time.Since(t0)
					continue
				}
				writeSnap += time.Since(t0)
				t0 = time.Now()
				if ru.snapshot("call") == "" {
					b.Fatal("the snapshot failed")
				}
				snapTime += time.Since(t0)
			}
		}
		want := calls
		if !ret.All {
			want = ret.Last
		}
		if list, err := snapStore.SnapshotNames("bench"); err != nil || len(list) != want {
			b.Fatalf("%d snapshots, %v; want %d", len(list), err, want)
		}
		time.Sleep(200 * time.Millisecond) // let both stores tidy
		heap := func() float64 {
			runtime.GC()
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return float64(m.HeapAlloc)
		}
		ru = nil
		both := heap()
		t0 := time.Now()
		snapStore.Close() // writes its checkpoint
		closeSnap := time.Since(t0)
		delete(stores, "snap")
		snapStore = nil
		plainOnly := heap()
		t0 = time.Now()
		plainStore.Close()
		closePlain := time.Since(t0)
		delete(stores, "plain")
		plainStore = nil
		none := heap()
		for _, d := range []string{"snap", "plain"} {
			ents, _ := os.ReadDir(filepath.Join(dir, d))
			for _, e := range ents {
				b.Logf("%s/%s: %.1f MiB", d, e.Name(), diskUse(b, filepath.Join(dir, d, e.Name()))/(1<<20))
			}
		}
		memSnap, memPlain := both-plainOnly, plainOnly-none
		diskSnap, diskPlain := diskUse(b, filepath.Join(dir, "snap")), diskUse(b, filepath.Join(dir, "plain"))
		b.ReportMetric(float64(snapTime.Microseconds())/calls, "us/snapshot")
		b.ReportMetric(float64(writeSnap.Microseconds())/calls, "us/write-snapshotted")
		b.ReportMetric(float64(writePlain.Microseconds())/calls, "us/write-plain")
		b.ReportMetric(float64(snapTime+writeSnap)/float64(writePlain), "x-call-time")
		b.ReportMetric(memSnap/(1<<20), "MiB-heap-snapshotted")
		b.ReportMetric(memPlain/(1<<20), "MiB-heap-plain")
		b.ReportMetric(memSnap/memPlain, "x-heap")
		b.ReportMetric(diskSnap/(1<<20), "MiB-disk-snapshotted")
		b.ReportMetric(diskPlain/(1<<20), "MiB-disk-plain")
		b.ReportMetric(diskSnap/diskPlain, "x-disk")
		b.ReportMetric(float64(closeSnap.Milliseconds()), "ms-close-snapshotted")
		b.ReportMetric(float64(closePlain.Milliseconds()), "ms-close-plain")
		// The naive snapshot: a copy of the session's tree on the host.
		copyEach := copyTime / time.Duration(copies)
		diskCopy := diskUse(b, filepath.Join(dir, "copies")) / float64(copies)
		b.ReportMetric(float64(copyEach.Microseconds()), "us/copy-tree")
		b.ReportMetric(float64(copyEach)/(float64(snapTime)/calls), "x-snapshot-faster-than-copy")
		b.ReportMetric(diskCopy/(1<<20), "MiB-disk-per-copy")
		// Against keeping as many copies as the store keeps snapshots.
		b.ReportMetric(diskCopy*float64(want)/max(diskSnap-diskPlain, 4096), "x-disk-saved-vs-copies")
		b.StartTimer()
	}
}

// naiveCopies is how many naive snapshots (copies of the whole tree)
// the benchmark takes among its calls: enough for a figure, few enough
// that the baseline does not take minutes.
const naiveCopies = 4

// nativeTree writes the benchmark's session tree (files of 1 KiB, 100
// to a directory) natively under dir.
func nativeTree(b testing.TB, dir string, files int) string {
	content := bytes.Repeat([]byte("x"), 1024)
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%05d", i))
		if i%100 == 0 {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// copyTree copies from to to file by file, as a naive snapshot would,
// and syncs it (a snapshot is durable when taken).
func copyTree(b testing.TB, from, to string) {
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		b.Fatal(err)
	}
	if err := exec.Command("sync", "-f", to).Run(); err != nil {
		b.Fatal(err)
	}
}

// diskUse is the space dir's files take on disk.
func diskUse(b testing.TB, dir string) float64 {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return float64(n)
}
