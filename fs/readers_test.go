package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// TestQuickRequest: which requests one reader answers itself. A request
// that may copy data is slow; so is one whose body is too short to say.
func TestQuickRequest(t *testing.T) {
	le := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	cases := []struct {
		name string
		op   uint32
		in   []byte
		want bool
	}{
		{"lookup", 1, []byte("name\x00"), true},
		{"create", 35, make([]byte, 16), true},
		{"unlink", 10, []byte("name\x00"), true},
		{"release", 18, make([]byte, 24), true},
		{"open for reading", 14, le(syscall.O_RDONLY), true},
		{"open emptying", 14, le(syscall.O_WRONLY | syscall.O_TRUNC), true},
		{"open for writing (may copy up)", 14, le(syscall.O_WRONLY), false},
		{"open read-write (may copy up)", 14, le(syscall.O_RDWR | syscall.O_APPEND), false},
		{"open, body cut short", 14, []byte{0}, false},
		{"chmod", 4, le(1 << 0), true},
		{"times", 4, le(1<<4 | 1<<5), true},
		{"truncate (may copy)", 4, le(1<<3 | 1<<5), false},
		{"setattr, no body", 4, nil, false},
		{"read off passthrough", 15, make([]byte, 40), false},
		{"write off passthrough", 16, make([]byte, 40), false},
		{"fsync", 20, make([]byte, 16), false},
		{"fallocate", 43, make([]byte, 32), false},
		{"unknown", 4096, nil, false},
	}
	for _, tc := range cases {
		if got := quickRequest(tc.op, tc.in); got != tc.want {
			t.Errorf("quickRequest(%d, %x) [%s] = %v, want %v", tc.op, tc.in, tc.name, got, tc.want)
		}
	}
}

// FuzzQuickRequest: any body the reader hands it, however short, is
// classified without a panic.
func FuzzQuickRequest(f *testing.F) {
	f.Add(uint32(14), []byte{1, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint32(4), []byte{8})
	f.Fuzz(func(t *testing.T, op uint32, in []byte) {
		quickRequest(op, in)
	})
}

// TestReaderSleepsWhenIdle: after a burst of requests, which sets the
// view's reader polling for the next (quickSpin), an idle view costs no
// CPU: the reader stops polling within its window and sleeps in poll(2),
// from which the next request still wakes it.
func TestReaderSleepsWhenIdle(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	p := filepath.Join(mountView(t, s, ViewOptions{Host: true}), "s", "outputs", "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	getxattr := func() {
		t.Helper()
		if _, err := unix.Lgetxattr(p, "user.none", nil); err != unix.ENODATA {
			t.Fatalf("getxattr %s = %v, want ENODATA", p, err)
		}
	}
	for i := 0; i < 2000; i++ {
		getxattr()
	}
	time.Sleep(100 * time.Millisecond) // the window is 50 us
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	time.Sleep(time.Second)
	// A reader that kept polling would use the whole second of a core.
	if used := cpu() - before; used > 200*time.Millisecond {
		t.Errorf("the process used %v of CPU in a second with its view idle; want its reader asleep", used)
	}
	getxattr()
}

// BenchmarkRoundTrip measures FUSE round trips from a process of its
// own through three host views of one store, one per reader policy
// (readerPolicy), in rotating order, and reports the median round of
// each (us/op-spin is the default) and the default's speed-up over the
// others (x-quick, x-upstream; above 1 is faster). getxattr is one
// request the view answers from memory; open-read is an open, a read
// and a close of a 100-byte file (open is a request quickRequest calls
// slow when it is for writing).
func BenchmarkRoundTrip(b *testing.B) {
	for _, op := range []string{"getxattr", "open-read"} {
		b.Run(op, func(b *testing.B) { roundTripPolicies(b, op) })
	}
}

func roundTripPolicies(b *testing.B, op string) {
	const requests = 20000
	s := testStore(b)
	mustSession(b, s, "bench")
	policies := []readerPolicy{readersSpin, readersQuick, readersUpstream}
	files := make([]string, len(policies))
	for i, p := range policies {
		files[i] = filepath.Join(mountView(b, s, ViewOptions{Host: true, readers: p}), "bench", "outputs", "f")
		if err := os.WriteFile(files[i], bytes.Repeat([]byte("x"), 100), 0o644); err != nil {
			b.Fatal(err)
		}
		roundTrips(b, op, files[i], requests) // warm-up
	}
	b.ResetTimer()
	times := make([][]time.Duration, len(policies))
	for round := 0; round < 6*b.N; round++ {
		for k := range policies {
			i := (round + k) % len(policies)
			times[i] = append(times[i], roundTrips(b, op, files[i], requests))
		}
	}
	spin, quick, upstream := median(times[0]), median(times[1]), median(times[2])
	perOp := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / requests }
	b.ReportMetric(perOp(spin), "us/op-spin")
	b.ReportMetric(perOp(quick), "us/op-quick")
	b.ReportMetric(perOp(upstream), "us/op-upstream")
	b.ReportMetric(quick.Seconds()/spin.Seconds(), "x-quick")
	b.ReportMetric(upstream.Seconds()/spin.Seconds(), "x-upstream")
}

// roundTrips runs n of op on path in TestRoundTripClient's process and
// returns the time they took there.
func roundTrips(b *testing.B, op, path string, n int) time.Duration {
	return clientTime(b, "TestRoundTripClient", "HEARTH_ROUNDTRIP_OP="+op, "HEARTH_ROUNDTRIP_FILE="+path, fmt.Sprintf("HEARTH_ROUNDTRIP_N=%d", n))
}

// TestRoundTripClient is roundTrips' process; it does nothing otherwise.
// It prints the loop's time in nanoseconds.
func TestRoundTripClient(t *testing.T) {
	path := os.Getenv("HEARTH_ROUNDTRIP_FILE")
	if path == "" {
		t.Skip("runs only as BenchmarkRoundTrip's client process")
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	n, err := strconv.Atoi(os.Getenv("HEARTH_ROUNDTRIP_N"))
	if err != nil {
		fail(err)
	}
	buf := make([]byte, 4096)
	var once func() error
	switch op := os.Getenv("HEARTH_ROUNDTRIP_OP"); op {
	case "getxattr":
		once = func() error {
			if _, err := unix.Lgetxattr(path, "user.hearth.bench", buf); err != unix.ENODATA {
				return fmt.Errorf("getxattr %s: %v, want ENODATA", path, err)
			}
			return nil
		}
	case "open-read":
		once = func() error {
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if k, err := unix.Read(fd, buf); err != nil || k != 100 {
				return fmt.Errorf("read %s: %d, %v", path, k, err)
			}
			return nil
		}
	default:
		fail(fmt.Errorf("unknown op %q", op))
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := once(); err != nil {
			fail(err)
		}
	}
	fmt.Println(time.Since(start).Nanoseconds())
	os.Exit(0)
}
