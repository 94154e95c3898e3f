package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestScheduleCommands adds, lists, runs and removes a schedule with the
// CLI: output for people, --json for programs, exit codes for mistakes.
func TestScheduleCommands(t *testing.T) {
	c, _ := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{say("done")}}, false)

	out, errOut, code := hearth(t, "schedules", "ls", c)
	if code != 0 || !strings.Contains(out, "no schedules") {
		t.Fatalf("schedules ls (none) = %d, %q, %q", code, out, errOut)
	}
	out, errOut, code = hearth(t, "schedules", "add", "nightly", "@every 1h", "analyst", "Summarise the day", "--budget", "1", "--overlap", "queue", c)
	if code != 0 || !strings.Contains(out, "added schedule nightly: agent analyst, @every 1h; next run 59 minutes from now") {
		t.Fatalf("schedules add = %d, %q, %q", code, out, errOut)
	}
	out, errOut, code = hearth(t, "schedules", "ls", c)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "ID SPEC AGENT NEXT LAST" ||
		!strings.Contains(lines[1], "nightly") || !strings.Contains(lines[1], "@every 1h") || !strings.Contains(lines[1], "59 minutes from now") ||
		!strings.HasSuffix(lines[1], "-") {
		t.Fatalf("schedules ls = %d, %q, %q", code, out, errOut)
	}
	out, _, code = hearth(t, "schedules", "ls", "--json", c)
	var list []client.Schedule
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Overlap != "queue" || list[0].Limits.Usd != 1 {
		t.Fatalf("schedules ls --json = %d, %q", code, out)
	}
	out, errOut, code = hearth(t, "schedules", "run", "nightly", c)
	if code != 0 || !strings.Contains(out, "started run") {
		t.Fatalf("schedules run = %d, %q, %q", code, out, errOut)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"bad spec", []string{"add", "x", "every day", "analyst", "go"}, exitError, "@daily"},
		{"unknown agent", []string{"add", "x", "@daily", "nobody", "go"}, exitNotFound, "no agent"},
		{"looser budget", []string{"add", "x", "@daily", "analyst", "go", "--budget", "50"}, exitError, "only tighten"},
		{"missing args", []string{"add", "x", "@daily"}, exitUsage, "usage: hearth schedules add"},
		{"id in use", []string{"add", "nightly", "@daily", "analyst", "go"}, exitError, "already exists: remove it first ('hearth schedules rm nightly')"},
		{"every second", []string{"add", "x", "@every 1s", "analyst", "go"}, exitError, "at least 1m0s apart"},
		{"unknown verb", []string{"frobnicate"}, exitUsage, "add, ls, rm"},
		{"rm unknown", []string{"rm", "nope"}, exitNotFound, "nope"},
		{"runs unknown", []string{"runs", "nope"}, exitNotFound, "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := hearth(t, append(append([]string{"schedules"}, tc.args...), c)...)
			if code != tc.code || !strings.Contains(errOut, tc.msg) {
				t.Errorf("schedules %q = %d, %q; want %d with %q", tc.args, code, errOut, tc.code, tc.msg)
			}
		})
	}

	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		out, errOut, code = hearth(t, "schedules", "runs", "nightly", c)
		if code != 0 || strings.Contains(out, "exec-") && !strings.Contains(out, "running since") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedules runs: no run after 2 minutes: %q", out)
		}
	}
	if code != 0 || !strings.Contains(out, "RUN") || !strings.Contains(out, "ok after") || !strings.Contains(out, "(manual)") {
		t.Fatalf("schedules runs = %d, %q, %q", code, out, errOut)
	}
	out, errOut, code = hearth(t, "schedules", "rm", "nightly", c)
	if code != 0 || !strings.Contains(out, "removed schedule nightly") {
		t.Fatalf("schedules rm = %d, %q, %q", code, out, errOut)
	}
	out, errOut, code = hearth(t, "schedules", "runs", "nightly", c)
	if code != 0 || !strings.Contains(out, "RUN") || !strings.Contains(out, "(manual)") {
		t.Errorf("schedules runs after rm = %d, %q, %q; want the history kept", code, out, errOut)
	}
}

