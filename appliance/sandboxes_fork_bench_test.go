package appliance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"hearth/appliance/appliancetest"
)

// BenchmarkSandboxFork forks a sandbox whose writable layer holds 1 GiB,
// N = 1 and 10 at a time, against creating N sandboxes of the same image
// (the baseline), interleaved in one run after a warm-up: on the state
// directory's own filesystem (ext4 here: the layer is copied) and on a
// loop-mounted btrfs (reflinks). It reports both sides' ms and the ratio.
func BenchmarkSandboxFork(b *testing.B) {
	for _, fsys := range []string{"host", "btrfs"} {
		b.Run("fs="+fsys, func(b *testing.B) {
			cfg := agentConfig(b)
			if fsys == "btrfs" {
				cfg.StateDir = filepath.Join(mountBtrfs(b, 32<<30), "state")
			}
			if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
				b.Fatal(err)
			}
			cfg.Sandbox.DefaultImage = "tiny"
			appliancetest.AddTinyImage(b, filepath.Join(cfg.StateDir, "images"))
			_, c := startSandboxDaemon(b, cfg)
			ctx := context.Background()
			if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "big", IdleTimeout: "0"}); err != nil {
				b.Fatal(err)
			}
			var out bytes.Buffer
			argv := []string{"sh", "-c", "dd if=/dev/zero of=/home/agent/big bs=1M count=1024 2>&1 && sync"}
			if st, err := c.Exec(ctx, "big", ExecRequest{Argv: argv}, &out, &out); err != nil || st.Code != 0 {
				b.Fatalf("write 1 GiB: %+v, %v: %s", st, err, &out)
			}
			for _, n := range []int{1, 10} {
				b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { benchFork(b, c, n) })
			}
		})
	}
}

func benchFork(b *testing.B, c *Client, n int) {
	ctx := context.Background()
	var forkT, createT time.Duration
	reflinked := false
	round := func(i int, count bool) {
		fork := func() {
			t0 := time.Now()
			res, err := c.ForkSandbox(ctx, "big", n)
			if err != nil {
				b.Fatalf("fork %d: %v", n, err)
			}
			if count {
				forkT += time.Since(t0)
			}
			reflinked = res.Reflinked
			for _, s := range res.Sandboxes {
				c.DestroySandbox(ctx, s.Id)
			}
		}
		create := func() {
			t0 := time.Now()
			var made []string
			for j := range n {
				s, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: fmt.Sprintf("base-%d-%d", i, j), IdleTimeout: "0"})
				if err != nil {
					b.Fatalf("create: %v", err)
				}
				made = append(made, s.Id)
			}
			if count {
				createT += time.Since(t0)
			}
			for _, id := range made {
				c.DestroySandbox(ctx, id)
			}
		}
		if i%2 == 0 {
			fork()
			create()
		} else {
			create()
			fork()
		}
	}
	round(-1, false) // warm-up
	b.ResetTimer()
	for i := range b.N {
		round(i, true)
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(per(forkT), "ms/fork")
	b.ReportMetric(per(createT), "ms/create")
	b.ReportMetric(per(forkT)/per(createT), "x-fork-vs-create")
	if reflinked {
		b.ReportMetric(1, "reflinked")
	} else {
		b.ReportMetric(0, "reflinked")
	}
}

// mountBtrfs makes a loop-mounted btrfs of size bytes (sparse), a
// filesystem with reflinks, and returns its mount point.
func mountBtrfs(b *testing.B, size int64) string {
	b.Helper()
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		b.Skip("the btrfs side needs mkfs.btrfs (Debian package btrfs-progs): not found")
	}
	dir := b.TempDir()
	img := filepath.Join(dir, "btrfs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", img).CombinedOutput(); err != nil {
		b.Fatalf("mkfs.btrfs: %v: %s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		b.Skipf("the btrfs side needs a loop mount of a btrfs image, which failed here: %v: %s", err, out)
	}
	b.Cleanup(func() { exec.Command("umount", mnt).Run() })
	return mnt
}
