package main

import (
	"bytes"
	"encoding/json"
	"errors"
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

	"hearth/appliance"
	"hearth/appliance/appliancetest"
	"hearth/client"
	"hearth/internal/leftovers"
)

// These tests run the real hearth binary as a daemon, kill it with
// SIGKILL and start it again, as a crash would: the daemon in-process
// (appliance.Start) cannot be killed without killing the test.

// hangLimit bounds how long a CLI may take to notice that the daemon died.
const hangLimit = 10 * time.Second

// crashEnv is a hearth binary with its guest agent beside it, a config on
// temporary directories, and the daemon it runs.
type crashEnv struct {
	t      *testing.T
	dir    string
	bin    string // hearth
	agent  string // hearth-guest, where the daemon looks for it
	config string
	cfg    appliance.Config
	log    string // the daemons' stderr, appended by each start

	daemon *exec.Cmd
	done   chan struct{} // closed when daemon has been waited for
}

func newCrashEnv(t *testing.T) *crashEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the daemon needs root (FUSE mounts, namespaces, cgroups)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("/dev/fuse is missing: load the fuse module (modprobe fuse)")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("building the hearth binary needs the go command on PATH")
	}
	dir := t.TempDir()
	e := &crashEnv{t: t, dir: dir, bin: filepath.Join(dir, "bin", "hearth"), agent: filepath.Join(dir, "bin", "hearth-guest"),
		config: filepath.Join(dir, "hearth.toml"), log: filepath.Join(dir, "daemon.log")}
	e.cfg = appliance.DefaultConfig()
	e.cfg.StateDir, e.cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(e.cleanup)
	if err := os.MkdirAll(e.cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	appliancetest.AddTinyImage(t, filepath.Join(e.cfg.StateDir, "images")) // skips without busybox
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{{e.bin, "hearth/cmd/hearth", nil}, {e.agent, "hearth/cmd/hearth-guest", []string{"CGO_ENABLED=0"}}} {
		build := exec.Command(goBin, "build", "-o", b.out, b.pkg)
		build.Env = append(os.Environ(), b.env...)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[sandbox]\ntier = \"jail\"\ndefault_image = \"tiny\"\nidle_timeout = \"0\"\nmemory = \"256M\"\n",
		e.cfg.StateDir, e.cfg.Workspace.Mount)
	if err := os.WriteFile(e.config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

// up starts `hearth up` in its own process group and waits until it
// serves its API.
func (e *crashEnv) up() {
	e.t.Helper()
	logf, err := os.OpenFile(e.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, 2)
	cmd := exec.Command(e.bin, "up", "--config", e.config)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("hearth up: %v", err)
	}
	e.daemon, e.done = cmd, make(chan struct{})
	done := e.done
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(e.log)
		if int64(len(b)) > start && bytes.Contains(b[start:], []byte("API on unix socket")) {
			return
		}
		select {
		case <-done:
			e.t.Fatalf("hearth up exited with %v before serving its API; its log:\n%s", cmd.ProcessState, b[start:])
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("hearth up did not serve its API within 60s; its log:\n%s", b[start:])
		}
	}
}

// crash kills the daemon with SIGKILL, as the OOM killer or a power cut
// of the process would, and waits until it is gone.
func (e *crashEnv) crash() {
	e.t.Helper()
	e.daemon.Process.Signal(syscall.SIGKILL)
	select {
	case <-e.done:
	case <-time.After(hangLimit):
		e.t.Fatalf("the daemon did not die within %v of SIGKILL", hangLimit)
	}
}

// stop stops the daemon with SIGTERM and checks that it exits 0 and leaves
// no mounts behind.
func (e *crashEnv) stop() {
	e.t.Helper()
	e.daemon.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(30 * time.Second):
		e.t.Fatalf("hearth up did not exit within 30s of SIGTERM")
	}
	if st := e.daemon.ProcessState; st.ExitCode() != 0 {
		b, _ := os.ReadFile(e.log)
		e.t.Errorf("hearth up after SIGTERM: %v, want exit status 0; its log:\n%s", st, b)
	}
	if left := leftovers.Mounts(e.dir); len(left) > 0 {
		e.t.Errorf("mounts left after the daemon stopped: %q (want none: the workspace %s and the views under %s unmounted)",
			left, e.cfg.Workspace.Mount, filepath.Join(e.cfg.StateDir, "views"))
	}
}

