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
	"unsafe"

	"github.com/creack/pty"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

func TestSeccompFilterAssembles(t *testing.T) {
	for _, pid1 := range []bool{true, false} {
		prog, err := seccompFilter(pid1)
		if err != nil {
			t.Fatalf("seccompFilter(%v) = %v", pid1, err)
		}
		raw, err := bpf.Assemble(prog)
		if err != nil {
			t.Fatalf("Assemble(seccompFilter(%v)) = %v", pid1, err)
		}
		if len(raw) > unix.BPF_MAXINSNS {
			t.Errorf("seccompFilter(%v) has %d instructions, want at most %d", pid1, len(raw), unix.BPF_MAXINSNS)
		}
	}
	allowed := map[string]bool{}
	for _, name := range allowedSyscalls {
		allowed[name] = true
	}
	for _, g := range deniedSyscalls {
		for _, name := range g.calls {
			if allowed[name] {
				t.Errorf("%s is both allowed and denied (%s)", name, g.why)
			}
		}
	}
}

// nr is the x86_64 number of a system call by name.
func nr(t *testing.T, name string) uint32 {
	t.Helper()
	n, ok := arch.X86_64.SyscallNames[name]
	if !ok {
		t.Fatalf("no x86_64 system call %q", name)
	}
	return uint32(n)
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
	prog, err := seccompFilter(pid1)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(prog)
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
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		noafs  = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
		kill   = unix.SECCOMP_RET_KILL_PROCESS
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
		{"x32 getpid", false, seccompData(x86, x32SyscallBit|unix.SYS_GETPID), enosys},
		{"x32 mount", false, seccompData(x86, x32SyscallBit|unix.SYS_MOUNT), enosys},
		{"clone fork", false, seccompData(x86, unix.SYS_CLONE, fork), allow},
		{"clone thread", false, seccompData(x86, unix.SYS_CLONE, thread), allow},
		{"clone high bits only", false, seccompData(x86, unix.SYS_CLONE, fork|1<<40), allow},
		{"clone CLONE_NEWNS", false, seccompData(x86, unix.SYS_CLONE, fork|unix.CLONE_NEWNS), eperm},
		{"clone CLONE_NEWUSER", false, seccompData(x86, unix.SYS_CLONE, uint64(unix.SIGCHLD)|unix.CLONE_NEWUSER), eperm},
		{"clone CLONE_NEWNET", false, seccompData(x86, unix.SYS_CLONE, fork|unix.CLONE_NEWNET), eperm},
		{"clone CLONE_NEWCGROUP", false, seccompData(x86, unix.SYS_CLONE, fork|unix.CLONE_NEWCGROUP), eperm},
		{"clone3", false, seccompData(x86, unix.SYS_CLONE3), enosys},
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
		{"sethostname", false, seccompData(x86, unix.SYS_SETHOSTNAME), enosys},
		{"an unlisted call", false, seccompData(x86, unix.SYS_FILE_GETATTR), enosys},
		{"a number past the table", false, seccompData(x86, 4000), enosys},
		{"arch_prctl", false, seccompData(x86, unix.SYS_ARCH_PRCTL, 0x1002), allow},
		{"socket AF_UNIX", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM), allow},
		{"socket AF_INET", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM), allow},
		{"socket AF_INET6", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM), allow},
		{"socket AF_NETLINK route", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE), allow},
		{"socket AF_NETLINK audit", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT), noafs},
		{"socket AF_NETLINK uevent", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT), noafs},
		{"socket AF_VSOCK", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM), noafs},
		// The kernel reads an int's low half only: this is AF_INET.
		{"socket AF_INET with high bits", false, seccompData(x86, unix.SYS_SOCKET, 1<<32|unix.AF_INET, unix.SOCK_STREAM), allow},
		{"socket AF_VSOCK with high bits", false, seccompData(x86, unix.SYS_SOCKET, 1<<32|unix.AF_VSOCK, unix.SOCK_STREAM), noafs},
		{"socket AF_PACKET", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW), noafs},
		{"socket AF_ALG", false, seccompData(x86, unix.SYS_SOCKET, unix.AF_ALG, unix.SOCK_SEQPACKET), noafs},
		{"socketpair AF_UNIX", false, seccompData(x86, unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM), allow},
		{"socketpair AF_VSOCK", false, seccompData(x86, unix.SYS_SOCKETPAIR, unix.AF_VSOCK, unix.SOCK_STREAM), noafs},
	}
	for _, g := range deniedSyscalls {
		for _, c := range g.calls {
			tests = append(tests, struct {
				name string
				pid1 bool
				in   []byte
				want uint32
			}{c, true, seccompData(x86, nr(t, c)), eperm})
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
	{"clone CLONE_NEWNS", "EPERM", "", func() error { return runTrue(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}) }},
	{"clone CLONE_NEWUSER", "EPERM", "", func() error { return runTrue(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}) }},
	{"x32 getpid", "ENOSYS", "", func() error {
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
	{"socket AF_INET", "ok", "", probeSocket(unix.AF_INET, unix.SOCK_STREAM, 0)},
	{"socket AF_INET6", "ok", "", probeSocket(unix.AF_INET6, unix.SOCK_DGRAM, 0)},
	{"socket AF_NETLINK route", "ok", "", probeSocket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)},
	{"network interfaces", "ok", "", func() error { _, err := net.Interfaces(); return err }},
	{"socketpair AF_UNIX", "ok", "", func() error {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err == nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
		}
		return err
	}},
	// A call the filter's lists do not know answers ENOSYS, as on an
	// older kernel (unconfined: EBADF).
	{"file_getattr", "ENOSYS", "", rawProbe(unix.SYS_FILE_GETATTR, ^uintptr(0), 0, 0, 0, 0, 0)},
}

