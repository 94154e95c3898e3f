package jail

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
)

type firstByte struct {
	at time.Time
}

func (f *firstByte) Write(p []byte) (int, error) {
	if f.at.IsZero() {
		f.at = time.Now()
	}
	return len(p), nil
}

// BenchmarkCreateToFirstByte measures a jail from Create to the first
// byte of an exec's output, against a plain fork+exec of the same echo on
// the host in the same run, and reports the median of each.
func BenchmarkCreateToFirstByte(b *testing.B) {
	d := newDriver(b)
	root := busyboxRoot(b)
	ctx := context.Background()
	var jail, host []time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		m, err := d.Create(ctx, vmm.Spec{ID: fmt.Sprintf("bench-%d", i), RootFS: root, UID: 1000, GID: 1000})
		if err != nil {
			b.Fatal(err)
		}
		var fb firstByte
		if _, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"echo", "hi"}}, nil, &fb, nil); err != nil {
			b.Fatal(err)
		}
		jail = append(jail, fb.at.Sub(start))
		b.StopTimer()
		m.Destroy(ctx)
		t0 := time.Now()
		exec.Command("echo", "hi").Run()
		host = append(host, time.Since(t0))
		b.StartTimer()
	}
	b.ReportMetric(ms(median(jail)), "ms-median-create-to-first-byte")
	b.ReportMetric(ms(median(host)), "ms-median-host-fork-exec")
	b.ReportMetric(float64(median(jail))/float64(median(host)), "x-fork-exec")
}

// BenchmarkExecInJail measures an exec round trip of `true` in a running
// jail against fork+exec of `true` on the host, in the same run.
func BenchmarkExecInJail(b *testing.B) {
	d := newDriver(b)
	root := busyboxRoot(b)
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "bench-exec", RootFS: root, UID: 1000, GID: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Destroy(ctx)
	n := max(b.N, 100)
	var inJail, host []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil || st.Code != 0 {
			b.Fatalf("exec true = %+v, %v", st, err)
		}
		t1 := time.Now()
		exec.Command("true").Run()
		inJail, host = append(inJail, t1.Sub(t0)), append(host, time.Since(t1))
	}
	b.ReportMetric(ms(median(inJail)), "ms-median-exec-in-jail")
	b.ReportMetric(ms(median(host)), "ms-median-host-fork-exec")
	b.ReportMetric(float64(median(inJail))/float64(median(host)), "x-fork-exec")
}

// BenchmarkIdleSandboxes starts 100 machines that run nothing and
// measures what they cost the host: the drop in the host's available
// memory (the baseline is taken just before, in the same run), the
// agents' proportional share of resident memory, and what their cgroups
// are charged. The target is under 10 MiB per machine (x-10MiB < 1).
func BenchmarkIdleSandboxes(b *testing.B) {
	const n = 100
	d := newDriver(b)
	root := busyboxRoot(b)
	ctx := context.Background()
	var host, pss, charged []float64 // MiB per machine, one per round
	for i := 0; i < b.N; i++ {
		before := memAvailable(b)
		ms := make([]vmm.Machine, 0, n)
		for j := 0; j < n; j++ {
			m, err := d.Create(ctx, vmm.Spec{ID: fmt.Sprintf("idle-%d", j), RootFS: root, UID: 1000, GID: 1000})
			if err != nil {
				b.Fatal(err)
			}
			ms = append(ms, m)
		}
		time.Sleep(2 * time.Second) // let the agents settle
		after := memAvailable(b)
		var p, c int64
		for _, m := range ms {
			p += pssOf(m.(*machine).agent().pid)
			c += m.(*machine).cg.memoryUsage()
		}
		for _, m := range ms {
			m.Destroy(ctx)
		}
		host = append(host, float64(before-after)/n/(1<<20))
		pss = append(pss, float64(p)/n/(1<<20))
		charged = append(charged, float64(c)/n/(1<<20))
	}
	b.ReportMetric(median(host), "MiB-host-per-sandbox")
	b.ReportMetric(median(pss), "MiB-agent-pss")
	b.ReportMetric(median(charged), "MiB-cgroup-charged")
	b.ReportMetric(median(host)/10, "x-10MiB")
}

// median sorts xs and returns its middle element.
func median[T cmp.Ordered](xs []T) T {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	return meminfoField(string(data), "MemAvailable:")
}

// pssOf is a process's proportional share of resident memory in bytes.
func pssOf(pid int) int64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	return meminfoField(string(data), "Pss:")
}

func meminfoField(text, key string) int64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
