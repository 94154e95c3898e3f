package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// keptCaps are the capabilities root in a machine keeps: Docker's default
// set, enough for package managers, servers and chown as root inside,
// and nothing that administers the kernel, mounts, the network or the
// machine's namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_PTRACE,
// CAP_SYS_MODULE, ...). The agent needs only these after its setup: it
// switches users for execs, chowns uploads, reads any file and signals
// its processes.
var keptCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_KILL,
	unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE, unix.CAP_NET_RAW,
	unix.CAP_SYS_CHROOT, unix.CAP_MKNOD, unix.CAP_AUDIT_WRITE, unix.CAP_SETFCAP,
}

// agentOnlyCaps are kept in the agent's own sets but not in the bounding
// set, so nothing it starts, root included, gains them: CAP_SYS_TIME, to
// put a VM's clock right after a pause (the seccomp filter allows PID 1
// clock_settime of the wall clock and nothing else).
var agentOnlyCaps = []int{unix.CAP_SYS_TIME}

// dropBoundingSet removes every capability but keptCaps from the
// bounding set, so nothing the agent starts, root included, can gain
// it. The set is per thread: every thread of the agent does it, one
// stop-the-world call per capability, which a loaded host makes slow;
// a jail prepared ahead of time does it before its claim (main.go). The
// agent's own capabilities are untouched: dropOwnCapabilities.
func dropBoundingSet() error {
	keep := map[int]bool{}
	for _, c := range keptCaps {
		keep[c] = true
	}
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if keep[c] {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, e)
		}
	}
	return nil
}

// dropOwnCapabilities removes from the agent's own sets (every thread's)
// every capability but keptCaps and agentOnlyCaps.
func dropOwnCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for _, c := range append(slices.Clone(keptCaps), agentOnlyCaps...) {
		data[c/32].Effective |= 1 << (c % 32)
		data[c/32].Permitted |= 1 << (c % 32)
	}
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("set the agent's capabilities: %w", e)
	}
	return nil
}
