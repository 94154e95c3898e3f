package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/creack/pty"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

func TestSeccompFilterAssembles(t *testing.T) {
	for _, pid1 := range []bool{true, false} {
		raw, err := bpf.Assemble(seccompFilter(pid1))
		if err != nil {
			t.Fatalf("Assemble(seccompFilter(%v)) = %v", pid1, err)
		}
		if len(raw) > unix.BPF_MAXINSNS {
			t.Errorf("seccompFilter(%v) has %d instructions, want at most %d", pid1, len(raw), unix.BPF_MAXINSNS)
		}
		seen := map[uint32]string{}
		for _, r := range seccompRules(pid1) {
			if prev, ok := seen[r.nr]; ok {
				t.Errorf("rules %s and %s both answer number %d: only the first would run", prev, r.name, r.nr)
			}
			seen[r.nr] = r.name
		}
	}
}

// seccompData lays out struct seccomp_data for bpf.VM, which loads words
// big-endian as from a packet, where the kernel loads them in the host's
// order: each 32-bit field is written big-endian so both read the same
// values.
func seccompData(arch, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[seccompNr:], nr)
	binary.BigEndian.PutUint32(b[seccompArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[argLow(i):], uint32(a))
		binary.BigEndian.PutUint32(b[argLow(i)+4:], uint32(a>>32))
	}
	return b
}

func runFilter(t *testing.T, pid1 bool, in []byte) uint32 {
	t.Helper()
	vm, err := bpf.NewVM(seccompFilter(pid1))
	if err != nil {
		t.Fatalf("NewVM: %v", err)
	}
	got, err := vm.Run(in)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return uint32(got)
}

