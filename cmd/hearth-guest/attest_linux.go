package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The attestation probe.
//
// The host proves a tier's isolation by booting a machine, copying this
// binary into it and running it there, as root of the machine, with
// attestArg: it looks around from the workload's side and prints one
// JSON object, {"checks": [{"name", "ok", "detail"}...]}. The host
// decides; the probe only reports what it saw. (Package appliance,
// AttestIsolation.)

// attestArg, as the first argument, makes hearth-guest the probe:
// hearth-guest --attest [--host-path P]... [--other-session DIR]
// [--pids N]. attestIdleArg makes it one of the idle children the pids
// check starts: it waits for its stdin to close.
const (
	attestArg     = "--attest"
	attestIdleArg = "--attest-idle"
)

// AttestCheck is one result of the probe.
type AttestCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// forbiddenCaps must be in neither the bounding nor the effective set of
// root in a machine: each administers the kernel, the network, mounts or
// other processes.
var forbiddenCaps = map[int]string{
	unix.CAP_DAC_READ_SEARCH: "dac_read_search", unix.CAP_NET_ADMIN: "net_admin", unix.CAP_SYS_MODULE: "sys_module",
	unix.CAP_SYS_RAWIO: "sys_rawio", unix.CAP_SYS_PTRACE: "sys_ptrace", unix.CAP_SYS_ADMIN: "sys_admin",
	unix.CAP_SYS_BOOT: "sys_boot", unix.CAP_SYS_TIME: "sys_time", unix.CAP_MAC_OVERRIDE: "mac_override",
	unix.CAP_MAC_ADMIN: "mac_admin", unix.CAP_SYSLOG: "syslog", unix.CAP_PERFMON: "perfmon", unix.CAP_BPF: "bpf",
}

