package appliance

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"hearth/vmm/vmmtest"
)

// TestSandboxPauseNeverLosesAByte (issue 19, item 5): 100 cycles of
// writing files of random sizes and contents into a sandbox, in its
// writable layer and in its workspace session, then pausing and resuming
// it: on request, or every tenth cycle by its idle timeout, and twice
// across a daemon restart: at cycle 33 while paused on request, at 66
// while running (the stopping daemon pauses it, the next one resumes
// it). After every cycle every file of both trees is hashed inside the
// machine, in one exec, and the set of files and each one's hash must be
// the test's own; counters started at the beginning (a line every 100
// ms, in the layer and in the workspace) must still run, with no number
// skipped or repeated. The one exception is told: a write whose file was
// opened before a restart while paused on request fails (the file
// belongs to the dead view), and the counter logs its number; once at
// most. Across a restart while running none may fail: the daemon pauses
// at a moment with no file open, and a process caught between resolving
// a path and opening it walks it again into the new view (the old one's
// keeper answers ESTALE: TestRestartMidWalk).
//
// Those counters are detached processes: a running job keeps a sandbox
// awake (TestSandboxIdlePause), so with one the idle pause would never
// come. A real background job (`sandboxes jobs`) runs through every
// other cycle, the restarts included: started before the pause, it must
// still be running after the resume, its output and its workspace file
// each an unbroken count. It is stopped before each idle cycle.
//
// A cycle is two execs (the writes, the check) around the pause and
// resume, so the QEMU tier runs all 100 cycles too.
func TestSandboxPauseNeverLosesAByte(t *testing.T) {
	onJailAndQEMU(t, pauseCycles)
}

const (
	pauseCycleCount   = 100
	pausedRestartAt   = 33 // the daemon restarts under a sandbox paused on request
	runningRestartAt  = 66 // and under a running one
	pauseSession      = "pl"
	pauseSandbox      = "keeper"
	pauseLayerDir     = "home/agent/pl"
	pauseWorkspaceDir = "workspace/agents/" + pauseSession + "/outputs/pl"
)

// pauseRig is the state of pauseCycles: the daemon, what the test wrote,
// and how far the counters and the job have counted.
type pauseRig struct {
	t   *testing.T
	cfg Config
	d   *Daemon
	c   *Client
	rng *rand.Rand

	want  map[string]string // path in the machine, without the leading /: hex md5
	paths []string

	counters       []string // counter files
	pids           []string
	lastCount      []int
	failures       []int
	pausedRestarts int

	job      string
	jobLines int

	// What each part of a plain cycle took, for the log.
	phases map[string][]time.Duration
}

// timed runs fn and notes its time under name.
func (r *pauseRig) timed(name string, fn func()) {
	began := time.Now()
	fn()
	r.phases[name] = append(r.phases[name], time.Since(began))
}

// medians reports each phase's median time.
func (r *pauseRig) medians() string {
	var out []string
	for _, name := range []string{"write", "pause+resume", "check exec", "host check", "job check"} {
		d := slices.Clone(r.phases[name])
		slices.Sort(d)
		if len(d) > 0 {
			out = append(out, fmt.Sprintf("%s %v", name, d[len(d)/2].Round(time.Millisecond)))
		}
	}
	return strings.Join(out, ", ")
}

