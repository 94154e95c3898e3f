package main

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The numbers in this file are x86_64's: iopl and ioperm exist on no other
// architecture, so a port fails to compile here until it has its own table.

// Offsets into struct seccomp_data, the input of a seccomp filter.
const (
	seccompNr   = 0  // int nr
	seccompArch = 4  // __u32 arch
	seccompArgs = 16 // __u64 args[6]; x86_64 is little-endian, so the low half comes first
)

// x32SyscallBit marks the x32 ABI's system calls, which arrive with
// AUDIT_ARCH_X86_64 but numbers the table below does not list.
const x32SyscallBit = 0x40000000

// Personalities from <linux/personality.h>, which x/sys/unix does not
// define.
const (
	perLinux         = 0x0000
	perLinux32       = 0x0008
	perTypeMask      = 0x00ff
	perUname26       = 0x0020000
	perAddrNoRandom  = 0x0040000
	personalityQuery = 0xffffffff
)

// namespaceCloneSet is every CLONE_NEW* flag clone(2) accepts.
const namespaceCloneSet = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

var (
	retAllow  = bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	retEPERM  = bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)}
	retENOSYS = bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)}
)

type namedSyscall struct {
	name string
	nr   uint32
}

// deniedSyscalls fail with EPERM whatever their arguments: a sandboxed
// workload never needs them, and each either reaches outside the sandbox or
// opens kernel code that has a long record of privilege escalations.
// Docker's default profile denies the same, less the ones it allows when a
// capability is granted.
//
// Left allowed on purpose: chroot (with mount and pivot_root gone it can
// only narrow a view inside the sandbox's own root, and build tools use
// it); ptrace and process_vm_readv/writev (debuggers and strace need them,
// the kernel checks them as for ptrace attach, and since Linux 4.8 a
// tracer cannot use them to skip this filter); sethostname (the machine
// has its own UTS namespace).
var deniedSyscalls = []struct {
	why   string
	calls []namedSyscall
}{
	{"mounts could undo or see past the root the jail assembled", []namedSyscall{
		{"mount", unix.SYS_MOUNT}, {"umount2", unix.SYS_UMOUNT2}, {"pivot_root", unix.SYS_PIVOT_ROOT},
		{"open_tree", unix.SYS_OPEN_TREE}, {"move_mount", unix.SYS_MOVE_MOUNT}, {"fsopen", unix.SYS_FSOPEN},
		{"fsconfig", unix.SYS_FSCONFIG}, {"fsmount", unix.SYS_FSMOUNT}, {"fspick", unix.SYS_FSPICK},
		{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	}},
	{"joining another namespace leaves the sandbox", []namedSyscall{
		{"setns", unix.SYS_SETNS},
	}},
	{"kernel code from the workload: modules, a new kernel, eBPF, perf", []namedSyscall{
		{"kexec_load", unix.SYS_KEXEC_LOAD}, {"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
		{"init_module", unix.SYS_INIT_MODULE}, {"finit_module", unix.SYS_FINIT_MODULE},
		{"delete_module", unix.SYS_DELETE_MODULE}, {"bpf", unix.SYS_BPF},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	}},
	{"userfaultfd stalls the kernel mid-copy, a staple of exploits", []namedSyscall{
		{"userfaultfd", unix.SYS_USERFAULTFD},
	}},
	{"io_uring has been a steady source of kernel bugs; Docker's profile blocks it too", []namedSyscall{
		{"io_uring_setup", unix.SYS_IO_URING_SETUP}, {"io_uring_enter", unix.SYS_IO_URING_ENTER},
		{"io_uring_register", unix.SYS_IO_URING_REGISTER},
	}},
	{"the kernel keyring is not namespaced", []namedSyscall{
		{"keyctl", unix.SYS_KEYCTL}, {"add_key", unix.SYS_ADD_KEY}, {"request_key", unix.SYS_REQUEST_KEY},
	}},
	{"file handles open files by inode, past the mount namespace (the shocker escape)", []namedSyscall{
		{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT}, {"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	}},
	{"raw I/O ports reach the hardware", []namedSyscall{
		{"iopl", unix.SYS_IOPL}, {"ioperm", unix.SYS_IOPERM},
	}},
	{"swap, accounting, quotas and the kernel log are the whole machine's", []namedSyscall{
		{"swapon", unix.SYS_SWAPON}, {"swapoff", unix.SYS_SWAPOFF}, {"acct", unix.SYS_ACCT},
		{"quotactl", unix.SYS_QUOTACTL}, {"quotactl_fd", unix.SYS_QUOTACTL_FD},
		{"syslog", unix.SYS_SYSLOG}, {"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE},
	}},
	{"the clock is not namespaced (clock_settime: see clockBody)", []namedSyscall{
		{"settimeofday", unix.SYS_SETTIMEOFDAY},
		{"clock_adjtime", unix.SYS_CLOCK_ADJTIME}, {"adjtimex", unix.SYS_ADJTIMEX},
	}},
}

// A rule answers one system call. Its body runs when the number matches
// and must end in a return.
type rule struct {
	name string
	nr   uint32
	body []bpf.Instruction
}

// conditionalRules answer by a call's arguments. A filter sees the
// registers only, never memory they point to.
func conditionalRules(pid1 bool) []rule {
	return []rule{
		// Forks and threads are fine; new namespaces are not. clone's
		// low byte is the exit signal, so CLONE_NEWTIME (0x80) cannot be
		// asked for here.
		{"clone", unix.SYS_CLONE, denyIfAnyBit(0, namespaceCloneSet)},
		// unshare(CLONE_FS|CLONE_FILES|CLONE_SYSVSEM) stays harmless.
		{"unshare", unix.SYS_UNSHARE, denyIfAnyBit(0, namespaceCloneSet|unix.CLONE_NEWTIME)},
		// clone3's flags live in a struct the filter cannot read. ENOSYS
		// makes glibc fall back to clone, which the rule above checks.
		{"clone3", unix.SYS_CLONE3, []bpf.Instruction{retENOSYS}},
		{"personality", unix.SYS_PERSONALITY, personalityBody()},
		{"reboot", unix.SYS_REBOOT, rebootBody(pid1)},
		{"clock_settime", unix.SYS_CLOCK_SETTIME, clockBody(pid1)},
	}
}

// clockBody lets PID 1 set the wall clock, which is how the agent of a VM
// puts its clock right after the VM was paused (Server.SetClock). Only
// the agent holds CAP_SYS_TIME (dropCapabilities keeps it out of the
// bounding set, so nothing it starts gains it), and in a jail the
// kernel refuses it anyway: the host's clock is not its user namespace's.
func clockBody(pid1 bool) []bpf.Instruction {
	return allowPID1If(pid1, 0, unix.CLOCK_REALTIME)
}

// allowPID1If allows the call to PID 1 when argument arg is val, and
// denies it otherwise.
func allowPID1If(pid1 bool, arg int, val uint32) []bpf.Instruction {
	if !pid1 {
		return []bpf.Instruction{retEPERM}
	}
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: argLow(arg), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: val, SkipTrue: 1},
		retEPERM,
		retAllow,
	}
}

// denyIfAnyBit answers EPERM when argument arg has any bit of mask in its
// low 32 bits (where every CLONE_NEW* flag is).
func denyIfAnyBit(arg int, mask uint32) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: argLow(arg), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: mask, SkipFalse: 1},
		retEPERM,
		retAllow,
	}
}

// personalityBody allows what Docker allows (Linux, 32-bit Linux, the
// 2.6 uname, and the query) plus ADDR_NO_RANDOMIZE, which gdb uses on its
// own children. Other personalities bring back old behaviour such as
// executable data or a mappable page zero.
func personalityBody() []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: argLow(0), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: personalityQuery, SkipTrue: 5},                                      // to allow
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: ^uint32(perTypeMask | perUname26 | perAddrNoRandom), SkipTrue: 3}, // to deny
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: perTypeMask},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: perLinux, SkipTrue: 2},   // to allow
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: perLinux32, SkipTrue: 1}, // to allow
		retEPERM,
		retAllow,
	}
}