func init() {
	if len(os.Args) > 1 && os.Args[1] == attestIdleArg {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == attestArg {
		if err := runAttest(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "hearth-guest: attest:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
}

type pathList []string

func (p *pathList) String() string     { return strings.Join(*p, ",") }
func (p *pathList) Set(v string) error { *p = append(*p, v); return nil }

func runAttest(args []string, out io.Writer) error {
	fl := flag.NewFlagSet("attest", flag.ContinueOnError)
	var hostPaths pathList
	fl.Var(&hostPaths, "host-path", "a host path that must not be reachable (repeatable)")
	other := fl.String("other-session", "", "another session's directory in the workspace: must be read-only, its .home hidden")
	pids := fl.Int("pids", 0, "the machine's process limit: starting this many processes must fail")
	if err := fl.Parse(args); err != nil {
		return err
	}
	checks := []AttestCheck{attestNetwork(), attestHostPaths(hostPaths), attestVsock(), attestSeccomp(), attestCaps()}
	if *other != "" {
		checks = append(checks, attestOtherSession(*other))
	}
	if *pids > 0 {
		checks = append(checks, attestPids(*pids))
	}
	checks = append(checks, attestMemory())
	return json.NewEncoder(out).Encode(struct {
		Checks []AttestCheck `json:"checks"`
	}{checks})
}

func check(name string, err error, ok string) AttestCheck {
	if err != nil {
		return AttestCheck{Name: name, Detail: err.Error()}
	}
	return AttestCheck{Name: name, OK: true, Detail: ok}
}

// attestNetwork: no interface but loopback.
func attestNetwork() AttestCheck {
	ents, err := os.ReadDir("/sys/class/net")
	if err == nil && len(ents) == 0 {
		err = errors.New("/sys/class/net is empty: sysfs not mounted?")
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if err == nil && (len(names) != 1 || names[0] != "lo") {
		err = fmt.Errorf("interfaces %s, want lo only", strings.Join(names, " "))
	}
	return check("network", err, "loopback only")
}

// attestHostPaths: the host's paths are not there, directly or through
// any process's root.
func attestHostPaths(paths []string) AttestCheck {
	roots, _ := filepath.Glob("/proc/[0-9]*/root")
	var seen []string
	for _, p := range paths {
		for _, prefix := range append([]string{""}, roots...) {
			// Refused (EACCES on another process's root) is unreachable too.
			if _, err := os.Lstat(prefix + p); err == nil && len(seen) < 5 {
				seen = append(seen, prefix+p)
			}
		}
	}
	var err error
	if len(paths) == 0 {
		err = errors.New("no host path given to look for")
	} else if len(seen) > 0 {
		err = fmt.Errorf("host paths reachable: %s", strings.Join(seen, ", "))
	}
	return check("host paths", err, fmt.Sprintf("%d host paths absent, also through /proc/*/root", len(paths)))
}

func orExists(err error) string {
	if err == nil {
		return "exists"
	}
	return err.Error()
}

// attestVsock: vsock is not namespaced, so no socket of it may be made.
func attestVsock() AttestCheck {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
		return check("vsock", errors.New("socket(AF_VSOCK) succeeded"), "")
	}
	return check("vsock", nil, "socket(AF_VSOCK): "+err.Error())
}

// attestSeccomp: this process runs under a seccomp filter, with
// no_new_privs.
func attestSeccomp() AttestCheck {
	st, err := procStatus()
	if err == nil && (st["Seccomp"] != "2" || st["NoNewPrivs"] != "1") {
		err = fmt.Errorf("status has Seccomp: %q, NoNewPrivs: %q; want 2 and 1", st["Seccomp"], st["NoNewPrivs"])
	}
	return check("seccomp", err, "filter on (Seccomp: 2), no_new_privs")
}

// attestCaps: root here holds none of forbiddenCaps, nor can gain them.
func attestCaps() AttestCheck {
	st, err := procStatus()
	if err != nil {
		return check("capabilities", err, "")
	}
	var bad []string
	for _, set := range []string{"CapBnd", "CapEff", "CapPrm", "CapAmb"} {
		mask, err := strconv.ParseUint(st[set], 16, 64)
		if err != nil {
			return check("capabilities", fmt.Errorf("%s: %q: %w", set, st[set], err), "")
		}
		for c, name := range forbiddenCaps {
			if mask&(1<<c) != 0 {
				bad = append(bad, set+":"+name)
			}
		}
	}
	slices.Sort(bad)
	if len(bad) > 0 {
		err = fmt.Errorf("held: %s", strings.Join(bad, " "))
	}
	return check("capabilities", err, "CapBnd "+st["CapBnd"]+", CapEff "+st["CapEff"])
}

// attestOtherSession: another session's files can be read, not written,
// and its private .home is not there.
func attestOtherSession(dir string) AttestCheck {
	var problems []string
	if _, err := os.ReadDir(dir); err != nil {
		problems = append(problems, fmt.Sprintf("cannot list it: %v", err))
	}
	probe := filepath.Join(dir, ".hearth-attest-write")
	if f, err := os.Create(probe); err == nil {
		f.Close()
		os.Remove(probe)
		problems = append(problems, "a file could be created in it")
	}
	if _, err := os.Lstat(filepath.Join(dir, ".home")); !errors.Is(err, fs.ErrNotExist) {
		problems = append(problems, fmt.Sprintf("its .home is visible (%v)", orExists(err)))
	}
	var err error
	if len(problems) > 0 {
		err = errors.New(strings.Join(problems, "; "))
	}
	return check("other session", err, dir+" read-only, its .home hidden")
}

// attestMemory reports the memory the kernel here offers (a VM's RAM);
// the host compares it with the limit. In a jail it is the host's, and
// the host reads the machine's cgroup instead.
func attestMemory() AttestCheck {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return check("memory", err, "")
	}
	return check("memory", nil, strconv.FormatUint(si.Totalram*uint64(si.Unit), 10))
}

// attestPids starts idle children until the kernel refuses one: it must
// refuse before limit of them run (this probe counts too).
func attestPids(limit int) AttestCheck {
	// Once the machine can start no more tasks, this process cannot
	// either: a Go runtime that wanted one more thread then would die
	// ("failed to create new OS thread"). Threads made now and left idle
	// are reused instead.
	spareThreads(8)
	var kids []*exec.Cmd
	var stdins []io.Closer
	var err error
	for len(kids) < limit+8 {
		cmd := exec.Command("/proc/self/exe", attestIdleArg)
		in, perr := cmd.StdinPipe()
		if perr != nil {
			err = perr
			break
		}
		if err = cmd.Start(); err != nil {
			in.Close()
			break
		}
		kids, stdins = append(kids, cmd), append(stdins, in)
	}
	for _, in := range stdins {
		in.Close()
	}
	for _, k := range kids {
		k.Wait()
	}
	if err == nil {
		return check("pids", fmt.Errorf("started %d processes under a limit of %d", len(kids), limit), "")
	}
	if len(kids) >= limit {
		return check("pids", fmt.Errorf("started %d processes under a limit of %d before %v", len(kids), limit, err), "")
	}
	return check("pids", nil, fmt.Sprintf("the %dth process was refused (%v), limit %d", len(kids)+1, err, limit))
}

// spareThreads makes the runtime start n threads and leaves them idle,
// for it to reuse rather than start new ones.
func spareThreads(n int) {
	var started sync.WaitGroup
	release := make(chan struct{})
	var done sync.WaitGroup
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread() // a thread of its own, started for it
			started.Done()
			<-release
			runtime.UnlockOSThread() // the thread goes idle, to be reused
		}()
	}
	started.Wait()
	close(release)
	done.Wait()
}

func procStatus() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m, nil
}