// pauseCycles runs the 100 cycles on a daemon of cfg.
func pauseCycles(t *testing.T, cfg Config) {
	ctx := context.Background()
	r := &pauseRig{t: t, cfg: cfg, c: NewClient(cfg.SocketPath()), want: map[string]string{},
		phases: map[string][]time.Duration{},
		rng:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 19))}
	var err error
	if r.d, err = Start(ctx, cfg, testLogger(t)); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { destroyAll(r.d); r.d.Close() })
	if _, err := r.c.CreateSandbox(ctx, CreateSandboxRequest{Id: pauseSandbox, Session: pauseSession, IdleTimeout: "400ms"}); err != nil {
		t.Fatal(err)
	}
	r.startCounters()

	start := time.Now()
	var plain []time.Duration
	idle, explicit, jobs := 0, 0, 0
	for cycle := 1; cycle <= pauseCycleCount; cycle++ {
		began := time.Now()
		idleCycle := cycle%10 == 0
		if r.job == "" && !idleCycle {
			r.startJob(cycle)
			jobs++
		}
		var wrote []string
		r.timed("write", func() { wrote = r.write(cycle) })
		switch {
		case cycle == pausedRestartAt:
			r.pause(cycle)
			r.pausedRestarts++
			r.restartDaemon(cycle)
			waitStatus(t, r.c, pauseSandbox, "paused", false)
			r.resume(cycle)
			explicit++
		case cycle == runningRestartAt: // the stopping daemon pauses it, the next resumes it
			r.restartDaemon(cycle)
			waitStatus(t, r.c, pauseSandbox, "running", false)
		case idleCycle: // the idle timeout pauses it; the check's exec resumes it
			waitStatus(t, r.c, pauseSandbox, "paused", true)
			idle++
		default:
			r.timed("pause+resume", func() { r.pause(cycle); r.resume(cycle) })
			explicit++
		}
		full := idleCycle || cycle == 1 || cycle == pausedRestartAt || cycle == runningRestartAt
		r.check(cycle, cycle == pausedRestartAt, full, wrote)
		if (cycle+1)%10 == 0 && r.job != "" { // the job would keep the next cycle's idle pause away
			r.stopJob(cycle)
		}
		if !idleCycle && cycle != pausedRestartAt && cycle != runningRestartAt {
			plain = append(plain, time.Since(began))
		}
	}
	slices.Sort(plain)
	t.Logf("%d cycles in %v, a cycle paused and resumed on request %v (median; slowest %v; %s) (%d paused on request, %d by the idle timeout, daemon restarted at cycle %d (paused) and %d (running)): %d files checked after each, counters at %v lines (%v writes failed and were told so), %d jobs checked across resumes",
		pauseCycleCount, time.Since(start).Round(time.Millisecond), plain[len(plain)/2].Round(time.Millisecond), plain[len(plain)-1].Round(time.Millisecond), r.medians(),
		explicit, idle, pausedRestartAt, runningRestartAt, len(r.paths), r.lastCount, r.failures, jobs)
}

// exec runs a shell script in the sandbox and returns its output; any
// failure fails the test.
func (r *pauseRig) exec(script string, stdin []byte, args ...string) string {
	r.t.Helper()
	var out, errb bytes.Buffer
	argv := append([]string{"sh", "-c", script, "sh"}, args...)
	st, err := r.c.Exec(context.Background(), pauseSandbox, ExecRequest{Argv: argv, Stdin: stdin, Timeout: "60s"}, &out, &errb)
	if err != nil || st.Code != 0 {
		r.t.Fatalf("exec %q %q: %+v, %v; stderr %q", script, args, st, err, errb.String())
	}
	return out.String()
}

// startCounters starts the counters, detached from the exec that starts
// them: one in the writable layer, one in the workspace session. A
// number whose write failed (the writer was told) goes to a log in the
// layer instead.
func (r *pauseRig) startCounters() {
	r.counters = []string{"/home/agent/counter", "/workspace/agents/" + pauseSession + "/outputs/counter"}
	for k, f := range r.counters {
		pid := strings.TrimSpace(r.exec(`mkdir -p /`+pauseLayerDir+` /`+pauseWorkspaceDir+` &&
			setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i >> "$1" || echo $i >> "$2"; sleep 0.1; done' sh "$1" "$2" </dev/null >/dev/null 2>&1 &
			echo $!`, nil, f, fmt.Sprintf("/home/agent/counter-failed%d", k)))
		if _, err := strconv.Atoi(pid); err != nil {
			r.t.Fatalf("counter pid %q", pid)
		}
		r.pids = append(r.pids, pid)
	}
	r.lastCount, r.failures = make([]int, len(r.counters)), make([]int, len(r.counters))
}

