package appliance

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hearth/fs"
	"hearth/vmm/qemu"
)

// cancelOn is a log handler that passes records to the test's log and
// cancels a context the first time a message starts with prefix.
type cancelOn struct {
	slog.Handler
	prefix string
	cancel context.CancelFunc
	mu     *sync.Mutex
	at     *time.Time
}

func (h cancelOn) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.mu.Lock()
		if h.at.IsZero() {
			*h.at = time.Now()
			h.cancel()
		}
		h.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h cancelOn) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

// leftovers says what a daemon that is not running left behind: its
// socket, its workspace mount, the workspace store's lock, and child
// processes of this test beyond those it had before (before).
func leftovers(t *testing.T, cfg Config, before int) []string {
	t.Helper()
	var left []string
	if _, err := os.Lstat(cfg.SocketPath()); err == nil {
		left = append(left, "socket "+cfg.SocketPath())
	}
	if mounted(t, cfg.Workspace.Mount) {
		left = append(left, "mount "+cfg.Workspace.Mount)
	}
	if s, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")}); err != nil {
		left = append(left, "workspace store still open: "+err.Error())
	} else {
		s.Close()
	}
	if n := children(t); n > before {
		left = append(left, "child processes")
	}
	return left
}

func mounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// children counts the live child processes of this test process.
func children(t *testing.T) int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		n += len(strings.Fields(string(b)))
	}
	return n
}

// TestStartCancelledDuringTierProbe: a start cancelled (Ctrl-C) while
// the auto tier probe gets the VM kernel returns promptly, with the
// cancellation as its error, and leaves no socket, mount, open store or
// process behind.
func TestStartCancelledDuringTierProbe(t *testing.T) {
	cfg := agentConfig(t)
	if p := qemu.ProbeHost(context.Background(), qemu.Config{}); p.QEMU == "" || p.Virtiofsd == "" {
		t.Skipf("the auto tier probe gets the VM kernel only where qemu and virtiofsd are installed: %s", strings.Join(p.Problems, "; "))
	}
	cfg.Sandbox.Tier = TierAuto
	before := children(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var at time.Time
	log := slog.New(cancelOn{Handler: testLogger(t).Handler(), prefix: "getting the VM kernel", cancel: cancel, mu: new(sync.Mutex), at: &at})
	d, err := Start(ctx, cfg, log)
	returned := time.Now()
	if err == nil {
		d.Close()
		t.Fatal("Start cancelled during the tier probe succeeded")
	}
	if at.IsZero() {
		t.Fatalf("the start never got the VM kernel (Start = %v); the test cancels it there", err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Start = %v, want an error wrapping context.Canceled", err)
	}
	if took := returned.Sub(at); took > 5*time.Second {
		t.Errorf("Start returned %v after it was cancelled, want under 5s", took)
	}
	if left := leftovers(t, cfg, before); len(left) > 0 {
		t.Errorf("the cancelled start left %s", strings.Join(left, ", "))
	}
}

// TestStartFailureUnwinds: a start that fails at a late step (the
// schedule store, whose directory is a file) or an early one (api.tcp
// taken) closes what the steps before opened and leaves nothing behind;
// once the cause is gone the same state starts.
func TestStartFailureUnwinds(t *testing.T) {
	cfg := agentConfig(t)
	before := children(t)

	blocker := filepath.Join(cfg.StateDir, "schedules")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if d, err := Start(context.Background(), cfg, testLogger(t)); err == nil || !strings.Contains(err.Error(), "schedules") {
		if d != nil {
			d.Close()
		}
		t.Fatalf("Start with the schedule store a file = %v, want it to fail naming schedules", err)
	}
	if left := leftovers(t, cfg, before); len(left) > 0 {
		t.Errorf("the start failed at the schedules left %s", strings.Join(left, ", "))
	}
	os.Remove(blocker)

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tcp := cfg
	tcp.API.TCP = taken.Addr().String()
	if d, err := Start(context.Background(), tcp, testLogger(t)); err == nil || !strings.Contains(err.Error(), "api.tcp") {
		if d != nil {
			d.Close()
		}
		t.Fatalf("Start with api.tcp taken = %v, want it to fail naming api.tcp", err)
	}
	if left := leftovers(t, cfg, before); len(left) > 0 {
		t.Errorf("the start failed at api.tcp left %s", strings.Join(left, ", "))
	}

	d, err := Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("Start once the causes are gone: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if left := leftovers(t, cfg, before); len(left) > 0 {
		t.Errorf("Close left %s", strings.Join(left, ", "))
	}
}

// TestClosersUnwindInReverse: the teardown closes the last opened first,
// closes the rest when one fails, and reports every failure.
func TestClosersUnwindInReverse(t *testing.T) {
	var c closers
	var order []string
	for _, name := range []string{"socket", "store", "view", "driver"} {
		c.push(name, func() error {
			order = append(order, name)
			if name == "view" {
				return errors.New("busy")
			}
			return nil
		})
	}
	err := c.unwind()
	if got := strings.Join(order, " "); got != "driver view store socket" {
		t.Errorf("closed %q, want driver view store socket", got)
	}
	if err == nil || !strings.Contains(err.Error(), "close view: busy") {
		t.Errorf("unwind = %v, want it to report close view: busy", err)
	}
	if c.unwind() != nil || len(order) != 4 {
		t.Error("a second unwind closed again")
	}
}
