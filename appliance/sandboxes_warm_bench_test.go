package appliance

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	"hearth/appliance/appliancetest"
)

// BenchmarkSandboxCreate measures a sandbox of the base image through the
// API over its unix socket, as a client sees it: create and exec `true`
// until the exec's status is back, then another exec, then destroy, on a
// daemon with prepared jails (sandbox.warm = 1, the default) and on one
// without (cold), interleaved in the same run with a whole bubblewrap
// sandbox on the same image root running `true` and a bare
// `unshare -Urmpn --fork true`. It reports the median of each in ms and
// the warm create+exec against bubblewrap (x-bwrap).
func BenchmarkSandboxCreate(b *testing.B) {
	cache := appliancetest.Images(b, "base")
	daemon := func(warm int) (*Client, string) {
		cfg := agentConfig(b)
		appliancetest.LinkImages(b, cfg.StateDir, cache)
		cfg.Sandbox.DefaultImage, cfg.Sandbox.Warm = "base", warm
		d, c := startSandboxDaemon(b, cfg)
		img, err := d.sbx.images.resolve("base")
		if err != nil {
			b.Fatal(err)
		}
		return c, img.Rootfs()
	}
	warm, root := daemon(1)
	cold, _ := daemon(0)
	bwrap := bwrapRun(b, root)
	ctx := context.Background()
	n := 0
	hearth := func(c *Client, create, execT, destroy *[]time.Duration) {
		n++
		id := fmt.Sprintf("bench-%d", n)
		t0 := time.Now()
		if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: id, IdleTimeout: "0"}); err != nil {
			b.Fatal(err)
		}
		execTrue(b, c, id)
		t1 := time.Now()
		execTrue(b, c, id)
		t2 := time.Now()
		if err := c.DestroySandbox(ctx, id); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		*create, *execT, *destroy = append(*create, t1.Sub(t0)), append(*execT, t2.Sub(t1)), append(*destroy, t3.Sub(t2))
	}
	var wCreate, wExec, wDestroy, cCreate, cExec, cDestroy, bw, us []time.Duration
	round := func() {
		hearth(warm, &wCreate, &wExec, &wDestroy)
		if bwrap != nil {
			bw = append(bw, timeRun(b, bwrap()))
		}
		us = append(us, timeRun(b, exec.Command("unshare", "-Urmpn", "--fork", "true")))
		hearth(cold, &cCreate, &cExec, &cDestroy)
		// The prepared jail claimed is replaced in the background: a
		// client creating sandboxes back to back without pause would
		// wait for it (or get a cold one).
		time.Sleep(50 * time.Millisecond)
	}
	for range 3 {
		round()
	}
	wCreate, wExec, wDestroy, cCreate, cExec, cDestroy, bw, us = nil, nil, nil, nil, nil, nil, nil, nil
	b.ResetTimer()
	for range b.N {
		for range 10 {
			round()
		}
	}
	b.StopTimer()
	b.ReportMetric(medianMS(wCreate), "ms/create-exec-hearth")
	b.ReportMetric(medianMS(wExec), "ms/exec-hearth")
	b.ReportMetric(medianMS(wDestroy), "ms/destroy-hearth")
	b.ReportMetric(medianMS(cCreate), "ms/create-exec-cold")
	b.ReportMetric(medianMS(cExec), "ms/exec-cold")
	b.ReportMetric(medianMS(cDestroy), "ms/destroy-cold")
	b.ReportMetric(medianMS(us), "ms/unshare-true")
	if bwrap != nil {
		b.ReportMetric(medianMS(bw), "ms/bwrap-true")
		b.ReportMetric(medianMS(wCreate)/medianMS(bw), "x-bwrap")
	}
}

// bwrapRun returns a command making a whole bubblewrap sandbox on root
// (every namespace, root read-only, its own /proc, /dev and /tmp) that
// runs `true`; nil, with the reason logged, when bwrap is missing.
func bwrapRun(b *testing.B, root string) func() *exec.Cmd {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		b.Log("no bubblewrap side: bwrap: not found (install Debian's bubblewrap)")
		return nil
	}
	return func() *exec.Cmd {
		return exec.Command(path, "--unshare-all", "--die-with-parent", "--ro-bind", root, "/",
			"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "/bin/true")
	}
}

func execTrue(b *testing.B, c *Client, id string) {
	if st, err := c.Exec(context.Background(), id, ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil || st.Code != 0 {
		b.Fatalf("exec true in %s = %+v, %v", id, st, err)
	}
}

func timeRun(b *testing.B, cmd *exec.Cmd) time.Duration {
	t0 := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%v: %v: %s", cmd.Args, err, out)
	}
	return time.Since(t0)
}

func medianMS(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
