package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/guest"
	"hearth/vmm/jail"
	"hearth/vmm/vmmtest"
)

// The baselines are the jail tier (the same agent and protocol over a
// unix socket, no VM) and the host's own view of the workspace.

func jailDriver(b *testing.B) *jail.Driver {
	b.Helper()
	d, err := jail.New(filepath.Join(b.TempDir(), "jail"), vmmtest.GuestAgent(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkCreate measures Create (VM boot to the agent answering its
// first health check) of a machine with a workspace: booted on demand
// (cold), taken from the machines booted ahead of time (warm, the pool
// refilled untimed between creates), and, as the baseline, a jail's
// Create, in the same run. Run it with -benchtime=5x for the median of 5.
func BenchmarkCreate(b *testing.B) {
	requireVirtiofsd(b)
	cold := newDriver(b)
	warm := newWarmDriver(b, filepath.Join(b.TempDir(), "warm"))
	b.Cleanup(func() { warm.Close() })
	jd := jailDriver(b)
	root := busyboxImage(b)
	view := b.TempDir()
	ctx := context.Background()
	spec := func(id string) vmm.Spec {
		return vmm.Spec{ID: id, RootFS: root, Workspace: view, UID: 1000, GID: 1000}
	}
	var vc, vw, jl []time.Duration
	create := func(d vmm.Driver, id string, into *[]time.Duration) {
		start := time.Now()
		m, err := d.Create(ctx, spec(id))
		if err != nil {
			b.Fatal(err)
		}
		*into = append(*into, time.Since(start))
		m.Destroy(ctx)
	}
	for i := 0; i < b.N; i++ {
		// The spare boots untimed, and not while the others are timed.
		b.StopTimer()
		if err := warm.Warm(ctx, spec("warm")); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		create(warm, fmt.Sprintf("warm-%d", i), &vw)
		b.StopTimer()
		if err := warm.Warm(ctx, spec("warm")); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		create(cold, fmt.Sprintf("cold-%d", i), &vc)
		create(jd, fmt.Sprintf("jail-%d", i), &jl)
	}
	b.ReportMetric(median(vc).Seconds(), "s-median-create")
	b.ReportMetric(median(vw).Seconds(), "s-median-create-warm")
	b.ReportMetric(median(jl).Seconds(), "s-median-jail-create")
	b.ReportMetric(float64(median(vc))/float64(median(jl)), "x-jail")
	b.ReportMetric(float64(median(vw))/float64(median(jl)), "x-jail-warm")
}

// BenchmarkExecRoundTrip runs `true` through the agent of a VM (over
// virtio-serial) and of a jail (over a unix socket), alternately, and a
// health check (the round trip with no process) on each.
func BenchmarkExecRoundTrip(b *testing.B) {
	d := newDriver(b)
	jd := jailDriver(b)
	root := busyboxImage(b)
	ctx := context.Background()
	vm, err := d.Create(ctx, vmm.Spec{ID: "bench-exec", RootFS: root, UID: 1000, GID: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer vm.Destroy(ctx)
	jm, err := jd.Create(ctx, vmm.Spec{ID: "bench-exec", RootFS: root, UID: 1000, GID: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer jm.Destroy(ctx)
	run := func(m vmm.Machine) time.Duration {
		start := time.Now()
		st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
		if err != nil || st.Code != 0 {
			b.Fatalf("exec true in %s: %+v, %v", m.ID(), st, err)
		}
		return time.Since(start)
	}
	// A health check is the protocol's round trip alone, with no
	// process started: the channel's share of an exec.
	health := func(m vmm.Machine) time.Duration {
		start := time.Now()
		if _, err := m.Guest().Health(ctx); err != nil {
			b.Fatalf("health of %s: %v", m.ID(), err)
		}
		return time.Since(start)
	}
	var vt, jt, vh, jh []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		vt = append(vt, run(vm))
		jt = append(jt, run(jm))
		vh = append(vh, health(vm))
		jh = append(jh, health(jm))
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(median(vt)), "ms-median-vm-exec")
	b.ReportMetric(ms(median(jt)), "ms-median-jail-exec")
	b.ReportMetric(float64(median(vt))/float64(median(jt)), "x-jail")
	b.ReportMetric(ms(median(vh)), "ms-median-vm-health")
	b.ReportMetric(ms(median(jh)), "ms-median-jail-health")
	b.ReportMetric(float64(median(vh))/float64(median(jh)), "x-jail-health")
}

// BenchmarkVirtiofs writes then reads 64 MiB sequentially with dd in a
// VM, in its session's outputs over virtio-fs, and the same on the host
// through a view of the same workspace. Times are taken on the host
// around each dd (the guest's clock under TCG is approximate). Each side
// reads the file the other wrote, so neither reads from its page cache.
func BenchmarkVirtiofs(b *testing.B) {
	d := newDriver(b)
	requireVirtiofsd(b)
	root := busyboxImage(b)
	store, err := fs.Open(fs.Options{Dir: filepath.Join(b.TempDir(), "ws")})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if err := store.CreateSession("a", fs.Owner{UID: 1000, GID: 1000}); err != nil {
		b.Fatal(err)
	}
	view, err := store.Mount(filepath.Join(b.TempDir(), "view"), fs.ViewOptions{Session: "a"})
	if err != nil {
		b.Fatal(err)
	}
	hostView, err := store.Mount(filepath.Join(b.TempDir(), "host-view"), fs.ViewOptions{Session: "a"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "bench-fs", RootFS: root, Workspace: view.Dir(), UID: 1000, GID: 1000, Memory: 512 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		m.Destroy(ctx)
		view.Unmount()
		hostView.Unmount()
	}()
	const mib = 64
	write := fmt.Sprintf("dd if=/dev/zero of=%%s bs=1M count=%d conv=fsync 2>&1", mib)
	read := "dd if=%s of=/dev/null bs=1M 2>&1"
	inVM := func(script string) time.Duration {
		req := guest.ExecRequest{Argv: []string{"sh", "-c", script}}
		var out bytes.Buffer
		start := time.Now()
		st, err := m.Guest().Exec(ctx, req, nil, &out, &out)
		if err != nil || st.Code != 0 {
			b.Fatalf("in the VM, %q: %+v, %v: %s", script, st, err, out.String())
		}
		return time.Since(start)
	}
	onHost := func(script string) time.Duration {
		start := time.Now()
		if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			b.Fatalf("on the host, %q: %v: %s", script, err, out)
		}
		return time.Since(start)
	}
	var vw, vr, hw, hr []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		gf := fmt.Sprintf("/workspace/agents/a/outputs/vm-%d", i)
		hf := filepath.Join(hostView.Dir(), fmt.Sprintf("a/outputs/host-%d", i))
		vw = append(vw, inVM(fmt.Sprintf(write, gf)))
		hw = append(hw, onHost(fmt.Sprintf(write, hf)))
		vr = append(vr, inVM(fmt.Sprintf(read, strings.Replace(gf, "vm-", "host-", 1))))
		hvf := filepath.Join(hostView.Dir(), fmt.Sprintf("a/outputs/vm-%d", i))
		onHost("dd if=" + hvf + " iflag=nocache count=0 2>/dev/null")
		hr = append(hr, onHost(fmt.Sprintf(read, hvf)))
		inVM("rm -f " + gf)
		os.Remove(hf)
	}
	rate := func(d time.Duration) float64 { return mib / d.Seconds() }
	b.ReportMetric(rate(median(vw)), "MiB/s-vm-write")
	b.ReportMetric(rate(median(vr)), "MiB/s-vm-read")
	b.ReportMetric(rate(median(hw)), "MiB/s-host-write")
	b.ReportMetric(rate(median(hr)), "MiB/s-host-read")
	b.ReportMetric(float64(median(hw))/float64(median(vw)), "x-host-view-write")
	b.ReportMetric(float64(median(hr))/float64(median(vr)), "x-host-view-read")
}
