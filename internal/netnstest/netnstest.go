// Package netnstest makes a LAN of test hosts on this one machine, for
// tests of several daemons that talk over a network: a bridge in a
// network namespace of its own and one namespace per host, joined to it
// by a veth pair, each with an address in 10.213.0.0/24 and its loopback
// up. Nothing is added to the machine's own namespace: the hosts reach
// each other and their own loopback, never the machine's addresses, and
// two LANs (two test processes) never see each other, so the subnet is
// the same in all of them.
//
// Every name starts with Prefix and the creating process's id, so that a
// LAN left by a test process that died (SIGKILL, a timeout) is swept by
// the next New. Cleanup kills what runs in the namespaces and removes
// them, also after a failed test.
//
// Only tests import it (cmd/hearth/deps_test.go).
package netnstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package makes.
const Prefix = "hnt-"

// Subnet is every LAN's address range; host i (from 1) is .i, the
// bridge has none.
var Subnet = netip.MustParsePrefix("10.213.0.0/24")

// nsDir is where `ip netns` keeps named namespaces.
const nsDir = "/run/netns"

// opTimeout bounds one ip command and each cleanup step.
const opTimeout = 20 * time.Second

// LAN is a bridge and the hosts on it.
type LAN struct {
	// ID names the LAN: every namespace of it is named ID-something.
	ID    string
	Hosts []*Host
}

// Host is one test host: a network namespace with an address on the LAN.
type Host struct {
	// NetNS is the namespace's name, for `ip netns exec` and
	// pgtest.Options.NetNS.
	NetNS string
	Addr  netip.Addr
}

// ErrUnavailable means this machine cannot make a LAN: New skips the
// test with it.
var ErrUnavailable = errors.New("network namespaces unavailable")

// New makes a LAN of n hosts (1 to 250) for t, removed by t's cleanup,
// after sweeping LANs whose creating process is gone. It skips t when not
// root or when ip (iproute2) or nsenter (util-linux) is missing.
func New(t testing.TB, n int) *LAN {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err.Error())
	}
	if n < 1 || n > 250 {
		t.Fatalf("netnstest: %d hosts: want 1 to 250", n)
	}
	if err := Sweep(); err != nil {
		t.Fatalf("netnstest: sweep stale LANs: %v", err)
	}
	var b [3]byte
	rand.Read(b[:])
	l := &LAN{ID: fmt.Sprintf("%s%d-%s", Prefix, os.Getpid(), hex.EncodeToString(b[:]))}
	t.Cleanup(func() {
		if err := l.Remove(); err != nil {
			t.Errorf("netnstest: remove LAN %s: %v", l.ID, err)
		}
	})
	if err := l.build(n); err != nil {
		t.Fatalf("netnstest: make a LAN of %d hosts: %v", n, err)
	}
	return l
}

// Available says why a LAN cannot be made here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root (ip netns needs CAP_SYS_ADMIN and CAP_NET_ADMIN)", ErrUnavailable)
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not found (Debian packages iproute2, util-linux)", ErrUnavailable, tool)
		}
	}
	return nil
}

func (l *LAN) bridge() string { return l.ID + "-br" }

func (l *LAN) build(n int) error {
	br := l.bridge()
	if err := ipCmd("netns", "add", br); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", br, "link", "add", "br0", "type", "bridge"},
		{"-n", br, "link", "set", "br0", "up"},
		{"-n", br, "link", "set", "lo", "up"},
	}
	if err := ipAll(steps); err != nil {
		return err
	}
	for i := 1; i <= n; i++ {
		h, err := l.addHost(i)
		if err != nil {
			return err
		}
		l.Hosts = append(l.Hosts, h)
	}
	return nil
}

// addHost makes host i: its namespace, a veth pair made with its ends
// already in the host's and the bridge's namespaces (so no name is ever
// taken in the machine's own), its address, and its loopback.
func (l *LAN) addHost(i int) (*Host, error) {
	a := Subnet.Addr().As4()
	a[3] = byte(i)
	h := &Host{NetNS: fmt.Sprintf("%s-h%d", l.ID, i), Addr: netip.AddrFrom4(a)}
	if err := ipCmd("netns", "add", h.NetNS); err != nil {
		return nil, err
	}
	port := "p" + strconv.Itoa(i)
	steps := [][]string{
		{"link", "add", "eth0", "netns", h.NetNS, "type", "veth", "peer", "name", port, "netns", l.bridge()},
		{"-n", l.bridge(), "link", "set", port, "master", "br0"},
		{"-n", l.bridge(), "link", "set", port, "up"},
		{"-n", h.NetNS, "addr", "add", netip.PrefixFrom(h.Addr, Subnet.Bits()).String(), "dev", "eth0"},
		{"-n", h.NetNS, "link", "set", "eth0", "up"},
		{"-n", h.NetNS, "link", "set", "lo", "up"},
	}
	return h, ipAll(steps)
}

