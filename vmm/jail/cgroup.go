package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"hearth/vmm"
)

// cgroup limits and freezes one machine, on cgroup v1 (one hierarchy per
// controller, as on the hosts Hearth is developed on) or v2 (one unified
// hierarchy, as on most current hosts).
type cgroup struct {
	v2   bool
	dirs map[string]string // controller ("" for v2) -> directory
}

// cgroupRoot is where the host mounts its cgroup hierarchies: one cgroup2
// filesystem (v2), or a directory of v1 hierarchies. Tests point it at
// another cgroup2 mount.
var cgroupRoot = "/sys/fs/cgroup"

// cgroupV2 reports whether cgroupRoot is a unified v2 hierarchy.
func cgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// newCgroup makes (or finds, after a restart) the cgroup of machine id,
// under parent (a path relative to each hierarchy's root).
func newCgroup(parent, id string) (*cgroup, error) {
	cg := &cgroup{v2: cgroupV2(), dirs: map[string]string{}}
	if cg.v2 {
		top := filepath.Join(cgroupRoot, filepath.Dir(parent))
		os.MkdirAll(filepath.Join(cgroupRoot, parent), 0o755)
		for _, dir := range []string{cgroupRoot, top, filepath.Join(cgroupRoot, parent)} {
			// Let the children use these controllers; cpu may be missing.
			os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0)
		}
		cg.dirs[""] = filepath.Join(cgroupRoot, parent, id)
	} else {
		for _, c := range []string{"memory", "cpu", "cpuacct", "pids", "freezer"} {
			if _, err := os.Stat(filepath.Join(cgroupRoot, c)); err == nil {
				cg.dirs[c] = filepath.Join(cgroupRoot, c, parent, id)
			}
		}
	}
	for c, dir := range cg.dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup %s %s: %w", c, dir, err)
		}
	}
	if err := cg.lowerCPUWeight(parent); err != nil {
		return nil, err
	}
	return cg, nil
}

// Machines' share of the CPU under contention, against the daemon and
// the rest of the host at the default weight (cpu.shares 1024, cpu.weight
// 100): all machines together get at most a third of a core the daemon
// wants too, so a busy agent cannot starve the daemon that serves every
// other one. They still use idle CPU freely.
const (
	machinesCPUShares = 512 // cgroup v1 cpu.shares
	machinesCPUWeight = 50  // cgroup v2 cpu.weight
)

// lowerCPUWeight gives the machines' parent cgroups (both levels of
// parent, "hearth" and "hearth/jail-<hash>") their CPU weight. A host
// without the cpu controller (no weight file) has no weights to set; a
// weight file that refuses the value is an error, since the daemon would
// otherwise run without the protection it promises.
func (cg *cgroup) lowerCPUWeight(parent string) error {
	for _, p := range []string{filepath.Dir(parent), parent} {
		var file, value string
		if cg.v2 {
			file, value = filepath.Join(cgroupRoot, p, "cpu.weight"), strconv.Itoa(machinesCPUWeight)
		} else if _, ok := cg.dirs["cpu"]; ok {
			file, value = filepath.Join(cgroupRoot, "cpu", p, "cpu.shares"), strconv.Itoa(machinesCPUShares)
		} else {
			continue
		}
		if err := writeExisting(file, value); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("set the machines' CPU share: %w", err)
		}
	}
	return nil
}

