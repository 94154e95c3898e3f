package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/vmm/guest"
)

// startInit builds hearth-guest and runs it as PID 1 of new PID, mount and
// UTS namespaces, connected to the returned client by a socket pair.
func startInit(t *testing.T) (*guest.Client, *exec.Cmd) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running the agent as PID 1 of new namespaces needs root")
	}
	bin := filepath.Join(t.TempDir(), "hearth-guest")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	guestEnd := os.NewFile(uintptr(fds[1]), "guest")
	cmd := exec.Command(bin, "--channel", "fd:3", "--hostname", "sandbox-test")
	cmd.ExtraFiles = []*os.File{guestEnd}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guestEnd.Close()
	f := os.NewFile(uintptr(fds[0]), "host")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c, err := guest.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c, cmd
}

func sh(t *testing.T, c *guest.Client, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := c.Exec(context.Background(), guest.ExecRequest{Argv: []string{"sh", "-c", script}}, nil, &out, &errb)
	if err != nil || st.Code != 0 {
		t.Fatalf("sh -c %q = %+v, %v (stderr %q)", script, st, err, errb.String())
	}
	return out.String()
}

func TestAgentAsInit(t *testing.T) {
	c, cmd := startInit(t)
	ctx := context.Background()
	h, err := c.Health(ctx)
	if err != nil || !h.AgentIsInit || h.AgentPID != 1 {
		t.Fatalf("Health = %+v, %v; want the agent as PID 1", h, err)
	}
	if got := strings.TrimSpace(sh(t, c, "hostname")); got != "sandbox-test" {
		t.Errorf("hostname = %q, want sandbox-test", got)
	}
	// Only the namespace's processes are visible: the agent, sh and ls.
	if got := strings.Fields(sh(t, c, "ls /proc | grep -E '^[0-9]+$' | wc -l")); len(got) != 1 || got[0] > "5" {
		t.Errorf("processes visible in the new PID namespace = %v, want only its own", got)
	}
	// An orphan: sh exits at once, its background child is re-parented to
	// the agent, which must reap it once it exits.
	sh(t, c, "sleep 0.2 &")
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := sh(t, c, "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l")
		if strings.TrimSpace(out) == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombies still there after 5s: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// When the host hangs up, the agent ends, and with it the namespace.
	c.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not exit after the host closed the channel")
	}
}

// TestVersionFlag builds the agent with a stamped version, as
// scripts/package.sh does, and checks --version reports it.
func TestVersionFlag(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "hearth-guest")
	build := exec.Command("go", "build", "-trimpath", "-o", bin,
		"-ldflags", "-X hearth/internal/version.Version=9.8.7-test -X hearth/internal/version.Commit=0123456789abcdef", ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("hearth-guest --version: %v: %s", err, out)
	}
	want := "hearth-guest 9.8.7-test (commit 0123456789ab, go"
	if !strings.HasPrefix(string(out), want) {
		t.Errorf("hearth-guest --version = %q, want it to start with %q", out, want)
	}
}
