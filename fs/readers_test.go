package fs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSlowRequestLeavesOthersAnswered holds an open in its copy-up (a
// request quickRequest calls slow) and checks that the view answers
// another process's creates, stats, listings and removals meanwhile: the
// goroutine that read the open started another reader first.
func TestSlowRequestLeavesOthersAnswered(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	// Written through the Go API, so no release of a writer is still on
	// its way: the blob, shared with the snapshot and open nowhere, is
	// copied by the next writer's open.
	if _, err := s.WriteFile("s", "outputs/shared", strings.NewReader("before the snapshot"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	mustSnapshot(t, s, "s", "snap")
	dir := filepath.Join(mountView(t, s, ViewOptions{Host: true}), "s", "outputs")
	shared := filepath.Join(dir, "shared")

	entered, release := make(chan struct{}), make(chan struct{})
	var once, releaseOnce sync.Once
	hook := func() {
		once.Do(func() { close(entered) })
		<-release
	}
	copyUpHook.Store(&hook)
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(func() { copyUpHook.Store(nil); letGo() })

	// Requests answered one after another leave one reader: any other
	// still waiting from the mount's start answers one of these and ends.
	for i := 0; i < 10; i++ {
		if _, err := unix.Lgetxattr(shared, "user.none", nil); err != unix.ENODATA {
			t.Fatalf("getxattr %s = %v, want ENODATA", shared, err)
		}
	}
	opened := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(shared, os.O_WRONLY, 0)
		if err == nil {
			err = f.Close()
		}
		opened <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the open did not reach its copy-up in 10s")
	}

	// Another process works in the same directory while the open waits.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	script := `cd "$1" && echo x > a && stat -c %s a && mkdir d && mv a d/b && ls d && rm d/b && rmdir d`
	out, err := exec.CommandContext(ctx, "sh", "-c", script, "sh", dir).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("a shell's requests were not answered in 10s while an open was copying up (%q)", out)
	}
	if err != nil || string(out) != "2\nb\n" {
		t.Fatalf("shell = %q, %v; want %q", out, err, "2\nb\n")
	}
	select {
	case err := <-opened:
		t.Fatalf("the open returned (%v) while its copy-up was held", err)
	default:
	}

	letGo()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatalf("open for writing after its copy-up: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the open did not return in 10s after its copy-up was let go")
	}
	wantFile(t, s, "s", "snap", "outputs/shared", "before the snapshot")
}

// BenchmarkRoundTrip measures one FUSE request's round trip (a getxattr
// the view answers from memory) from a process of its own, through two
// host views of one store: one with this package's reader policy
// (quickRequest) and one with go-fuse's own, interleaved, and reports
// the median round of each (us/request-quick, us/request-upstream) and
// their ratio (x-upstream; above 1 is faster than upstream's policy).
func BenchmarkRoundTrip(b *testing.B) {
	const requests = 20000
	s := testStore(b)
	mustSession(b, s, "bench")
	file := func(opts ViewOptions) string {
		p := filepath.Join(mountView(b, s, opts), "bench", "outputs", "f")
		if err := os.WriteFile(p, nil, 0o644); err != nil && !os.IsExist(err) {
			b.Fatal(err)
		}
		return p
	}
	quick, upstream := file(ViewOptions{Host: true}), file(ViewOptions{Host: true, upstreamReaders: true})
	roundTrips(b, quick, requests) // warm-up
	roundTrips(b, upstream, requests)
	b.ResetTimer()
	var tq, tu []time.Duration
	for i := 0; i < 5*b.N; i++ {
		if i%2 == 0 {
			tq, tu = append(tq, roundTrips(b, quick, requests)), append(tu, roundTrips(b, upstream, requests))
		} else {
			tu, tq = append(tu, roundTrips(b, upstream, requests)), append(tq, roundTrips(b, quick, requests))
		}
	}
	q, u := median(tq), median(tu)
	b.ReportMetric(float64(q.Nanoseconds())/1e3/requests, "us/request-quick")
	b.ReportMetric(float64(u.Nanoseconds())/1e3/requests, "us/request-upstream")
	b.ReportMetric(u.Seconds()/q.Seconds(), "x-upstream")
}

// roundTrips runs n getxattr calls on path in TestRoundTripClient's
// process and returns the time they took there.
func roundTrips(b *testing.B, path string, n int) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRoundTripClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), "HEARTH_ROUNDTRIP_FILE="+path, fmt.Sprintf("HEARTH_ROUNDTRIP_N=%d", n))
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("round trips on %s: %v", path, err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		b.Fatalf("round trips on %s answered %q: %v", path, out, err)
	}
	return time.Duration(ns)
}

// TestRoundTripClient is roundTrips' process; it does nothing otherwise.
// It prints the loop's time in nanoseconds.
func TestRoundTripClient(t *testing.T) {
	path := os.Getenv("HEARTH_ROUNDTRIP_FILE")
	if path == "" {
		t.Skip("runs only as BenchmarkRoundTrip's client process")
	}
	n, err := strconv.Atoi(os.Getenv("HEARTH_ROUNDTRIP_N"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	buf := make([]byte, 64)
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := unix.Lgetxattr(path, "user.hearth.bench", buf); err != unix.ENODATA {
			fmt.Fprintf(os.Stderr, "getxattr %s: %v, want ENODATA\n", path, err)
			os.Exit(1)
		}
	}
	fmt.Println(time.Since(start).Nanoseconds())
	os.Exit(0)
}
