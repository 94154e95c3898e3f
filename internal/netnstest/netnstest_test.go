package netnstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serveOnce answers one line with "from <who>" on each connection.
func serveOnce(t *testing.T, ln net.Listener, who string) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "from %s\n", who)
			c.Close()
		}
	}()
}

func readLine(t *testing.T, c net.Conn) string {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read from %s: %v", c.RemoteAddr(), err)
	}
	return strings.TrimSpace(line)
}

// TestLANHostsReachEachOther: each host listens on its address (from the
// test process, Listen) and its own loopback; every host reaches every
// other's address, from the test process (DialContext) and from a
// process started in it (Command, bash's /dev/tcp).
func TestLANHostsReachEachOther(t *testing.T) {
	l := New(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ports := make([]int, len(l.Hosts))
	for i, h := range l.Hosts {
		ln, err := h.Listen(h.HostPort(0))
		if err != nil {
			t.Fatalf("listen on %s: %v", h.NetNS, err)
		}
		serveOnce(t, ln, h.Addr.String())
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	for _, from := range l.Hosts {
		for j, to := range l.Hosts {
			c, err := from.DialContext(ctx, "tcp", to.HostPort(ports[j]))
			if err != nil {
				t.Fatalf("%s to %s: %v", from.Addr, to.Addr, err)
			}
			if got := readLine(t, c); got != "from "+to.Addr.String() {
				t.Errorf("%s to %s: got %q", from.Addr, to.Addr, got)
			}
		}
	}
	to := l.Hosts[2]
	script := fmt.Sprintf("exec 3<>/dev/tcp/%s/%d && head -1 <&3 && ip -4 -o addr show dev eth0", to.Addr, ports[2])
	out, err := l.Hosts[0].Command(ctx, "bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("bash in %s: %v\n%s", l.Hosts[0].NetNS, err, out)
	}
	if !strings.HasPrefix(string(out), "from "+to.Addr.String()+"\n") || !strings.Contains(string(out), " inet "+l.Hosts[0].Addr.String()+"/24 ") {
		t.Errorf("a command in host 1 read %q; want host 3's answer, then host 1's own address", out)
	}
	// Each host's loopback is its own and up.
	lo, err := l.Hosts[1].Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveOnce(t, lo, "h2 loopback")
	c, err := l.Hosts[1].DialContext(ctx, "tcp", lo.Addr().String())
	if err != nil {
		t.Fatalf("host 2 to its own loopback: %v", err)
	}
	if got := readLine(t, c); got != "from h2 loopback" {
		t.Errorf("host 2's loopback: got %q", got)
	}
	if c, err := l.Hosts[0].DialContext(ctx, "tcp", lo.Addr().String()); err == nil {
		c.Close()
		t.Errorf("host 1 reached host 2's loopback listener at %s", lo.Addr())
	}
}

// TestHostileHostsReachOnlyTheLAN: what runs in a test host (a daemon
// under test) reaches neither the machine's own loopback nor its other
// addresses, nor anything past them: a test cannot touch the machine's
// services or the network outside.
func TestHostileHostsReachOnlyTheLAN(t *testing.T) {
	l := New(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	serveOnce(t, root, "the machine")
	port := root.Addr().(*net.TCPAddr).Port
	targets := []string{fmt.Sprintf("127.0.0.1:%d", port), "10.213.0.254:80", "1.1.1.1:443"}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
			targets = append(targets, net.JoinHostPort(ip.IP.String(), fmt.Sprint(port)))
		}
	}
	for _, h := range l.Hosts {
		for _, target := range targets {
			dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
			c, err := h.DialContext(dctx, "tcp", target)
			dcancel()
			if err == nil {
				c.Close()
				t.Errorf("%s reached %s, outside the LAN", h.NetNS, target)
				continue
			}
			t.Logf("%s to %s: %v", h.NetNS, target, err)
		}
	}
	// And the machine does not reach the hosts: a listener in host 1 is
	// not what answers at its address there (whatever this machine's
	// own network does with 10.213.0.0/24: here something accepts every
	// connection).
	ln, err := l.Hosts[0].Listen(l.Hosts[0].HostPort(0))
	if err != nil {
		t.Fatal(err)
	}
	serveOnce(t, ln, "host 1")
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if line, _ := bufio.NewReader(c).ReadString('\n'); strings.Contains(line, "host 1") {
		t.Errorf("the machine reached host 1's listener at %s", ln.Addr())
	}
}

// TestCleanupLeavesNothing: a LAN with a process running in a host is
// gone, process and namespaces, once its test ends, also when the test
// failed; and Sweep removes a LAN whose process died without cleanup.
func TestCleanupLeavesNothing(t *testing.T) {
	var id string
	var sleeper *exec.Cmd
	ft := &failingTB{TB: t}
	func() {
		defer ft.runCleanups()
		l := New(ft, 2)
		id = l.ID
		sleeper = l.Hosts[1].Command(context.Background(), "sleep", "300")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		ft.Errorf("this test fails before its cleanup")
	}()
	done := make(chan error, 1)
	go func() { done <- sleeper.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("the process in the LAN ended with %v; want killed", err)
		}
	case <-time.After(30 * time.Second):
		sleeper.Process.Kill()
		t.Fatal("the process in the LAN survived its cleanup")
	}
	if left, err := listNamespaces(id); err != nil || len(left) != 0 {
		t.Errorf("after cleanup, namespaces %v (%v) remain", left, err)
	}

	// A LAN whose creator died: its namespaces carry a dead pid.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%s%d-000000-h1", Prefix, dead.Process.Pid)
	if err := ipCmd("netns", "add", stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ipCmd("netns", "del", stale) })
	New(t, 1) // sweeps
	if _, err := os.Stat(nsDir + "/" + stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale namespace %s not swept: %v", stale, err)
	}
}

// failingTB records failures and cleanups instead of passing them on,
// so that a test can watch a failed test's cleanup.
type failingTB struct {
	testing.TB
	failed   bool
	cleanups []func()
}

func (f *failingTB) Errorf(string, ...any)     { f.failed = true }
func (f *failingTB) Failed() bool              { return f.failed }
func (f *failingTB) Cleanup(fn func())         { f.cleanups = append(f.cleanups, fn) }
func (f *failingTB) Fatalf(s string, a ...any) { f.TB.Fatalf(s, a...) }

func (f *failingTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}