// hostileProbes are attacks from inside a machine (TestHostileSyscalls):
// each must fail with the filter's answer. Unconfined, as root, every one
// of them succeeds or fails otherwise.
var hostileProbes = []struct {
	name           string
	want, wantPID1 string
	run            func() error
}{
	// vsock is not namespaced: a jail could bind or reach the host's
	// ports.
	{"socket AF_VSOCK", "EAFNOSUPPORT", "", probeSocket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)},
	{"socket AF_PACKET", "EAFNOSUPPORT", "", probeSocket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)},
	{"socket AF_BLUETOOTH", "EAFNOSUPPORT", "", probeSocket(unix.AF_BLUETOOTH, unix.SOCK_RAW, 1)},
	{"socket AF_ALG", "EAFNOSUPPORT", "", probeSocket(unix.AF_ALG, unix.SOCK_SEQPACKET, 0)},
	{"socket AF_KEY", "EAFNOSUPPORT", "", probeSocket(unix.AF_KEY, unix.SOCK_RAW, 2)},
	{"socket AF_XDP", "EAFNOSUPPORT", "", probeSocket(unix.AF_XDP, unix.SOCK_RAW, 0)},
	{"socket AF_NETLINK audit", "EAFNOSUPPORT", "", probeSocket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT)},
	{"socket AF_NETLINK uevent", "EAFNOSUPPORT", "", probeSocket(unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT)},
	{"socket AF_NETLINK netfilter", "EAFNOSUPPORT", "", probeSocket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER)},
	{"kcmp", "EPERM", "", func() error {
		pid := uintptr(unix.Getpid())
		return rawProbe(unix.SYS_KCMP, pid, pid, 0 /* KCMP_FILE */, 0, 0, 0)()
	}},
	{"pidfd_getfd", "EPERM", "", func() error {
		pidfd, err := unix.PidfdOpen(unix.Getpid(), 0)
		if err != nil {
			return err
		}
		defer unix.Close(pidfd)
		fd, err := unix.PidfdGetfd(pidfd, 0, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	{"process_madvise", "EPERM", "", func() error {
		pidfd, err := unix.PidfdOpen(unix.Getpid(), 0)
		if err != nil {
			return err
		}
		defer unix.Close(pidfd)
		return rawProbe(unix.SYS_PROCESS_MADVISE, uintptr(pidfd), 0, 0, unix.MADV_COLD, 0, 0)()
	}},
	{"mbind", "EPERM", "", rawProbe(unix.SYS_MBIND, 0, 0, 0 /* MPOL_DEFAULT */, 0, 0, 0)},
	{"set_mempolicy", "EPERM", "", rawProbe(unix.SYS_SET_MEMPOLICY, 0 /* MPOL_DEFAULT */, 0, 0, 0, 0, 0)},
	{"move_pages", "EPERM", "", rawProbe(unix.SYS_MOVE_PAGES, 0, 0, 0, 0, 0, 0)},
	{"migrate_pages", "EPERM", "", rawProbe(unix.SYS_MIGRATE_PAGES, 0, 0, 0, 0, 0, 0)},
	{"sysfs", "EPERM", "", rawProbe(unix.SYS_SYSFS, 3, 0, 0, 0, 0, 0)},
	{"ustat", "EPERM", "", func() error {
		var st unix.Stat_t
		if err := unix.Stat("/", &st); err != nil {
			return err
		}
		var buf [64]byte
		return rawProbe(unix.SYS_USTAT, uintptr(st.Dev), uintptr(unsafe.Pointer(&buf[0])), 0, 0, 0, 0)()
	}},
	{"mount", "EPERM", "", probeMount},
	{"bpf", "EPERM", "", rawProbe(unix.SYS_BPF, 0xffff, 0, 0, 0, 0, 0)},
	{"keyctl", "EPERM", "", func() error {
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
		return err
	}},
	{"userfaultfd", "EPERM", "", rawProbe(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0, 0, 0, 0)},
	{"io_uring_setup", "EPERM", "", rawProbe(unix.SYS_IO_URING_SETUP, 1, 0, 0, 0, 0, 0)},
	{"open_by_handle_at", "EPERM", "", rawProbe(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0, 0, 0, 0)},
	{"setns", "EPERM", "", probeSetns},
	{"unshare CLONE_NEWNET", "EPERM", "", func() error { return unix.Unshare(unix.CLONE_NEWNET) }},
	{"clone3", "ENOSYS", "", rawProbe(unix.SYS_CLONE3, 0, 0, 0, 0, 0, 0)},
	{"modify_ldt", "ENOSYS", "", rawProbe(unix.SYS_MODIFY_LDT, 0, 0, 0, 0, 0, 0)},
}

// rawProbe makes a call with the arguments given, which should make it
// harmless if it gets through.
func rawProbe(nr uintptr, a ...uintptr) func() error {
	return func() error {
		_, _, e := unix.RawSyscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		return errnoOrNil(e)
	}
}

func probeSocket(family, typ, proto int) func() error {
	return func() error {
		fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
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
	for _, p := range append(seccompProbes, hostileProbes...) {
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

// TestHostileSyscalls performs, under the filter, attacks a machine's
// workload could try, and fails if any gets through.
func TestHostileSyscalls(t *testing.T) {
	requireSeccompChild(t)
	for _, mode := range []struct {
		name string
		pid1 bool
	}{{"as PID 1", true}, {"not PID 1", false}} {
		t.Run(mode.name, func(t *testing.T) {
			got := runSeccompChild(t, mode.pid1)
			for _, p := range hostileProbes {
				if got[p.name] != p.want {
					t.Errorf("attack %q = %q, want %q", p.name, got[p.name], p.want)
				}
			}
		})
	}
}

func requireSeccompChild(t *testing.T) {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		t.Skipf("the filter's table is for linux/amd64, not linux/%s", runtime.GOARCH)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the confined child runs in new mount and PID namespaces, and root shows what the filter denies")
	}
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
		t.Skipf("kernel without seccomp: prctl(PR_GET_SECCOMP) = %v", err)
	}
}

func TestSeccompInKernel(t *testing.T) {
	requireSeccompChild(t)
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
	if want := len(seccompProbes) + len(hostileProbes); len(got) != want {
		t.Fatalf("child reported %d probes, want %d; output:\n%s", len(got), want, out)
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
