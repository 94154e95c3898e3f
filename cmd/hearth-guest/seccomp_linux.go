package main

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The filter is an allow-list: a call not named below fails with ENOSYS,
// as on a kernel too old to have it, which is what userland probing for
// new calls expects (glibc, Go and libuv fall back). The names are
// x86_64's: iopl and ioperm exist on no other architecture, and a port
// needs its own review of the list.

// Offsets into struct seccomp_data, the input of a seccomp filter.
const (
	seccompNr   = 0  // int nr
	seccompArch = 4  // __u32 arch
	seccompArgs = 16 // __u64 args[6]; x86_64 is little-endian, so the low half comes first
)

// x32SyscallBit marks the x32 ABI's system calls, which arrive with
// AUDIT_ARCH_X86_64 but numbers the table does not list; the library
// answers them ENOSYS before any rule.
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

const (
	actEPERM        = seccomp.ActionErrno | seccomp.Action(unix.EPERM)
	actENOSYS       = seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)
	actEAFNOSUPPORT = seccomp.ActionErrno | seccomp.Action(unix.EAFNOSUPPORT)
)

// allowedSyscalls may be called with any arguments. It is the
// unconditional part of Docker's default profile (moby/profiles/seccomp
// v0.3.0, its x86_64 names), reviewed, less three Docker allows:
// adjtimex and clock_adjtime (the clock is not namespaced) and
// name_to_handle_at (half of the shocker escape, see deniedSyscalls).
// Added: arch_prctl (Docker's amd64 extra; every x86_64 program sets its
// TLS with it) and chroot (Docker's, with CAP_SYS_CHROOT, which machines
// keep: with mount and pivot_root gone it can only narrow a view inside
// the machine's own root, and build tools use it). ptrace and
// process_vm_readv/writev are Docker's too: debuggers and strace need
// them, the kernel checks them as a ptrace attach, and since Linux 4.8 a
// tracer cannot use them to skip this filter.
//
// Left out, so ENOSYS, among others: everything of deniedSyscalls;
// modify_ldt (16-bit segments; nothing here needs them), get_mempolicy
// (NUMA), vhangup, sethostname and setdomainname (need CAP_SYS_ADMIN,
// which no process in a machine has), and every call newer than the
// library's table (Linux 6.15) until it is reviewed.
var allowedSyscalls = []string{
	"accept", "accept4", "access", "alarm", "arch_prctl", "bind", "brk", "cachestat", "capget", "capset",
	"chdir", "chmod", "chown", "chroot", "clock_getres", "clock_gettime", "clock_nanosleep", "close",
	"close_range", "connect", "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create",
	"epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait",
	"epoll_wait_old", "eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group", "faccessat",
	"faccessat2", "fadvise64", "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchmodat2",
	"fchown", "fchownat", "fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr",
	"fsetxattr", "fstat", "fstatfs", "fsync", "ftruncate", "futex", "futex_requeue", "futex_wait",
	"futex_waitv", "futex_wake", "futimesat", "getcpu", "getcwd", "getdents", "getdents64", "getegid",
	"geteuid", "getgid", "getgroups", "getitimer", "getpeername", "getpgid", "getpgrp", "getpid", "getppid",
	"getpriority", "getrandom", "getresgid", "getresuid", "getrlimit", "get_robust_list", "getrusage",
	"getsid", "getsockname", "getsockopt", "get_thread_area", "gettid", "gettimeofday", "getuid", "getxattr",
	"getxattrat", "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel",
	"ioctl", "io_destroy", "io_getevents", "io_pgetevents", "ioprio_get", "ioprio_set", "io_setup",
	"io_submit", "kill", "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "lchown",
	"lgetxattr", "link", "linkat", "listen", "listmount", "listxattr", "listxattrat", "llistxattr",
	"lremovexattr", "lseek", "lsetxattr", "lstat", "madvise", "map_shadow_stack", "membarrier",
	"memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2",
	"mlockall", "mmap", "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
	"mq_timedsend", "mq_unlink", "mremap", "mseal", "msgctl", "msgget", "msgrcv", "msgsnd", "msync",
	"munlock", "munlockall", "munmap", "nanosleep", "newfstatat", "open", "openat", "openat2", "pause",
	"pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll",
	"ppoll", "prctl", "pread64", "preadv", "preadv2", "prlimit64", "process_mrelease", "process_vm_readv",
	"process_vm_writev", "pselect6", "ptrace", "pwrite64", "pwritev", "pwritev2", "read", "readahead",
	"readlink", "readlinkat", "readv", "recvfrom", "recvmmsg", "recvmsg", "remap_file_pages", "removexattr",
	"removexattrat", "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction",
	"rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
	"rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr", "sched_getparam",
	"sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
	"sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp",
	"select", "semctl", "semget", "semop", "semtimedop", "sendfile", "sendmmsg", "sendmsg", "sendto",
	"setfsgid", "setfsuid", "setgid", "setgroups", "setitimer", "setpgid", "setpriority", "setregid",
	"setresgid", "setresuid", "setreuid", "setrlimit", "set_robust_list", "setsid", "setsockopt",
	"set_thread_area", "set_tid_address", "setuid", "setxattr", "setxattrat", "shmat", "shmctl", "shmdt",
	"shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "splice", "stat", "statfs", "statmount",
	"statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time",
	"timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create",
	"timerfd_gettime", "timerfd_settime", "times", "tkill", "truncate", "umask", "uname", "unlink",
	"unlinkat", "uretprobe", "utime", "utimensat", "utimes", "vfork", "vmsplice", "wait4", "waitid", "write",
	"writev",
}