func (r *pauseRig) randomBytes() []byte {
	n := r.rng.IntN(4096)
	switch r.rng.IntN(8) {
	case 0:
		n = 0
	case 1, 2:
		n = r.rng.IntN(128 << 10)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.rng.Uint32())
	}
	return b
}

// write writes this cycle's files, one in the layer and one in the
// workspace, in one exec (a tar on its stdin); every third cycle it also
// rewrites an older file in place, shorter or longer (cat > FILE).
func (r *pauseRig) write(cycle int) (wrote []string) {
	r.t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	add := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Uid: 1000, Gid: 1000}); err != nil {
			r.t.Fatal(err)
		}
		tw.Write(b)
	}
	record := func(path string, b []byte) {
		sum := md5.Sum(b)
		if _, ok := r.want[path]; !ok {
			r.paths = append(r.paths, path)
		}
		r.want[path] = hex.EncodeToString(sum[:])
	}
	for _, dir := range []string{pauseLayerDir, pauseWorkspaceDir} {
		path, b := fmt.Sprintf("%s/f%03d", dir, cycle), r.randomBytes()
		add(path, b)
		record(path, b)
		wrote = append(wrote, path)
	}
	script, rewrite := `tar -xf - -C /`, ""
	if cycle%3 == 0 {
		rewrite = r.paths[r.rng.IntN(len(r.paths))]
		b := r.randomBytes()
		add("tmp/pl-rewrite", b)
		record(rewrite, b)
		wrote = append(wrote, rewrite)
		script += ` && cat /tmp/pl-rewrite > "/$1"` // the next rewrite replaces /tmp/pl-rewrite
	}
	tw.Close()
	r.exec(script, tb.Bytes(), rewrite)
	return wrote
}

func (r *pauseRig) pause(cycle int) {
	r.t.Helper()
	if sb, err := r.c.PauseSandbox(context.Background(), pauseSandbox); err != nil || sb.Status != "paused" {
		r.t.Fatalf("cycle %d: pause = %+v, %v", cycle, sb, err)
	}
}

func (r *pauseRig) resume(cycle int) {
	r.t.Helper()
	if sb, err := r.c.ResumeSandbox(context.Background(), pauseSandbox); err != nil || sb.Status != "running" {
		r.t.Fatalf("cycle %d: resume = %+v, %v", cycle, sb, err)
	}
}

func (r *pauseRig) restartDaemon(cycle int) {
	r.t.Helper()
	r.d.Close()
	var err error
	if r.d, err = Start(context.Background(), r.cfg, testLogger(r.t)); err != nil {
		r.t.Fatalf("cycle %d: restart: %v", cycle, err)
	}
}

// checkScript fails if a process named before the first "--" is gone
// (the counters), then prints the md5 of every file in the layer's tree
// and of the workspace files (or glob) named before the second "--", a
// line "==", and every line of the files named after it as "FILE:LINE"
// (the counters, the numbers they could not write, the job's file).
// Three processes: under QEMU's software emulation each costs tens of
// milliseconds.
const checkScript = `cd / || exit 1
while [ "$1" != -- ]; do
	kill -0 "$1" || { echo "counter $1 is gone" >&2; exit 1; }
	shift
done
shift
ws=
while [ "$1" != -- ]; do ws="$ws $1"; shift; done
shift
md5sum ` + pauseLayerDir + `/* $ws || exit 1
echo ==
grep -sH '' "$@"
exit 0
`