// rebootBody lets PID 1 power off, which is how the agent ends its machine
// (powerOff). As PID 1 the guest owns a VM or a PID namespace, so a power
// off ends only the sandbox; anywhere else reboot could reach the host and
// is denied outright.
func rebootBody(pid1 bool) []bpf.Instruction {
	return allowPID1If(pid1, 2, unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func argLow(i int) uint32 { return uint32(seccompArgs + 8*i) }

// seccompRules lists every rule of the filter, each number once.
func seccompRules(pid1 bool) []rule {
	var rs []rule
	for _, g := range deniedSyscalls {
		for _, c := range g.calls {
			rs = append(rs, rule{c.name, c.nr, []bpf.Instruction{retEPERM}})
		}
	}
	return append(rs, conditionalRules(pid1)...)
}

// seccompFilter is the whole program: foreign architectures are killed,
// x32 calls denied, then each rule is tried in turn and anything else is
// allowed. A linear list is fast enough: the kernel caches the verdict of
// every number whose answer does not depend on arguments.
func seccompFilter(pid1 bool) []bpf.Instruction {
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: seccompArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AUDIT_ARCH_X86_64, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
		bpf.LoadAbsolute{Off: seccompNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
		retEPERM,
	}
	for _, r := range seccompRules(pid1) {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: r.nr, SkipTrue: uint8(len(r.body))})
		prog = append(prog, r.body...)
	}
	return append(prog, retAllow)
}

// applySeccomp confines the agent and everything it will start with a
// seccomp filter, on every thread at once (TSYNC). Denied with EPERM:
// mounting and the new mount API, setns, new namespaces through unshare or
// clone flags, loading kernel code (modules, kexec, eBPF, perf), keyrings,
// userfaultfd, file handles, I/O ports, swap, accounting, quotas, the
// kernel log, setting the clock except PID 1's wall clock, odd
// personalities, and reboot except PID 1's power off. clone3 answers ENOSYS, since its namespace flags are
// out of the filter's reach, so callers fall back to clone. Calls from any
// ABI other than x86_64 kill the process.
//
// main calls it once the jail and the mounts are in place, after setting
// no_new_privs on all threads, which the kernel requires of a caller
// without CAP_SYS_ADMIN. A filter cannot be removed: the agent's own later
// work (fork and exec, setuid to the agent user, PTYs, sockets, signals,
// wait4, prctl) uses none of what it denies.
func applySeccomp() error {
	raw, err := bpf.Assemble(seccompFilter(os.Getpid() == 1))
	if err != nil {
		return fmt.Errorf("assemble seccomp filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	tid, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if e != 0 {
		return fmt.Errorf("install seccomp filter: %w", e)
	}
	if tid != 0 {
		return fmt.Errorf("install seccomp filter: thread %d could not take it", tid)
	}
	return nil
}