// cli runs the hearth binary with --config and returns what it printed
// and its exit code. A CLI that does not exit within hangLimit fails the
// test.
func (e *crashEnv) cli(args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	cmd := exec.Command(e.bin, e.withConfig(args)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	code, took := e.wait(cmd)
	if took > hangLimit {
		e.t.Fatalf("hearth %s hung: killed after %v (stdout %q, stderr %q)", strings.Join(args, " "), took, out.String(), errb.String())
	}
	return out.String(), errb.String(), code
}

// withConfig puts --config after the command and verb: exec takes the
// command to run after its own flags.
func (e *crashEnv) withConfig(args []string) []string {
	n := min(2, len(args))
	return append(append(append([]string{}, args[:n]...), "--config", e.config), args[n:]...)
}

// wait runs cmd to its end, killing it after hangLimit (then took is over
// the limit), and returns its exit code and how long it ran.
func (e *crashEnv) wait(cmd *exec.Cmd) (code int, took time.Duration) {
	e.t.Helper()
	start := time.Now()
	if cmd.Process == nil {
		if err := cmd.Start(); err != nil {
			e.t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(hangLimit):
		cmd.Process.Kill()
		<-done
		return -1, time.Since(start)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		e.t.Fatalf("hearth: %v", err)
	}
	return cmd.ProcessState.ExitCode(), time.Since(start)
}

// mustCLI runs the CLI and fails the test unless it exits 0.
func (e *crashEnv) mustCLI(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.cli(args...)
	if code != 0 {
		e.t.Fatalf("hearth %s = %d, stdout %q, stderr %q; want 0", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// sandbox returns the sandbox id as `sandboxes ls --json` shows it.
func (e *crashEnv) sandbox(id string) (client.Sandbox, bool) {
	e.t.Helper()
	out := e.mustCLI("sandboxes", "ls", "--json")
	var list []client.Sandbox
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		e.t.Fatalf("sandboxes ls --json = %q: %v", out, err)
	}
	for _, s := range list {
		if s.Id == id {
			return s, true
		}
	}
	return client.Sandbox{}, false
}

// agentPid is the pid of a machine's agent, as the jail driver records it.
func (e *crashEnv) agentPid(id string) int {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.cfg.StateDir, "jail", "machines", id, "pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		e.t.Fatalf("agent pid of machine %s: %q, %v", id, b, err)
	}
	return pid
}

// cleanup kills what a failed test left running (the daemon, the agents
// of its machines) and unmounts what it left mounted.
func (e *crashEnv) cleanup() {
	if e.t.Failed() {
		if b, err := os.ReadFile(e.log); err == nil {
			e.t.Logf("daemon log:\n%s", b)
		}
	}
	if e.daemon != nil {
		syscall.Kill(-e.daemon.Process.Pid, syscall.SIGKILL)
		<-e.done
	}
	for _, pid := range leftovers.Processes(e.agent) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(leftovers.Processes(e.agent)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	left := leftovers.Mounts(e.dir)
	for i := len(left) - 1; i >= 0; i-- {
		syscall.Unmount(left[i], syscall.MNT_DETACH)
	}
	machines, _ := os.ReadDir(filepath.Join(e.cfg.StateDir, "jail", "machines"))
	for _, m := range machines {
		leftovers.RemoveCgroups(m.Name())
	}
}

// lineWatcher collects a process's output and says when a line appears.
type lineWatcher struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func newLineWatcher(want string) *lineWatcher {
	return &lineWatcher{want: want, seen: make(chan struct{})}
}

func (w *lineWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if bytes.Contains(w.buf.Bytes(), []byte(w.want+"\n")) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *lineWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestCrashDaemonKilledMidExec kills the daemon while a command streams
// its output: the CLI must end promptly with a non-zero status and say the
// daemon went away; a restarted daemon re-attaches to the sandbox, whose
// commands and workspace work again.
func TestCrashDaemonKilledMidExec(t *testing.T) {
	e := newCrashEnv(t)
	e.up()
	id, session := fmt.Sprintf("crash-exec-%d", os.Getpid()), "crash-session"
	e.mustCLI("sandboxes", "create", "--session", session, id)
	before := "/workspace/agents/" + session + "/outputs/before.txt"
	e.mustCLI("sandboxes", "exec", id, "--", "sh", "-c", "echo written before > "+before)

	out := newLineWatcher("started")
	var errOut bytes.Buffer
	exe := exec.Command(e.bin, e.withConfig([]string{"sandboxes", "exec", id, "-n", "--", "sh", "-c", "echo started; sleep 30; echo never"})...)
	exe.Stdout, exe.Stderr = out, &errOut
	if err := exe.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-out.seen:
	case <-time.After(30 * time.Second):
		exe.Process.Kill()
		t.Fatalf("hearth sandboxes exec printed %q in 30s, want started", out.String())
	}
	killed := time.Now()
	e.crash()
	code, _ := e.wait(exe)
	took := time.Since(killed)
	t.Logf("exec exited %d %v after the daemon's SIGKILL: stdout %q, stderr %q", code, took.Round(time.Millisecond), out.String(), errOut.String())
	if took > hangLimit {
		t.Fatalf("hearth sandboxes exec hung after the daemon died: killed after %v (stderr %q)", took, errOut.String())
	}
	if code == 0 || strings.Contains(out.String(), "never") {
		t.Errorf("hearth sandboxes exec after the daemon died = %d, stdout %q; want a non-zero status and no \"never\"", code, out.String())
	}
	if msg := strings.ToLower(errOut.String()); !strings.Contains(msg, "daemon") {
		t.Errorf("hearth sandboxes exec after the daemon died printed %q; want it to say the daemon went away", errOut.String())
	}

	e.up()
	if s, ok := e.sandbox(id); !ok || s.Status != "running" {
		t.Fatalf("sandboxes ls after the restart: %s = %+v (listed %v), want it running", id, s, ok)
	}
	if got := e.mustCLI("sandboxes", "exec", id, "--", "echo", "back"); got != "back\n" {
		t.Errorf("exec in the re-attached sandbox printed %q, want \"back\\n\"", got)
	}
	after := "/workspace/agents/" + session + "/outputs/after.txt"
	got, errText, code := e.cli("sandboxes", "exec", id, "--", "sh", "-c", "cat "+before+" && echo written after > "+after+" && ls /workspace/agents")
	if code != 0 || got != "written before\n"+session+"\n" {
		t.Errorf("workspace inside the sandbox after the restart: exit %d, stdout %q, stderr %q; want %q",
			code, got, errText, "written before\n"+session+"\n")
	}
	if b, err := os.ReadFile(filepath.Join(e.cfg.Workspace.Mount, session, "outputs", "after.txt")); err != nil || string(b) != "written after\n" {
		t.Errorf("host view of what the sandbox wrote after the restart: %q, %v; want \"written after\\n\"", b, err)
	}
	e.mustCLI("sandboxes", "destroy", id)
	if _, ok := e.sandbox(id); ok {
		t.Errorf("sandbox %s still listed after destroy", id)
	}
	e.stop()
	if left := leftovers.Processes(e.agent); len(left) > 0 {
		t.Errorf("agent processes left after destroy: %v", left)
	}
}

// TestCrashMachineGoneWhileDaemonDown kills the daemon, then the
// sandbox's machine: the restarted daemon shows the sandbox stopped, exec
// says so without hanging, and destroy cleans it up.
func TestCrashMachineGoneWhileDaemonDown(t *testing.T) {
	e := newCrashEnv(t)
	e.up()
	id := fmt.Sprintf("crash-gone-%d", os.Getpid())
	e.mustCLI("sandboxes", "create", "--session", "gone-session", id)
	pid := e.agentPid(id)
	e.crash()
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(hangLimit)
	for len(leftovers.Processes(e.agent)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("agent %d still running %v after SIGKILL", pid, hangLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}

	e.up()
	if s, ok := e.sandbox(id); !ok || s.Status != "stopped" {
		t.Fatalf("sandboxes ls after the restart: %s = %+v (listed %v), want it stopped", id, s, ok)
	}
	out, errOut, code := e.cli("sandboxes", "exec", id, "--", "echo", "hello")
	if code != exitError || out != "" || !strings.Contains(errOut, "has stopped") || !strings.Contains(errOut, "hearth sandboxes destroy "+id) {
		t.Errorf("exec in a sandbox whose machine is gone = %d, stdout %q, stderr %q; want %d and a message that it stopped and how to destroy it",
			code, out, errOut, exitError)
	}
	ls := e.mustCLI("sandboxes", "ls")
	if !strings.Contains(ls, id) || !strings.Contains(ls, "stopped") {
		t.Errorf("sandboxes ls = %q, want %s shown stopped", ls, id)
	}
	e.mustCLI("sandboxes", "destroy", id)
	if _, ok := e.sandbox(id); ok {
		t.Errorf("sandbox %s still listed after destroy", id)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, "jail", "machines", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("machine state of %s after destroy: %v, want it removed", id, err)
	}
	e.stop()
}
