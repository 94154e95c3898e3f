package appliance

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	"hearth/appliance/appliancetest"
	"hearth/vmm"
)

// BenchmarkSandboxCreate measures a sandbox of the base image through the
// API over its unix socket, as a client sees it: create, then exec
// `echo hi` (the first byte of its output, issue 19's target, and its
// status back), then an exec of `true`, then destroy, on a daemon with
// prepared jails (sandbox.warm = 1, the default) and on one without
// (cold), interleaved in the same run with a whole bubblewrap sandbox on
// the same image root running `echo hi` and a bare
// `unshare -Urmpn --fork true`. The warm side and the baselines each
// start once the daemons' background work is done (settled): before, the
// replacement of the claimed jail ran during the baselines and made them
// about half again as slow. It reports the median of each in ms, the
// warm create to first byte against the 5 ms target (x-5ms) and against
// the bare namespace of the same run (x-unshare), and the whole warm
// create+exec against bubblewrap's whole run (x-bwrap). The issue set 5 ms
// where unshare took 2.4 ms and bubblewrap 4.5: on a host whose process
// creation is slower or faster than that day's, x-unshare <= 2.08 and
// x-bwrap <= 1.11 are the same target in the run's own terms.
//
// It also reports the cheapest API request, GET /v1/health, made on the
// same settled host (ms/health-after-idle) and again right after it
// (ms/health-next): the difference is what waking idle cores costs here.
// A create and its first exec hand work between threads and processes
// (client, daemon, the sandbox's agent, its child) several times; on a VM
// whose idle vCPUs are slow to wake, that cost comes with each, and these
// two figures show how large it was in the run.
func BenchmarkSandboxCreate(b *testing.B) {
	cache := appliancetest.Images(b, "base")
	daemon := func(warm int) (*Daemon, *Client, string) {
		cfg := agentConfig(b)
		appliancetest.LinkImages(b, cfg.StateDir, cache)
		cfg.Sandbox.DefaultImage, cfg.Sandbox.Warm = "base", warm
		d, c := startSandboxDaemon(b, cfg)
		img, err := d.sbx.images.resolve("base")
		if err != nil {
			b.Fatal(err)
		}
		return d, c, img.Rootfs()
	}
	warmD, warm, root := daemon(1)
	coldD, cold, _ := daemon(0)
	// settled waits until both daemons have done the background work a
	// create leaves (the claimed jail replaced, record slots made again),
	// so each side, and the baselines, run on a quiet host.
	settled := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		spec := vmm.Spec{ID: "warm", RootFS: root, Disk: int64(warmD.sbx.cfg.Disk)}
		if err := warmD.sbx.driver.(interface {
			Warm(context.Context, vmm.Spec) error
		}).Warm(ctx, spec); err != nil {
			b.Fatal(err)
		}
		for _, d := range []*Daemon{warmD, coldD} {
			for d.sbx.slots.count() < recordSlots {
				if ctx.Err() != nil {
					b.Fatal("record slots not made again within a minute")
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	bwrap := bwrapRun(b, root)
	ctx := context.Background()
	n := 0
	type sides struct{ firstByte, create, exec, destroy []time.Duration }
	hearth := func(c *Client, to *sides) {
		n++
		id := fmt.Sprintf("bench-%d", n)
		t0 := time.Now()
		if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: id, IdleTimeout: "0"}); err != nil {
			b.Fatal(err)
		}
		var out firstByte
		if st, err := c.Exec(ctx, id, ExecRequest{Argv: []string{"echo", "hi"}}, &out, nil); err != nil || st.Code != 0 || out.n != 3 {
			b.Fatalf("exec echo hi in %s = %+v, %v (%d bytes out)", id, st, err, out.n)
		}
		t1 := time.Now()
		execTrue(b, c, id)
		t2 := time.Now()
		if err := c.DestroySandbox(ctx, id); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		to.firstByte = append(to.firstByte, out.at.Sub(t0))
		to.create, to.exec, to.destroy = append(to.create, t1.Sub(t0)), append(to.exec, t2.Sub(t1)), append(to.destroy, t3.Sub(t2))
	}
	var w, c sides
	var bw, us, hl, hb []time.Duration
	round := func() {
		settled()
		hearth(warm, &w)
		settled()
		if bwrap != nil {
			bw = append(bw, timeRun(b, bwrap()))
		}
		us = append(us, timeRun(b, exec.Command("unshare", "-Urmpn", "--fork", "true")))
		hearth(cold, &c)
		settled()
		for _, to := range []*[]time.Duration{&hl, &hb} {
			t0 := time.Now()
			if _, err := warm.Health(ctx); err != nil {
				b.Fatal(err)
			}
			*to = append(*to, time.Since(t0))
		}
	}
	for range 3 {
		round()
	}
	w, c, bw, us, hl, hb = sides{}, sides{}, nil, nil, nil, nil
	b.ResetTimer()
	for range b.N {
		for range 10 {
			round()
		}
	}
	b.StopTimer()
	b.ReportMetric(medianMS(w.firstByte), "ms/create-first-byte-hearth")
	b.ReportMetric(medianMS(w.firstByte)/5, "x-5ms")
	b.ReportMetric(medianMS(w.create), "ms/create-exec-hearth")
	b.ReportMetric(medianMS(w.exec), "ms/exec-hearth")
	b.ReportMetric(medianMS(w.destroy), "ms/destroy-hearth")
	b.ReportMetric(medianMS(c.firstByte), "ms/create-first-byte-cold")
	b.ReportMetric(medianMS(c.create), "ms/create-exec-cold")
	b.ReportMetric(medianMS(c.exec), "ms/exec-cold")
	b.ReportMetric(medianMS(c.destroy), "ms/destroy-cold")
	b.ReportMetric(medianMS(us), "ms/unshare-true")
	b.ReportMetric(medianMS(hl), "ms/health-after-idle")
	b.ReportMetric(medianMS(hb), "ms/health-next")
	b.ReportMetric(medianMS(w.firstByte)/medianMS(us), "x-unshare")
	if bwrap != nil {
		b.ReportMetric(medianMS(bw), "ms/bwrap-echo")
		b.ReportMetric(medianMS(w.create)/medianMS(bw), "x-bwrap")
	}
}

// firstByte counts what is written to it and notes when the first byte
// came.
type firstByte struct {
	at time.Time
	n  int
}

func (f *firstByte) Write(p []byte) (int, error) {
	if f.n == 0 && len(p) > 0 {
		f.at = time.Now()
	}
	f.n += len(p)
	return len(p), nil
}

// bwrapRun returns a command making a whole bubblewrap sandbox on root
// (every namespace, root read-only, its own /proc, /dev and /tmp) that
// runs `echo hi`; nil, with the reason logged, when bwrap is missing.
func bwrapRun(b *testing.B, root string) func() *exec.Cmd {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		b.Log("no bubblewrap side: bwrap: not found (install Debian's bubblewrap)")
		return nil
	}
	return func() *exec.Cmd {
		return exec.Command(path, "--unshare-all", "--die-with-parent", "--ro-bind", root, "/",
			"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "/bin/echo", "hi")
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