// writeExisting writes value to a control file that exists (never
// creating one: a missing file is ErrNotExist).
func writeExisting(file, value string) error {
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (cg *cgroup) write(controller, file, value string) error {
	dir, ok := cg.dirs[controller]
	if cg.v2 {
		dir, ok = cg.dirs[""], controller == "" || cg.enabled(controller)
	}
	if !ok {
		return fmt.Errorf("cgroup controller %s is not available on this host (to limit %s)", controller, file)
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup %s = %s: %w", filepath.Join(dir, file), value, err)
	}
	return nil
}

// limit sets memory (bytes), cpus (cores) and pids; zero leaves one unset.
func (cg *cgroup) limit(memory int64, cpus float64, pids int64) error {
	const period = 100000
	var errs []error
	if memory > 0 {
		if cg.v2 {
			errs = append(errs, cg.write("memory", "memory.max", strconv.FormatInt(memory, 10)),
				cg.write("memory", "memory.swap.max", "0"))
		} else {
			errs = append(errs, cg.write("memory", "memory.limit_in_bytes", strconv.FormatInt(memory, 10)))
		}
	}
	if cpus > 0 {
		quota := int64(cpus * period)
		if cg.v2 {
			errs = append(errs, cg.write("cpu", "cpu.max", fmt.Sprintf("%d %d", quota, period)))
		} else {
			errs = append(errs, cg.write("cpu", "cpu.cfs_period_us", strconv.Itoa(period)),
				cg.write("cpu", "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)))
		}
	}
	if pids > 0 {
		errs = append(errs, cg.write("pids", "pids.max", strconv.FormatInt(pids, 10)))
	}
	return errors.Join(errs...)
}

// add moves pid into every controller's cgroup.
func (cg *cgroup) add(pid int) error {
	for c, dir := range cg.dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cgroup %s: add %d: %w", c, pid, err)
		}
	}
	return nil
}

// freeze stops (or thaws) every process of the machine and waits until the
// kernel says it is done.
func (cg *cgroup) freeze(frozen bool) error {
	file, want, value := "freezer.state", "FROZEN", "FROZEN"
	controller := "freezer"
	if !frozen {
		want, value = "THAWED", "THAWED"
	}
	if cg.v2 {
		file, controller, want, value = "cgroup.freeze", "", "frozen 1", "1"
		if !frozen {
			want, value = "frozen 0", "0"
		}
	}
	if err := cg.write(controller, file, value); err != nil {
		return err
	}
	check := filepath.Join(cg.dirs[controller], "freezer.state")
	if cg.v2 {
		check = filepath.Join(cg.dirs[""], "cgroup.events")
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(check); err == nil && strings.Contains(string(b), want) {
			return nil
		}
	}
	return fmt.Errorf("cgroup freezer: %s not reached in 5s", want)
}

// remove deletes the cgroups; they must be empty.
func (cg *cgroup) remove() error {
	var errs []error
	for _, dir := range cg.dirs {
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			err := os.Remove(dir)
			if err == nil || os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// enabled reports whether a v2 controller is enabled for the machine's
// cgroup.
func (cg *cgroup) enabled(controller string) bool {
	b, _ := os.ReadFile(filepath.Join(cg.dirs[""], "cgroup.controllers"))
	return slices.Contains(strings.Fields(string(b)), controller)
}

// readInt reads a number from one of the cgroup's files (the first
// field of the line starting with key, if key is set); 0 if absent.
func (cg *cgroup) readInt(controller, file, key string) int64 {
	dir := cg.dirs[controller]
	if cg.v2 {
		dir = cg.dirs[""]
	}
	if dir == "" {
		return 0
	}
	b := readSmall(filepath.Join(dir, file))
	text := strings.TrimSpace(string(b))
	if key != "" {
		text = ""
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, key+" "); ok {
				text = v
			}
		}
	}
	n, _ := strconv.ParseInt(text, 10, 64)
	return n
}

// readSmall reads a cgroup file of at most 4 KiB (what readInt reads):
// open, read, close, without os.ReadFile's stat and registration with
// the poller (kernfs files are pollable), which doubled the cost of a
// sandbox's usage. Nil on an error.
func readSmall(path string) []byte {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if err != nil || n < 0 {
		return nil
	}
	return buf[:n]
}

// memoryUsage is what the machine's processes are charged for memory, in
// bytes; 0 if the host has no memory controller.
func (cg *cgroup) memoryUsage() int64 {
	if cg.v2 {
		return cg.readInt("", "memory.current", "")
	}
	return cg.readInt("memory", "memory.usage_in_bytes", "")
}

// usage is what the machine's processes use now.
func (cg *cgroup) usage() vmm.Usage {
	u := vmm.Usage{Memory: cg.memoryUsage(), Processes: cg.readInt("pids", "pids.current", "")}
	if cg.v2 {
		u.CPUTime = time.Duration(cg.readInt("", "cpu.stat", "usage_usec")) * time.Microsecond
		u.MemoryLimit = cg.readInt("", "memory.max", "") // "max" reads as 0: none
	} else {
		u.CPUTime = time.Duration(cg.readInt("cpuacct", "cpuacct.usage", ""))
		if limit := cg.readInt("memory", "memory.limit_in_bytes", ""); limit < 1<<62 {
			u.MemoryLimit = limit // v1 shows "none" as a huge number
		}
	}
	return u
}

// frozen reports whether the machine's processes are frozen.
func (cg *cgroup) frozen() bool {
	if cg.v2 {
		return cg.readInt("", "cgroup.events", "frozen") == 1
	}
	b, _ := os.ReadFile(filepath.Join(cg.dirs["freezer"], "freezer.state"))
	return strings.TrimSpace(string(b)) == "FROZEN"
}

// removeCgroupParent removes the parent cgroup in every hierarchy where it
// is empty.
func removeCgroupParent(parent string) {
	dirs := []string{filepath.Join(cgroupRoot, parent)}
	if !cgroupV2() {
		dirs, _ = filepath.Glob(filepath.Join(cgroupRoot, "*", parent))
	}
	for _, dir := range dirs {
		os.Remove(dir) // fails, as it should, while machines are in it
	}
}

// thawOne lets one process of a frozen machine run (on cgroup v1, by
// moving it into the parent freezer cgroup, which is thawed) and returns
// the function that freezes it again (moving it back). On v2, or without
// the freezer controller, it cannot single a process out: ok is false.
func (cg *cgroup) thawOne(pid int) (refreeze func() error, ok bool, err error) {
	dir, has := cg.dirs["freezer"]
	if cg.v2 || !has {
		return nil, false, nil
	}
	procs := func(d string) error {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cgroup freezer: move pid %d to %s: %w", pid, d, err)
		}
		return nil
	}
	if err := procs(filepath.Dir(dir)); err != nil {
		return nil, true, err
	}
	return func() error { return procs(dir) }, true, nil
}
