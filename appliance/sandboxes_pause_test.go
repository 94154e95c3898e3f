package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"hearth/vmm/vmmtest"
)

// TestSandboxPauseNeverLosesAByte (issue 19, item 5): cycles of writing
// files of random sizes and contents into a sandbox, in its writable
// layer and in its workspace session, then pausing and resuming it: on
// request, or every few cycles by its idle timeout, and twice, in the
// middle, across a daemon restart: once while paused on request, once
// while running (the stopping daemon pauses it, the next one resumes it).
// After every cycle every file written so far is hashed inside the
// machine and compared with the test's own hashes, and counters started
// at the beginning (a line every 100 ms, in the layer and in the
// workspace) must still run, with no number skipped or repeated. The one
// exception is told: a write whose file was opened before a restart
// while paused on request fails (the file belongs to the dead view), and
// the counter logs its number; once at most. Across a restart while
// running none may fail: the daemon pauses at a moment with no file open.
//
// Those counters are detached processes: a running job keeps a sandbox
// awake (TestSandboxIdlePause), so with one the idle pause would never
// come. A real background job (`sandboxes jobs`) runs through every
// other cycle, the restarts included: started before the pause, it must
// still be running after the resume, its output and its workspace file
// each an unbroken count. It is stopped before each idle cycle.
func TestSandboxPauseNeverLosesAByte(t *testing.T) {
	t.Run("jail", func(t *testing.T) {
		cfg := sandboxConfig(t)
		pauseCycles(t, cfg, 100, 0)
	})
	t.Run("qemu", func(t *testing.T) {
		if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
			t.Skip("qemu-system-x86_64 not on PATH: apt-get install qemu-system-x86 (scripts/test.sh does)")
		}
		if _, err := exec.LookPath("apt-get"); err != nil {
			t.Skip("the VM kernel comes from Debian's linux-image-cloud-amd64, fetched with apt-get")
		}
		cfg := sandboxConfig(t)
		cfg.Sandbox.Tier = TierQEMU
		cfg.Sandbox.AllowTCG = true
		cfg.Sandbox.Memory = 256 << 20
		// TCG is slow: as many cycles as fit in two minutes, at least 10.
		pauseCycles(t, cfg, 10, 2*time.Minute)
	})
}