// namespaces are the LAN's namespaces that exist now.
func (l *LAN) namespaces() ([]string, error) {
	return listNamespaces(l.ID + "-")
}

// Remove kills every process in the LAN's namespaces and removes them.
// It is what New's cleanup calls; calling it again does nothing.
func (l *LAN) Remove() error {
	names, err := l.namespaces()
	if err != nil {
		return err
	}
	return removeNamespaces(names)
}

// Sweep removes the LANs of processes that no longer run.
func Sweep() error {
	names, err := listNamespaces(Prefix)
	if err != nil {
		return err
	}
	var stale []string
	for _, name := range names {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, Prefix), "-", 2)[0])
		if err != nil || !alive(pid) {
			stale = append(stale, name)
		}
	}
	return removeNamespaces(stale)
}

func alive(pid int) bool {
	return pid > 0 && unix.Kill(pid, 0) != unix.ESRCH
}

func listNamespaces(prefix string) ([]string, error) {
	entries, err := os.ReadDir(nsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// removeNamespaces kills what runs in each namespace (SIGKILL, waiting
// up to opTimeout for it to go) and deletes it. Deleting a namespace
// destroys its ends of the veth pairs, and with them the pairs.
func removeNamespaces(names []string) error {
	var errs []error
	for _, name := range names {
		if err := killAll(name); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range names {
		if err := ipCmd("netns", "del", name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killAll kills every process in namespace name and waits for them to
// be gone.
func killAll(name string) error {
	deadline := time.Now().Add(opTimeout)
	for {
		pids, err := Pids(name)
		if err != nil || len(pids) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v in namespace %s survived SIGKILL for %s", pids, name, opTimeout)
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pids are the processes whose network namespace is name.
func Pids(name string) ([]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", name).Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns pids %s: %w", name, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("ip netns pids %s: %q is not a pid", name, f)
		}
		if pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func ipAll(steps [][]string) error {
	for _, args := range steps {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	return nil
}

func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Path is the namespace's file, for setns(2) or nsenter --net.
func (h *Host) Path() string { return filepath.Join(nsDir, h.NetNS) }

// Command is an exec.Cmd that runs name inside the host's network
// namespace (nsenter --net, which execs it: the process's pid is the
// command's). Unlike `ip netns exec` it keeps the machine's mount
// namespace, so /sys (and the cgroups mounted under it) stay as they
// are, and mounts the command makes are seen by the test.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	all := append([]string{"--net=" + h.Path(), "--", name}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", all...)
	// Killed with the test process, so that no daemon outlives a test
	// binary killed by a timeout (Sweep removes the namespaces).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Do runs fn on an OS thread that is inside the host's network
// namespace: the sockets fn makes (net.Listen, net.Dial) and the
// processes it starts belong to the host. Goroutines fn starts do not.
// The thread goes back to its namespace after; if it cannot, it is
// thrown away rather than reused.
func (h *Host) Do(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored := false
		defer func() {
			if restored {
				runtime.UnlockOSThread()
			} // else the goroutine ends locked and Go ends its thread
		}()
		var err error
		restored, err = h.on(fn)
		done <- err
	}()
	return <-done
}

// on runs fn with the calling (locked) thread in the host's namespace,
// and says whether the thread is back in its own.
func (h *Host) on(fn func() error) (restored bool, err error) {
	own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true, fmt.Errorf("open own network namespace: %w", err)
	}
	defer unix.Close(own)
	target, err := unix.Open(h.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true, fmt.Errorf("open namespace of %s: %w", h.NetNS, err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return true, fmt.Errorf("enter %s: %w", h.NetNS, err)
	}
	err = fn()
	return unix.Setns(own, unix.CLONE_NEWNET) == nil, err
}

// Listen listens on addr (network "tcp") inside the host's namespace;
// the listener serves from any goroutine.
func (h *Host) Listen(addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// DialContext dials addr from inside the host's namespace; it fits
// http.Transport.DialContext.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// HostPort is the host's address with port.
func (h *Host) HostPort(port int) string {
	return netip.AddrPortFrom(h.Addr, uint16(port)).String()
}
