package jail

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
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
	slices.Sort(jail)
	slices.Sort(host)
	b.ReportMetric(float64(jail[len(jail)/2].Microseconds())/1000, "ms-median-create-to-first-byte")
	b.ReportMetric(float64(host[len(host)/2].Microseconds())/1000, "ms-median-host-fork-exec")
	b.ReportMetric(float64(jail[len(jail)/2])/float64(host[len(host)/2]), "x-fork-exec")
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
	slices.Sort(inJail)
	slices.Sort(host)
	b.ReportMetric(float64(inJail[n/2].Microseconds())/1000, "ms-median-exec-in-jail")
	b.ReportMetric(float64(host[n/2].Microseconds())/1000, "ms-median-host-fork-exec")
	b.ReportMetric(float64(inJail[n/2])/float64(host[n/2]), "x-fork-exec")
}