// TestSeccompPolicy runs the real program in x/net/bpf's interpreter, for
// what the kernel test below cannot try safely or at all.
func TestSeccompPolicy(t *testing.T) {
	const (
		allow = unix.SECCOMP_RET_ALLOW
		eperm = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		kill  = unix.SECCOMP_RET_KILL_PROCESS
	)
	x86 := uint32(unix.AUDIT_ARCH_X86_64)
	fork := uint64(unix.SIGCHLD | unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD)
	thread := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM |
		unix.CLONE_THREAD | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID)
	tests := []struct {
		name string
		pid1 bool
		in   []byte
		want uint32
	}{
		{"getpid", false, seccompData(x86, unix.SYS_GETPID), allow},
		{"i386 getpid", false, seccompData(unix.AUDIT_ARCH_I386, 20), kill},
		{"x32 getpid", false, seccompData(x86, x32SyscallBit|unix.SYS_GETPID), eperm},
		{"x32 mount", false, seccompData(x86, x32SyscallBit|unix.SYS_MOUNT), eperm},
		{"clone fork", false, seccompData(x86, unix.SYS_CLONE, fork), allow},
		{"clone thread", false, seccompData(x86, unix.SYS_CLONE, thread), allow},
		{"clone high bits only", false, seccompData(x86, unix.SYS_CLONE, fork|1<<40), allow},
		{"clone CLONE_NEWNS", false, seccompData(x86, unix.SYS_CLONE, fork|unix.CLONE_NEWNS), eperm},
		{"clone CLONE_NEWUSER", false, seccompData(x86, unix.SYS_CLONE, uint64(unix.SIGCHLD)|unix.CLONE_NEWUSER), eperm},
		{"clone CLONE_NEWNET", false, seccompData(x86, unix.SYS_CLONE, fork|unix.CLONE_NEWNET), eperm},
		{"clone CLONE_NEWCGROUP", false, seccompData(x86, unix.SYS_CLONE, fork|unix.CLONE_NEWCGROUP), eperm},
		{"clone3", false, seccompData(x86, unix.SYS_CLONE3), unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{"unshare CLONE_FS", false, seccompData(x86, unix.SYS_UNSHARE, unix.CLONE_FS|unix.CLONE_FILES), allow},
		{"unshare CLONE_NEWUSER", false, seccompData(x86, unix.SYS_UNSHARE, unix.CLONE_NEWUSER), eperm},
		{"unshare CLONE_NEWTIME", false, seccompData(x86, unix.SYS_UNSHARE, unix.CLONE_NEWTIME), eperm},
		{"personality query", false, seccompData(x86, unix.SYS_PERSONALITY, personalityQuery), allow},
		{"personality linux", false, seccompData(x86, unix.SYS_PERSONALITY, perLinux), allow},
		{"personality linux32 uname26", false, seccompData(x86, unix.SYS_PERSONALITY, perLinux32|perUname26), allow},
		{"personality no-randomize", false, seccompData(x86, unix.SYS_PERSONALITY, perAddrNoRandom), allow},
		{"personality MMAP_PAGE_ZERO", false, seccompData(x86, unix.SYS_PERSONALITY, 0x0100000), eperm},
		{"personality READ_IMPLIES_EXEC", false, seccompData(x86, unix.SYS_PERSONALITY, 0x0400000), eperm},
		{"personality PER_BSD", false, seccompData(x86, unix.SYS_PERSONALITY, 0x0006), eperm},
		{"reboot power-off as PID 1", true, seccompData(x86, unix.SYS_REBOOT, 0, 0, unix.LINUX_REBOOT_CMD_POWER_OFF), allow},
		{"reboot restart as PID 1", true, seccompData(x86, unix.SYS_REBOOT, 0, 0, unix.LINUX_REBOOT_CMD_RESTART), eperm},
		{"reboot kexec as PID 1", true, seccompData(x86, unix.SYS_REBOOT, 0, 0, unix.LINUX_REBOOT_CMD_KEXEC), eperm},
		{"reboot power-off", false, seccompData(x86, unix.SYS_REBOOT, 0, 0, unix.LINUX_REBOOT_CMD_POWER_OFF), eperm},
		{"clock_settime realtime as PID 1", true, seccompData(x86, unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME), allow},
		{"clock_settime TAI as PID 1", true, seccompData(x86, unix.SYS_CLOCK_SETTIME, unix.CLOCK_TAI), eperm},
		{"clock_settime realtime", false, seccompData(x86, unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME), eperm},
		{"settimeofday as PID 1", true, seccompData(x86, unix.SYS_SETTIMEOFDAY), eperm},
		{"chroot", false, seccompData(x86, unix.SYS_CHROOT), allow},
		{"ptrace", false, seccompData(x86, unix.SYS_PTRACE), allow},
		{"process_vm_writev", false, seccompData(x86, unix.SYS_PROCESS_VM_WRITEV), allow},
		{"setuid", false, seccompData(x86, unix.SYS_SETUID, 1000), allow},
		{"ioctl TIOCSCTTY", false, seccompData(x86, unix.SYS_IOCTL, 0, unix.TIOCSCTTY), allow},
		{"execve", false, seccompData(x86, unix.SYS_EXECVE), allow},
		{"wait4", false, seccompData(x86, unix.SYS_WAIT4), allow},
		{"prctl", false, seccompData(x86, unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG), allow},
		{"sethostname", false, seccompData(x86, unix.SYS_SETHOSTNAME), allow},
	}
	for _, g := range deniedSyscalls {
		for _, c := range g.calls {
			tests = append(tests, struct {
				name string
				pid1 bool
				in   []byte
				want uint32
			}{c.name, true, seccompData(x86, c.nr), eperm})
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := runFilter(t, tc.pid1, tc.in); got != tc.want {
				t.Errorf("filter(%s) = %#x, want %#x", tc.name, got, tc.want)
			}
		})
	}
}

// seccompChildEnv makes the test binary the confined child: its value is
// "pid1" when the child runs as PID 1 of a new PID namespace.
const seccompChildEnv = "HEARTH_SECCOMP_CHILD"