// deniedSyscalls fail with EPERM, as in Docker, rather than the default
// ENOSYS: each is known, and either reaches outside the machine or opens
// kernel code with a long record of privilege escalations. Listing them
// keeps the reasons and lets tests check each one.
var deniedSyscalls = []struct {
	why   string
	calls []string
}{
	{"mounts could undo or see past the root the jail assembled", []string{
		"mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
		"mount_setattr",
	}},
	{"joining another namespace leaves the sandbox", []string{"setns"}},
	{"kernel code from the workload: modules, a new kernel, eBPF, perf", []string{
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf", "perf_event_open",
	}},
	{"userfaultfd stalls the kernel mid-copy, a staple of exploits", []string{"userfaultfd"}},
	{"io_uring has been a steady source of kernel bugs; Docker's profile blocks it too", []string{
		"io_uring_setup", "io_uring_enter", "io_uring_register",
	}},
	{"the kernel keyring is not namespaced", []string{"keyctl", "add_key", "request_key"}},
	{"file handles open files by inode, past the mount namespace (the shocker escape)", []string{
		"open_by_handle_at", "name_to_handle_at",
	}},
	{"raw I/O ports reach the hardware", []string{"iopl", "ioperm"}},
	{"swap, accounting, quotas and the kernel log are the whole machine's", []string{
		"swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "lookup_dcookie",
	}},
	{"the clock is not namespaced (clock_settime: see clockBody)", []string{
		"settimeofday", "clock_adjtime", "adjtimex",
	}},
	{"another process's descriptors, memory advice or NUMA placement (Docker: CAP_SYS_PTRACE, CAP_SYS_NICE)", []string{
		"kcmp", "pidfd_getfd", "process_madvise", "mbind", "set_mempolicy", "set_mempolicy_home_node",
		"move_pages", "migrate_pages",
	}},
	{"obsolete calls nothing current uses, not in Docker's profile", []string{"sysfs", "ustat", "uselib"}},
}

var (
	retAllow        = bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	retEPERM        = bpf.RetConstant{Val: uint32(actEPERM)}
	retENOSYS       = bpf.RetConstant{Val: uint32(actENOSYS)}
	retEAFNOSUPPORT = bpf.RetConstant{Val: uint32(actEAFNOSUPPORT)}
)

// A rule answers one system call by its arguments. Its body runs when
// the number matches and must end in a return. A filter sees the
// registers only, never memory they point to.
//
// These are written by hand: go-seccomp-bpf v1.6.0 can match arguments,
// but a call whose arguments do not match goes on to the next group with
// an argument, not the number, in the accumulator, so nothing can follow
// a conditional group there.
type rule struct {
	name string
	nr   uint32
	body []bpf.Instruction
}

// conditionalRules are tried after the lists. Every argument they read
// is an int or a flag word whose bits of interest are in the low half,
// and the kernel ignores the high half of an int, so the low half is
// what counts.
func conditionalRules(pid1 bool) []rule {
	return []rule{
		// Forks and threads are fine; new namespaces are not. clone's
		// low byte is the exit signal, so CLONE_NEWTIME (0x80) cannot be
		// asked for here.
		{"clone", unix.SYS_CLONE, denyIfAnyBit(0, namespaceCloneSet)},
		// unshare(CLONE_FS|CLONE_FILES|CLONE_SYSVSEM) stays harmless.
		{"unshare", unix.SYS_UNSHARE, denyIfAnyBit(0, namespaceCloneSet|unix.CLONE_NEWTIME)},
		{"socket", unix.SYS_SOCKET, socketBody()},
		{"socketpair", unix.SYS_SOCKETPAIR, allowIf(0, unix.AF_UNIX, retEAFNOSUPPORT)},
		{"personality", unix.SYS_PERSONALITY, personalityBody()},
		{"reboot", unix.SYS_REBOOT, rebootBody(pid1)},
		{"clock_settime", unix.SYS_CLOCK_SETTIME, clockBody(pid1)},
	}
}

