package remote

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"hearth/fs"
)

// benchMounts mounts session alpha's view twice: locally (the FUSE view a
// machine on the serving node gets) and over sshfs on loopback (what a
// machine on another node gets, minus the network).
func benchMounts(b *testing.B) (local, remote string) {
	tb := newTestbed(b, "alpha")
	local = filepath.Join(b.TempDir(), "local")
	v, err := tb.store.Mount(local, fs.ViewOptions{Session: "alpha"})
	if err != nil {
		b.Fatalf("Mount: %v", err)
	}
	b.Cleanup(func() { v.Unmount() })
	return local, tb.mount(b, "alpha")
}

const smallFiles = 200

// smallRound creates, writes, stats and removes smallFiles files of 1 KiB
// in a fresh directory under root and returns the time it took.
func smallRound(b *testing.B, root string, round int) time.Duration {
	dir := filepath.Join(root, "alpha", "outputs", fmt.Sprintf("r%d", round))
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 1024)
	start := time.Now()
	for i := range smallFiles {
		p := filepath.Join(dir, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			b.Fatal(err)
		}
		if fi, err := os.Stat(p); err != nil || fi.Size() != 1024 {
			b.Fatalf("stat %s = %v, %v", p, fi, err)
		}
		if err := os.Remove(p); err != nil {
			b.Fatal(err)
		}
	}
	d := time.Since(start)
	if err := os.Remove(dir); err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkSmallFiles: create+write+stat+remove of 1 KiB files through
// sshfs against the local view, interleaved round by round.
func BenchmarkSmallFiles(b *testing.B) {
	local, remote := benchMounts(b)
	smallRound(b, local, -1) // warm both
	smallRound(b, remote, -2)
	var tl, tr time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tl += smallRound(b, local, 2*i)
		tr += smallRound(b, remote, 2*i+1)
	}
	n := float64(b.N * smallFiles)
	b.ReportMetric(float64(tl.Microseconds())/n, "us/file-local")
	b.ReportMetric(float64(tr.Microseconds())/n, "us/file-sshfs")
	b.ReportMetric(float64(tr)/float64(tl), "x-local")
}

const seqBytes = 32 << 20

// seqRound writes seqBytes to a new file (with fsync) and reads it back
// through a new handle, returning both times.
func seqRound(b *testing.B, root string, round int) (w, r time.Duration) {
	p := filepath.Join(root, "alpha", "outputs", fmt.Sprintf("seq%d", round))
	buf := bytes.Repeat([]byte{byte(round)}, 1<<20)
	start := time.Now()
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	for range seqBytes / len(buf) {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	w = time.Since(start)
	start = time.Now()
	f, err = os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for {
		k, err := f.Read(buf)
		n += k
		if err != nil {
			break
		}
	}
	f.Close()
	r = time.Since(start)
	if n != seqBytes {
		b.Fatalf("read %d bytes of %s, want %d", n, p, seqBytes)
	}
	if err := os.Remove(p); err != nil {
		b.Fatal(err)
	}
	return w, r
}

// BenchmarkSequential: 32 MiB written then read through sshfs against the
// local view, interleaved.
func BenchmarkSequential(b *testing.B) {
	local, remote := benchMounts(b)
	seqRound(b, local, 1000)
	seqRound(b, remote, 1001)
	var wl, rl, wr, rr time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w, r := seqRound(b, local, 2*i)
		wl, rl = wl+w, rl+r
		w, r = seqRound(b, remote, 2*i+1)
		wr, rr = wr+w, rr+r
	}
	mb := float64(b.N) * seqBytes / 1e6
	b.ReportMetric(mb/wl.Seconds(), "MB/s-write-local")
	b.ReportMetric(mb/wr.Seconds(), "MB/s-write-sshfs")
	b.ReportMetric(mb/rl.Seconds(), "MB/s-read-local")
	b.ReportMetric(mb/rr.Seconds(), "MB/s-read-sshfs")
	b.ReportMetric(float64(wr)/float64(wl), "x-local-write")
	b.ReportMetric(float64(rr)/float64(rl), "x-local-read")
}

// BenchmarkControlSnapshot: a snapshot of a session holding 2000 files
// taken by a node through the control channel against the same store
// operation on the serving node, interleaved: the snapshot stays O(1)
// there, and a node pays one round trip (a new SSH channel) on top.
func BenchmarkControlSnapshot(b *testing.B) {
	tb := newTestbed(b, "alpha")
	for i := range 2000 {
		if err := tb.write("alpha", fmt.Sprintf("outputs/f%d", i), "x"); err != nil {
			b.Fatal(err)
		}
	}
	c := tb.client(b)
	round := func(i int) (local, node time.Duration) {
		start := time.Now()
		if err := tb.store.Snapshot("alpha", fmt.Sprintf("l%d", i)); err != nil {
			b.Fatal(err)
		}
		local = time.Since(start)
		start = time.Now()
		if err := c.Snapshot("alpha", fmt.Sprintf("n%d", i)); err != nil {
			b.Fatal(err)
		}
		return local, time.Since(start)
	}
	round(-1) // warm both
	var tl, tn time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, n := round(i)
		tl, tn = tl+l, tn+n
	}
	b.ReportMetric(float64(tl.Microseconds())/float64(b.N), "us/snapshot-local")
	b.ReportMetric(float64(tn.Microseconds())/float64(b.N), "us/snapshot-node")
	b.ReportMetric(float64(tn)/float64(tl), "x-local")
}