// seccompProbes run in the confined child. Each result is "ok" or the
// errno's name; wantPID1, when set, replaces want for a child that is
// PID 1.
var seccompProbes = []struct {
	name           string
	want, wantPID1 string
	run            func() error
}{
	{"mount tmpfs", "EPERM", "", probeMount},
	{"unshare CLONE_NEWUSER", "EPERM", "", func() error { return unix.Unshare(unix.CLONE_NEWUSER) }},
	{"setns", "EPERM", "", probeSetns},
	{"clone CLONE_NEWNS", "EPERM", "", func() error { return runTrue(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}) }},
	{"clone CLONE_NEWUSER", "EPERM", "", func() error { return runTrue(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}) }},
	{"clone3", "ENOSYS", "", func() error {
		// A zero size makes an unconfined kernel fail with EINVAL rather
		// than fork.
		_, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
		return errnoOrNil(e)
	}},
	{"keyctl", "EPERM", "", func() error {
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
		return err
	}},
	{"bpf", "EPERM", "", func() error {
		_, _, e := unix.RawSyscall(unix.SYS_BPF, 0xffff, 0, 0) // an unknown command: EINVAL unconfined
		return errnoOrNil(e)
	}},
	{"x32 getpid", "EPERM", "", func() error {
		_, _, e := unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
		return errnoOrNil(e)
	}},
	// Without the magic numbers an allowed reboot fails with EINVAL and
	// does nothing.
	{"reboot restart", "EPERM", "", func() error { return reboot(unix.LINUX_REBOOT_CMD_RESTART) }},
	{"reboot power-off", "EPERM", "EINVAL", func() error { return reboot(unix.LINUX_REBOOT_CMD_POWER_OFF) }},
	{"personality MMAP_PAGE_ZERO", "EPERM", "", func() error {
		_, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, 0x0100000, 0, 0)
		return errnoOrNil(e)
	}},
	{"personality query", "ok", "", func() error {
		_, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, personalityQuery, 0, 0)
		return errnoOrNil(e)
	}},
	{"exec /bin/true", "ok", "", func() error { return runTrue(nil) }},
	{"exec as nobody", "ok", "", func() error {
		return runTrue(&syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}})
	}},
	{"signal and wait", "ok", "", probeSignal},
	{"read a file", "ok", "", func() error { _, err := os.ReadFile("/proc/self/cmdline"); return err }},
	{"unix socket", "ok", "", probeUnixSocket},
	{"pty", "ok", "", func() error {
		ptmx, tty, err := pty.Open()
		if err != nil {
			return err
		}
		tty.Close()
		return ptmx.Close()
	}},
	{"getpid", "ok", "", func() error { unix.Getpid(); return nil }},
	{"prctl", "ok", "", func() error {
		if v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil || v != 1 {
			return fmt.Errorf("no_new_privs = %d, %v", v, err)
		}
		return nil
	}},
	{"every thread filtered", "ok", "", probeThreads},
}

func errnoOrNil(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func probeMount() error {
	dir, err := os.MkdirTemp("", "seccomp-mount")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		return err
	}
	return unix.Unmount(dir, unix.MNT_DETACH)
}

func probeSetns() error {
	fd, err := unix.Open("/proc/self/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setns(fd, unix.CLONE_NEWUTS) // its own namespace: harmless unconfined
}

func runTrue(attr *syscall.SysProcAttr) error {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = attr
	return cmd.Run()
}

func reboot(cmd int) error {
	_, _, e := unix.RawSyscall6(unix.SYS_REBOOT, 0, 0, uintptr(cmd), 0, 0, 0)
	return errnoOrNil(e)
}

func probeSignal() error {
	cmd := exec.Command("/bin/sleep", "10")
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := cmd.Process.Signal(unix.SIGTERM); err != nil {
		return err
	}
	cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != unix.SIGTERM {
		return fmt.Errorf("sleep ended with %v, want SIGTERM", cmd.ProcessState)
	}
	return nil
}

func probeUnixSocket() error {
	dir, err := os.MkdirTemp("", "seccomp-sock")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		return err
	}
	defer ln.Close()
	c, err := net.Dial("unix", filepath.Join(dir, "s"))
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := c.Write([]byte{1}); err != nil {
		return err
	}
	_, err = s.Read(make([]byte, 1))
	return err
}