// check compares every file and every byte of both trees with what the
// test wrote, and checks the counters and the job moved on since the
// last check, unbroken: one exec, again until they moved (15 s at
// most).
//
// The layer's tree is hashed in the machine. Reading a file of the
// workspace in a VM costs about 10 ms under QEMU's software emulation
// (a virtio-fs round trip per path step, open, read and release, with
// no cache kept: docs/isolation.md), so the whole workspace tree is
// hashed in the machine only in full cycles (the idle ones, the restarts,
// the first); in the others the machine hashes the files this cycle
// wrote there, and the whole tree is hashed through the daemon's host
// view of the same session, which is what the machine's writes reached.
func (r *pauseRig) check(cycle int, restarted, full bool, wrote []string) {
	r.t.Helper()
	failed := func(k int) string { return fmt.Sprintf("/home/agent/counter-failed%d", k) }
	args := append(slices.Clone(r.pids), "--")
	if full {
		args = append(args, pauseWorkspaceDir+"/*")
	} else {
		for _, p := range wrote {
			if strings.HasPrefix(p, pauseWorkspaceDir+"/") {
				args = append(args, p)
			}
		}
	}
	args = append(args, "--")
	for k, f := range r.counters {
		args = append(args, f, failed(k))
	}
	if r.job != "" {
		args = append(args, pauseJobFile)
	}
	var sums string
	var lines map[string][]string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var out string
		r.timed("check exec", func() { out = r.exec(checkScript, nil, args...) })
		var rest string
		sums, rest, _ = strings.Cut(out, "==\n")
		lines = map[string][]string{}
		for _, l := range strings.Split(rest, "\n") {
			if f, v, ok := strings.Cut(l, ":"); ok {
				lines[f] = append(lines[f], v)
			}
		}
		if r.moved(lines) {
			break
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("cycle %d: the counters or the job have not moved in 15s after the resume: %v lines before, %q now", cycle, r.lastCount, rest)
		}
	}
	r.checkFiles(cycle, sums, full)
	r.timed("host check", func() { r.checkHostFiles(cycle) })
	for k, f := range r.counters {
		r.checkCounter(cycle, k, lines[f], lines[failed(k)], restarted)
	}
	if r.job != "" {
		r.timed("job check", func() { r.checkJob(cycle, lines[pauseJobFile]) })
	}
}

// checkFiles compares md5sum's lines with the files the test wrote: in
// the layer, and in the workspace in a full check, the same names, none
// missing and none more, the same hashes; else the workspace files it
// was given.
func (r *pauseRig) checkFiles(cycle int, sums string, full bool) {
	r.t.Helper()
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(sums), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			got[f[1]] = f[0]
		}
	}
	for p, sum := range got {
		if r.want[p] != sum {
			r.t.Fatalf("cycle %d: /%s has md5 %s in the machine, want %q", cycle, p, sum, r.want[p])
		}
	}
	want := 0
	for _, p := range r.paths {
		if full || strings.HasPrefix(p, pauseLayerDir+"/") {
			want++
			if _, ok := got[p]; !ok {
				r.t.Fatalf("cycle %d: /%s is missing in the machine", cycle, p)
			}
		}
	}
	if full && len(got) != want {
		r.t.Fatalf("cycle %d: the machine has %d files in the trees, the test wrote %d: %q", cycle, len(got), want, sums)
	}
}