// TestFlagsRefuseBadNumbers: flags whose values the daemon misread are
// refused by the CLI, naming the flag, before anything is sent: a NaN or
// infinite budget (a raw JSON error before), one under the ledger's
// micro-dollar (reserved $0 and dropped the limit), a zero budget (no
// limit), a negative or zero timeout or turn count (silently ignored),
// and credits under a micro-dollar (recorded as "$0"). Input files over
// the daemon's limit are refused from their sizes, before being read (a
// 500 MB one was read and base64-encoded whole, 2.5 GB of memory, before
// the daemon refused it).
func TestFlagsRefuseBadNumbers(t *testing.T) {
	dir := t.TempDir()
	cfg := "--config=" + filepath.Join(dir, "hearth.toml") // a config with no daemon: nothing is sent
	if err := os.WriteFile(filepath.Join(dir, "hearth.toml"), []byte("state_dir = \""+dir+"/state\"\n[workspace]\nmount = \""+dir+"/mnt\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	big, small, small2 := filepath.Join(dir, "big.bin"), filepath.Join(dir, "a.bin"), filepath.Join(dir, "b.bin")
	for p, size := range map[string]int64{big: 2 << 30, small: 600 << 20, small2: 500 << 20} {
		if err := os.Truncate(p, 0); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size) // sparse: made at once, 0 bytes on disk
		f.Close()
	}
	start := time.Now()
	defer func() {
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("refusing took %v: the inputs were read", took)
		}
	}()
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"agents", "run", "analyst", "go", "--budget", "NaN"}, `"--budget" flag: NaN is not a number of dollars`},
		{[]string{"agents", "run", "analyst", "go", "--budget", "Inf"}, `"--budget" flag: +Inf is not a number of dollars`},
		{[]string{"agents", "run", "analyst", "go", "--budget", "-1"}, `"--budget" flag: -1 is negative`},
		{[]string{"agents", "run", "analyst", "go", "--budget", "0.0000001"}, "less than the ledger's unit"},
		{[]string{"agents", "run", "analyst", "go", "--budget", "0"}, `"--budget" flag: $0 would leave no budget`},
		{[]string{"agents", "run", "analyst", "go", "--timeout", "-1s"}, `"--timeout" flag: -1s: give a positive duration`},
		{[]string{"agents", "run", "analyst", "go", "--timeout", "0s"}, `"--timeout" flag: 0s: give a positive duration`},
		{[]string{"agents", "run", "analyst", "go", "--max-turns", "-3"}, `"--max-turns" flag: -3: give a positive number`},
		{[]string{"agents", "run", "analyst", "go", "--max-calls", "0"}, `"--max-calls" flag: 0: give a positive number`},
		{[]string{"agents", "resume", "session-x", "go", "--budget", "nan"}, `"--budget" flag: NaN is not a number of dollars`},
		{[]string{"schedules", "add", "x", "@daily", "analyst", "go", "--budget", "1e-9"}, "less than the ledger's unit"},
		{[]string{"schedules", "add", "x", "@daily", "analyst", "go", "--timeout", "-5m"}, `"--timeout" flag: -5m0s`},
		{[]string{"credits", "add", "1e-9"}, "less than the ledger's unit"},
		{[]string{"credits", "add", "NaN"}, "NaN is not a number of dollars"},
		{[]string{"agents", "run", "analyst", "go", "--input", big}, "over the 1.0 GiB a task may have"},
		{[]string{"agents", "run", "analyst", "go", "--input", small, "--input", small2}, "over the 1.0 GiB a task may have"},
		{[]string{"agents", "resume", "session-x", "go", "--input", t.TempDir()}, "not a regular file"},
	} {
		_, errOut, code := hearth(t, append(tc.args, cfg)...)
		if code != exitUsage || !strings.Contains(errOut, tc.msg) {
			t.Errorf("hearth %q = %d, %q; want %d with %q", tc.args, code, errOut, exitUsage, tc.msg)
		}
	}
}