// pauseCycles runs at least atLeast cycles on a daemon of cfg, and more while
// budget (if any) lasts, up to 100, restarting the daemon twice in the
// middle.
func pauseCycles(t *testing.T, cfg Config, atLeast int, budget time.Duration) {
	ctx := context.Background()
	d, err := Start(ctx, cfg, testLogger(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { destroyAll(d); d.Close() })
	c := NewClient(cfg.SocketPath())
	const id, session = "keeper", "pl"
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: id, Session: session, IdleTimeout: "400ms"}); err != nil {
		t.Fatal(err)
	}
	exe := func(script string, stdin []byte, args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		argv := append([]string{"sh", "-c", script, "sh"}, args...)
		st, err := c.Exec(ctx, id, ExecRequest{Argv: argv, Stdin: stdin, Timeout: "60s"}, &out, &errb)
		if err != nil || st.Code != 0 {
			t.Fatalf("exec %q %q: %+v, %v; stderr %q", script, args, st, err, errb.String())
		}
		return out.String()
	}

	// The counters, detached from the exec that starts them: one in the
	// writable layer, one in the workspace session. A number whose write
	// failed (the writer was told) goes to a log in the layer instead.
	counters := []string{"/home/agent/counter", "/workspace/agents/" + session + "/outputs/counter"}
	var pids []string
	for k, f := range counters {
		pid := strings.TrimSpace(exe(`mkdir -p /home/agent/pl /workspace/agents/`+session+`/outputs/pl &&
			setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i >> "$1" || echo $i >> "$2"; sleep 0.1; done' sh "$1" "$2" </dev/null >/dev/null 2>&1 &
			echo $!`, nil, f, fmt.Sprintf("/home/agent/pl/failed%d", k)))
		if _, err := strconv.Atoi(pid); err != nil {
			t.Fatalf("counter pid %q", pid)
		}
		pids = append(pids, pid)
	}
	lastCount, failures, pausedRestarts := make([]int, len(counters)), make([]int, len(counters)), 0
	checkCounters := func(cycle int, restarted bool) {
		t.Helper()
		for k, f := range counters {
			deadline := time.Now().Add(15 * time.Second)
			for {
				out := exe(`kill -0 "$1" || { echo "counter $1 is gone" >&2; exit 1; }; cat "$2"; echo --; cat "$3" 2>/dev/null || true`,
					nil, pids[k], f, fmt.Sprintf("/home/agent/pl/failed%d", k))
				written, failed, _ := strings.Cut(out, "--\n")
				lines := strings.Fields(written)
				n, err := vmmtest.UnbrokenCount(lines, strings.Fields(failed))
				if err != nil {
					t.Fatalf("cycle %d: %s: %v", cycle, f, err)
				}
				// A write fails only if a restart killed the view its
				// file was opened in, which the daemon avoids when it
				// pauses for the restart itself: only across a restart
				// while paused on request, once at most, and told.
				if n > failures[k] && !restarted || n > pausedRestarts {
					t.Fatalf("cycle %d: %s: %d writes failed (%q) after %d daemon restarts while paused on request", cycle, f, n, failed, pausedRestarts)
				}
				failures[k] = n
				if len(lines) > lastCount[k] {
					lastCount[k] = len(lines)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("cycle %d: %s has not moved past %d lines in 15s after the resume", cycle, f, lastCount[k])
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 19))
	want := map[string]string{} // path in the machine: hex sha256
	var paths []string
	randomBytes := func() []byte {
		n := rng.IntN(4096)
		switch rng.IntN(8) {
		case 0:
			n = 0
		case 1, 2:
			n = rng.IntN(128 << 10)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	write := func(path string) {
		t.Helper()
		b := randomBytes()
		exe(`cat > "$1"`, b, path)
		sum := sha256.Sum256(b)
		if _, ok := want[path]; !ok {
			paths = append(paths, path)
		}
		want[path] = hex.EncodeToString(sum[:])
	}
	check := func(cycle int) {
		t.Helper()
		out := exe(`sha256sum "$@"`, nil, paths...)
		got := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				got[f[1]] = f[0]
			}
		}
		for _, p := range paths {
			if got[p] != want[p] {
				t.Fatalf("cycle %d: %s has sha256 %q in the machine, want %s", cycle, p, got[p], want[p])
			}
		}
	}

	// The background job: a count on its output and in a workspace file.
	var job string
	jobLines := 0
	jobFile := "/workspace/agents/" + session + "/outputs/pl/job"
	startJob := func(cycle int) {
		t.Helper()
		exe(`rm -f "$1"`, nil, jobFile)
		j, err := c.StartJob(ctx, id, JobRequest{Argv: []string{"sh", "-c",
			`i=0; while :; do i=$((i+1)); echo $i; echo $i >> "$1" || echo $i >&2; sleep 0.1; done`, "sh", jobFile}})
		if err != nil || j.State != "running" {
			t.Fatalf("cycle %d: StartJob = %+v, %v", cycle, j, err)
		}
		job, jobLines = j.Id, 0
	}
	checkJob := func(cycle int) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if j, err := c.Job(ctx, id, job); err != nil || j.State != "running" {
				t.Fatalf("cycle %d: job after the resume = %+v, %v; want running", cycle, j, err)
			}
			out := strings.Fields(jobOutput(t, c, id, job, "stdout"))
			file := strings.Fields(exe(`cat "$1"`, nil, jobFile))
			if _, err := vmmtest.UnbrokenCount(out, nil); err != nil {
				t.Fatalf("cycle %d: job's output: %v", cycle, err)
			}
			told := strings.Fields(jobOutput(t, c, id, job, "stderr"))
			if n, err := vmmtest.UnbrokenCount(file, told); err != nil || n > pausedRestarts {
				t.Fatalf("cycle %d: job's file: %v; %d writes failed (%q) after %d daemon restarts while paused on request", cycle, err, n, told, pausedRestarts)
			}
			if len(out) > jobLines && len(file) > jobLines {
				jobLines = min(len(out), len(file))
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: the job's count has not moved past %d in 15s after the resume", cycle, jobLines)
			}
		}
	}
	stopJob := func(cycle int) {
		t.Helper()
		if j, err := c.StopJob(ctx, id, job, time.Second); err != nil || j.State == "running" {
			t.Fatalf("cycle %d: StopJob = %+v, %v", cycle, j, err)
		}
		job = ""
	}
	restartDaemon := func(cycle int) {
		t.Helper()
		d.Close()
		var err error
		if d, err = Start(ctx, cfg, testLogger(t)); err != nil {
			t.Fatalf("cycle %d: restart: %v", cycle, err)
		}
	}

	start := time.Now()
	n, idle, explicit, jobs := 0, 0, 0, 0
	pausedRestart, runningRestart := -1, -1
	for cycle := 1; cycle <= 100; cycle++ {
		if cycle > atLeast && (budget == 0 || time.Since(start) > budget) {
			break
		}
		// The restarts: at cycles 51 and 76, or at half and three
		// quarters of the budget (at cycles 5 and 8 at the least).
		if pausedRestart < 0 && (cycle == 51 || budget > 0 && (time.Since(start) > budget/2 || cycle == atLeast/2)) {
			pausedRestart = cycle
		} else if pausedRestart > 0 && runningRestart < 0 && cycle > pausedRestart+1 && cycle%5 != 0 &&
			(cycle >= 76 || budget > 0 && (time.Since(start) > budget*3/4 || cycle >= atLeast*3/4)) {
			runningRestart = cycle
		}
		idleCycle := cycle%5 == 0 && cycle != pausedRestart && cycle != runningRestart
		if job == "" && !idleCycle {
			startJob(cycle)
			jobs++
		}
		write(fmt.Sprintf("/home/agent/pl/f%03d", cycle))
		write(fmt.Sprintf("/workspace/agents/%s/outputs/pl/f%03d", session, cycle))
		if cycle%3 == 0 { // rewrite an older file: shorter or longer
			write(paths[rng.IntN(len(paths))])
		}
		switch {
		case cycle == pausedRestart:
			if _, err := c.PauseSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
			pausedRestarts++
			restartDaemon(cycle)
			waitStatus(t, c, id, "paused", false)
			if _, err := c.ResumeSandbox(ctx, id); err != nil {
				t.Fatalf("cycle %d: resume after the restart: %v", cycle, err)
			}
			explicit++
		case cycle == runningRestart:
			// The stopping daemon pauses it, the next resumes it.
			restartDaemon(cycle)
			waitStatus(t, c, id, "running", false)
		case idleCycle: // the idle timeout pauses it; the next exec resumes it
			waitStatus(t, c, id, "paused", true)
			idle++
		default:
			if sb, err := c.PauseSandbox(ctx, id); err != nil || sb.Status != "paused" {
				t.Fatalf("cycle %d: pause = %+v, %v", cycle, sb, err)
			}
			if sb, err := c.ResumeSandbox(ctx, id); err != nil || sb.Status != "running" {
				t.Fatalf("cycle %d: resume = %+v, %v", cycle, sb, err)
			}
			explicit++
		}
		check(cycle)
		checkCounters(cycle, cycle == pausedRestart)
		if job != "" {
			checkJob(cycle)
			if (cycle+1)%5 == 0 { // the job would keep the next cycle's idle pause away
				stopJob(cycle)
			}
		}
		n = cycle
	}
	slices.Sort(paths)
	restarted := "no daemon restart"
	if pausedRestart > 0 {
		restarted = fmt.Sprintf("daemon restarted at cycle %d (paused) and %d (running)", pausedRestart, runningRestart)
	}
	if runningRestart < 0 {
		t.Errorf("the daemon was not restarted under a running sandbox: %d cycles were too few", n)
	}
	t.Logf("%d cycles in %v (%d paused on request, %d by the idle timeout, %s): %d files checked after each, counters at %v lines (%v writes failed and were told so), %d jobs checked across resumes",
		n, time.Since(start).Round(time.Millisecond), explicit, idle, restarted, len(paths), lastCount, failures, jobs)
}