// checkHostFiles hashes the workspace tree through the daemon's host
// view: every file the test wrote there, and no other.
func (r *pauseRig) checkHostFiles(cycle int) {
	r.t.Helper()
	dir := filepath.Join(r.cfg.Workspace.Mount, strings.TrimPrefix(pauseWorkspaceDir, "workspace/agents/"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		r.t.Fatalf("cycle %d: the host view: %v", cycle, err)
	}
	n := 0
	for _, p := range r.paths {
		if !strings.HasPrefix(p, pauseWorkspaceDir+"/") {
			continue
		}
		n++
		b, err := os.ReadFile(filepath.Join(dir, path.Base(p)))
		sum := md5.Sum(b)
		if err != nil || hex.EncodeToString(sum[:]) != r.want[p] {
			r.t.Fatalf("cycle %d: /%s through the host view: md5 %x, %v; want %s", cycle, p, sum, err, r.want[p])
		}
	}
	if len(ents) != n {
		r.t.Fatalf("cycle %d: the host view has %d files in %s, the test wrote %d", cycle, len(ents), dir, n)
	}
}

// moved reports whether the counters and the job's file have more lines
// than at the last check.
func (r *pauseRig) moved(lines map[string][]string) bool {
	for k, f := range r.counters {
		if len(lines[f]) <= r.lastCount[k] {
			return false
		}
	}
	return r.job == "" || len(lines[pauseJobFile]) > r.jobLines
}

// checkCounter checks counter k's lines. A write fails only if a restart
// killed the view its file was opened in, which the daemon avoids when
// it pauses for the restart itself: only across a restart while paused
// on request, once at most, and told.
func (r *pauseRig) checkCounter(cycle, k int, lines, failed []string, restarted bool) {
	r.t.Helper()
	f := r.counters[k]
	n, err := vmmtest.UnbrokenCount(lines, failed)
	if err != nil {
		r.t.Fatalf("cycle %d: %s: %v", cycle, f, err)
	}
	if n > r.failures[k] && !restarted || n > r.pausedRestarts {
		r.t.Fatalf("cycle %d: %s: %d writes failed (%q) after %d daemon restarts while paused on request", cycle, f, n, failed, r.pausedRestarts)
	}
	if len(lines) <= r.lastCount[k] {
		r.t.Fatalf("cycle %d: %s has %d lines, not more than the %d it had", cycle, f, len(lines), r.lastCount[k])
	}
	r.failures[k], r.lastCount[k] = n, len(lines)
}

// pauseJobFile is where the background job counts, in the workspace.
const pauseJobFile = "/workspace/agents/" + pauseSession + "/outputs/job"

// startJob starts the background job: a count on its output and in a
// workspace file.
func (r *pauseRig) startJob(cycle int) {
	r.t.Helper()
	j, err := r.c.StartJob(context.Background(), pauseSandbox, JobRequest{Argv: []string{"sh", "-c",
		`rm -f "$1"; i=0; while :; do i=$((i+1)); echo $i; echo $i >> "$1" || echo $i >&2; sleep 0.1; done`, "sh", pauseJobFile}})
	if err != nil || j.State != "running" {
		r.t.Fatalf("cycle %d: StartJob = %+v, %v", cycle, j, err)
	}
	r.job, r.jobLines = j.Id, 0
}

// checkJob checks the job still runs after the resume and its output
// and file (as the check read it) count on, unbroken.
func (r *pauseRig) checkJob(cycle int, file []string) {
	r.t.Helper()
	ctx := context.Background()
	if j, err := r.c.Job(ctx, pauseSandbox, r.job); err != nil || j.State != "running" {
		r.t.Fatalf("cycle %d: job after the resume = %+v, %v; want running", cycle, j, err)
	}
	told := strings.Fields(jobOutput(r.t, r.c, pauseSandbox, r.job, "stderr"))
	if n, err := vmmtest.UnbrokenCount(file, told); err != nil || n > r.pausedRestarts {
		r.t.Fatalf("cycle %d: job's file: %v; %d writes failed (%q) after %d daemon restarts while paused on request", cycle, err, n, told, r.pausedRestarts)
	}
	// Its output reaches the host through the agent: it may lag the file.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out := strings.Fields(jobOutput(r.t, r.c, pauseSandbox, r.job, "stdout"))
		if _, err := vmmtest.UnbrokenCount(out, nil); err != nil {
			r.t.Fatalf("cycle %d: job's output: %v", cycle, err)
		}
		if len(out) > r.jobLines {
			r.jobLines = min(len(out), len(file))
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("cycle %d: the job's output has not moved past %d lines in 15s after the resume", cycle, r.jobLines)
		}
	}
}

func (r *pauseRig) stopJob(cycle int) {
	r.t.Helper()
	if j, err := r.c.StopJob(context.Background(), pauseSandbox, r.job, time.Second); err != nil || j.State == "running" {
		r.t.Fatalf("cycle %d: StopJob = %+v, %v", cycle, j, err)
	}
	r.job = ""
}