// probeThreads checks TSYNC did its work: the filter is on every thread,
// with no_new_privs.
func probeThreads() error {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) < 2 {
		return fmt.Errorf("threads %v, %v: want several", tasks, err)
	}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte("\nSeccomp:\t2\n")) || !bytes.Contains(b, []byte("\nNoNewPrivs:\t1\n")) {
			return fmt.Errorf("%s: not filtered", p)
		}
	}
	return nil
}

func probeResult(err error) string {
	var e syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &e):
		return unix.ErrnoName(e)
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// TestSeccompChild is the confined child of TestSeccompInKernel and does
// nothing in a normal run.
func TestSeccompChild(t *testing.T) {
	mode := os.Getenv(seccompChildEnv)
	if mode == "" {
		return
	}
	if mode == "pid1" && os.Getpid() != 1 {
		t.Fatalf("pid %d, want 1", os.Getpid())
	}
	// Should the filter let a mount through, it stays in this namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make mounts private: %v", err)
	}
	setNoNewPrivs(t)
	if err := applySeccomp(); err != nil {
		t.Fatalf("applySeccomp() = %v", err)
	}
	for _, p := range seccompProbes {
		fmt.Printf("probe\t%s\t%s\n", p.name, probeResult(p.run()))
	}
}

// setNoNewPrivs does what main does before applySeccomp. A cgo build
// (-race) cannot call AllThreadsSyscall; there the flag goes on this
// thread and TSYNC copies it to the others.
func setNoNewPrivs(t *testing.T) {
	_, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0)
	if e == syscall.ENOTSUP {
		runtime.LockOSThread() // never unlocked: the thread ends with the test
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			t.Fatalf("no_new_privs on this thread: %v", err)
		}
		return
	}
	if e != 0 {
		t.Fatalf("no_new_privs: %v", e)
	}
}

func TestSeccompInKernel(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("the filter's table is for linux/amd64, not linux/%s", runtime.GOARCH)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the confined child runs in new mount and PID namespaces, and root shows what the filter denies")
	}
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
		t.Skipf("kernel without seccomp: prctl(PR_GET_SECCOMP) = %v", err)
	}
	canBoot := hasCapability(t, unix.CAP_SYS_BOOT)
	for _, mode := range []struct {
		name string
		pid1 bool
	}{{"as PID 1", true}, {"not PID 1", false}} {
		t.Run(mode.name, func(t *testing.T) {
			got := runSeccompChild(t, mode.pid1)
			for _, p := range seccompProbes {
				want := p.want
				if mode.pid1 && p.wantPID1 != "" {
					want = p.wantPID1
				}
				if p.name == "reboot power-off" && mode.pid1 && !canBoot {
					continue // without CAP_SYS_BOOT the kernel says EPERM itself
				}
				if got[p.name] != want {
					t.Errorf("probe %q = %q, want %q", p.name, got[p.name], want)
				}
			}
		})
	}
}

// runSeccompChild re-executes the test binary as the confined child and
// returns its probe results by name.
func runSeccompChild(t *testing.T, pid1 bool) map[string]string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestSeccompChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), seccompChildEnv+"=other")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}
	if pid1 {
		cmd.Env[len(cmd.Env)-1] = seccompChildEnv + "=pid1"
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWPID
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("confined child: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.Bytes())
	}
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.SplitN(sc.Text(), "\t", 3); len(f) == 3 && f[0] == "probe" {
			got[f[1]] = f[2]
		}
	}
	if len(got) != len(seccompProbes) {
		t.Fatalf("child reported %d probes, want %d; output:\n%s", len(got), len(seccompProbes), out)
	}
	return got
}

func hasCapability(t *testing.T, capability int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:\t"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<capability) != 0
		}
	}
	return false
}
