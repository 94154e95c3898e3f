package scheduler_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"hearth/scheduler"
)

const crashDirEnv = "HEARTH_SCHEDULER_CRASH_DIR"

// TestCrashRunInProgress kills (SIGKILL) a process whose scheduled run is
// going: after the restart the run is in the history, naming what its Job
// had started, and marked interrupted.
func TestCrashRunInProgress(t *testing.T) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		crashChild(t, dir)
		return
	}
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run", "^TestCrashRunInProgress$", "-test.timeout", "2m")
	child.Env = append(os.Environ(), crashDirEnv+"="+dir)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	running := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "running" {
				running <- true
				return
			}
		}
		running <- false
	}()
	select {
	case ok := <-running:
		if !ok {
			t.Fatal("the child process ended before its run started")
		}
	case <-time.After(time.Minute):
		t.Fatal("the child's run did not start within a minute")
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()

	e := &env{dir: dir, clock: newFakeClock(t0.Add(time.Hour)), job: newTestJob(true)}
	s := e.open(t)
	runs := history(t, s, "nightly")
	if len(runs) != 1 {
		t.Fatalf("history after the crash = %+v, want the one run that was going", runs)
	}
	r := runs[0]
	if r.Result != "exec-42" || r.Err != scheduler.ErrInterrupted.Error() || r.Started.IsZero() || !r.Ended.Equal(t0.Add(time.Hour)) {
		t.Errorf("run after the crash = %+v; want result exec-42, error %q, ended at the restart", r, scheduler.ErrInterrupted)
	}
	if last := status(t, s, "nightly").Last; last == nil || last.ID != r.ID || last.Err == "" {
		t.Errorf("status after the crash: last run %+v, want the interrupted one", last)
	}
	// A second restart changes nothing more.
	s.Close(context.Background())
	e.clock = newFakeClock(t0.Add(2 * time.Hour))
	if again := history(t, e.open(t), "nightly"); len(again) != 1 || !again[0].Ended.Equal(r.Ended) {
		t.Errorf("history after a second restart = %+v, want the same run, ended at the first", again)
	}
}

// crashChild runs a schedule whose Job reports its result and then hangs
// until the parent kills the process.
func crashChild(t *testing.T, dir string) {
	st, err := scheduler.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	job := func(ctx context.Context, r scheduler.Run) (string, error) {
		scheduler.ReportResult(ctx, "exec-42")
		os.Stdout.WriteString("running\n")
		<-ctx.Done()
		return "", ctx.Err()
	}
	s, err := scheduler.New(st, job, scheduler.Options{Clock: newFakeClock(t0), Location: time.UTC})
	if err != nil {
		t.Fatal(err)
	}
	mustAdd(t, s, scheduler.Schedule{ID: "nightly", Spec: "@daily"})
	if _, err := s.RunNow("nightly"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute) // killed before this ends
	t.Error("the parent did not kill this process")
}
