package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hearth/internal/leftovers"
	"hearth/vmm/qemu"
)

// signalOn is stderr that closes seen once it holds want.
type signalOn struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalOn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *signalOn) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestUpInterruptedDuringStart: Ctrl-C while `hearth up` probes the tier
// (getting the VM kernel) stops it within seconds, saying the start was
// cancelled (or, if the start won the race, stopping the daemon as
// usual), and leaves no mount or socket. Its log is JSON lines, as
// [log] format = "json" asks.
func TestUpInterruptedDuringStart(t *testing.T) {
	e := newCrashEnv(t)
	if p := qemu.ProbeHost(context.Background(), qemu.Config{}); p.QEMU == "" || p.Virtiofsd == "" {
		t.Skipf("the auto tier probe gets the VM kernel only where qemu and virtiofsd are installed: %s", strings.Join(p.Problems, "; "))
	}
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[sandbox]\ntier = \"auto\"\n[log]\nformat = \"json\"\n", e.cfg.StateDir, e.cfg.Workspace.Mount)
	if err := os.WriteFile(e.config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out := &signalOn{want: "getting the VM kernel", seen: make(chan struct{})}
	cmd := exec.Command(e.bin, "up", "--config", e.config)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.daemon, e.done = cmd, make(chan struct{})
	done := e.done
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-out.seen:
	case <-done:
		t.Fatalf("hearth up exited before it got the VM kernel: %v\n%s", cmd.ProcessState, out)
	case <-time.After(60 * time.Second):
		t.Fatalf("hearth up did not get to the VM kernel within 60s:\n%s", out)
	}
	sent := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("hearth up still running 15s after SIGINT during its start:\n%s", out)
	}
	t.Logf("hearth up exited %v, %v after SIGINT", cmd.ProcessState, time.Since(sent).Round(time.Millisecond))
	log := out.String()
	if code := cmd.ProcessState.ExitCode(); code != 0 && !strings.Contains(log, "start cancelled: context canceled") {
		t.Errorf("hearth up exited %d after SIGINT during its start, without saying the start was cancelled:\n%s", code, log)
	}
	if left := leftovers.Mounts(e.dir); len(left) > 0 {
		t.Errorf("mounts left after hearth up stopped: %q", left)
	}
	if _, err := os.Lstat(e.cfg.SocketPath()); err == nil {
		t.Errorf("socket %s left after hearth up stopped", e.cfg.SocketPath())
	}
	for _, line := range strings.Split(log, "\n") {
		if line == "" || strings.HasPrefix(line, "hearth") || strings.HasPrefix(line, "boot:") {
			continue // what hearth up says to the person running it, and image progress
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["msg"] == nil {
			t.Errorf("log line %q is not a JSON record (log.format = \"json\")", line)
		}
	}
}