// socketBody allows the families a machine has any use for; any other
// fails with EAFNOSUPPORT, as if the kernel were built without it. vsock
// in particular is not namespaced: a jail could bind the host's ports.
// Of netlink, route only (getifaddrs, Go's net.Interfaces); its other
// protocols reach the kernel's audit, uevents, crypto and more.
func socketBody() []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: argLow(0), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_UNIX, SkipTrue: 6},       // to allow
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET, SkipTrue: 5},       // to allow
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET6, SkipTrue: 4},      // to allow
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_NETLINK, SkipFalse: 2},   // to deny
		bpf.LoadAbsolute{Off: argLow(2), Size: 4},                             // the protocol
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.NETLINK_ROUTE, SkipTrue: 1}, // to allow
		retEAFNOSUPPORT,
		retAllow,
	}
}

// clockBody lets PID 1 set the wall clock, which is how the agent of a VM
// puts its clock right after the VM was paused (Server.SetClock). Only
// the agent holds CAP_SYS_TIME (dropBoundingSet keeps it out of the
// bounding set, so nothing it starts gains it), and in a jail the
// kernel refuses it anyway: the host's clock is not its user namespace's.
func clockBody(pid1 bool) []bpf.Instruction {
	return allowPID1If(pid1, 0, unix.CLOCK_REALTIME)
}

// rebootBody lets PID 1 power off, which is how the agent ends its machine
// (powerOff). As PID 1 the guest owns a VM or a PID namespace, so a power
// off ends only the sandbox; anywhere else reboot could reach the host and
// is denied outright.
func rebootBody(pid1 bool) []bpf.Instruction {
	return allowPID1If(pid1, 2, unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// allowPID1If allows the call to PID 1 when argument arg is val, and
// denies it otherwise.
func allowPID1If(pid1 bool, arg int, val uint32) []bpf.Instruction {
	if !pid1 {
		return []bpf.Instruction{retEPERM}
	}
	return allowIf(arg, val, retEPERM)
}

// allowIf allows the call when argument arg is val, and answers deny
// otherwise.
func allowIf(arg int, val uint32, deny bpf.RetConstant) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: argLow(arg), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: val, SkipTrue: 1},
		deny,
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

func argLow(i int) uint32 { return uint32(seccompArgs + 8*i) }

// listPolicy is the part of the filter that answers by number alone, for
// go-seccomp-bpf to assemble: the allow-list, clone3, and the calls
// denied with EPERM.
func listPolicy() *seccomp.Policy {
	var denied []string
	for _, g := range deniedSyscalls {
		denied = append(denied, g.calls...)
	}
	return &seccomp.Policy{
		DefaultAction: seccomp.ActionErrno, // replaced by the conditional rules: see seccompFilter
		Syscalls: []seccomp.SyscallGroup{
			{Names: allowedSyscalls, Action: seccomp.ActionAllow},
			// clone3's flags live in a struct the filter cannot read.
			// ENOSYS makes glibc fall back to clone, checked by its rule.
			{Names: []string{"clone3"}, Action: actENOSYS},
			{Names: denied, Action: actEPERM},
		},
	}
}

// seccompFilter is the whole program: calls of any other architecture
// kill the process (none is expected, and a 32-bit process whose every
// call failed, exit included, would spin); x32 calls answer ENOSYS; then
// the lists, the conditional rules, and ENOSYS for anything else. The
// kernel caches the verdict of every number whose answer does not depend
// on arguments, so the length of the lists costs nothing on the hot path.
func seccompFilter(pid1 bool) ([]bpf.Instruction, error) {
	lists, err := listPolicy().Assemble()
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp policy: %w", err)
	}
	// The library ends with its default action, where every call no list
	// names jumps. Dropping it makes those jumps land on the rules.
	last := len(lists) - 1
	if r, ok := lists[last].(bpf.RetConstant); !ok || r.Val != uint32(actEPERM) {
		return nil, fmt.Errorf("assemble seccomp policy: last instruction %v, want the default EPERM", lists[last])
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: seccompArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AUDIT_ARCH_X86_64, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
	}
	prog = append(prog, lists[:last]...)
	prog = append(prog, bpf.LoadAbsolute{Off: seccompNr, Size: 4})
	for _, r := range conditionalRules(pid1) {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: r.nr, SkipTrue: uint8(len(r.body))})
		prog = append(prog, r.body...)
	}
	return append(prog, retENOSYS), nil
}

// applySeccomp confines the agent and everything it will start with the
// allow-list filter, on every thread at once (TSYNC).
//
// main calls it once the jail and the mounts are in place, after setting
// no_new_privs on all threads, which the kernel requires of a caller
// without CAP_SYS_ADMIN. A filter cannot be removed: the agent's own later
// work (fork and exec, setuid to the agent user, PTYs, unix sockets,
// signals, wait4, prctl, and as PID 1 power off and the clock) is all
// allowed.
func applySeccomp() error {
	filter, err := assembleSeccomp()
	if err != nil {
		return err
	}
	return installSeccomp(filter)
}

// assembleSeccomp builds the filter applySeccomp installs.
func assembleSeccomp() ([]unix.SockFilter, error) {
	insns, err := seccompFilter(os.Getpid() == 1)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	return filter, nil
}

// installSeccomp installs an assembled filter on every thread.
func installSeccomp(filter []unix.SockFilter) error {
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
