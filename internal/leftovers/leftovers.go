// Package leftovers finds and clears what a killed daemon leaves on the
// machine: processes of an executable, mounts under a directory, a jail
// machine's cgroups. Tests that kill daemons with SIGKILL use it to check
// what was left and to clean up after themselves.
//
// Importers: tests only (cmd/hearth's crash tests, internal/threehost).
package leftovers

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Processes lists the processes running the executable exe.
func Processes(exe string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if p, err := os.Readlink(filepath.Join("/proc", ent.Name(), "exe")); err == nil && strings.TrimSuffix(p, " (deleted)") == exe {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Mounts lists the mount points of this mount namespace at or under dir,
// in the order they were mounted (outermost first).
func Mounts(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescape(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// unescape undoes the octal escapes (\040 for a space) of
// /proc/self/mountinfo.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// RemoveCgroups removes the jail driver's cgroups of machine id (the v1
// controllers' and the v2 tree's), trying for up to a second each while
// their last processes exit.
func RemoveCgroups(id string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "hearth", id))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", "hearth", id))
	for _, d := range dirs {
		for range 50 {
			if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
