package chv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
)

var (
	_ vmm.Exporter      = (*machine)(nil)
	_ vmm.UsageReporter = (*machine)(nil)
)

// exportScript mounts the image and a copy of the writable disk in the
// private mount namespace it runs in (so nothing stays mounted if it
// dies), lays the writable layer (upper/ on that disk, as the guest's
// overlay keeps it; none if the guest never wrote) over the image
// read-only, and copies the result to dst.
const exportScript = `set -e
root=$1 rw=$2 dst=$3 work=$4
mkdir -p "$work/root" "$work/rw" "$work/merged"
mount -o loop,ro "$root" "$work/root"
mount -o loop,ro "$rw" "$work/rw"
if [ -d "$work/rw/upper" ]; then
	mount -t overlay overlay -o "ro,lowerdir=$work/rw/upper:$work/root" "$work/merged"
else
	mount --bind "$work/root" "$work/merged"
fi
mkdir "$dst"
cp -a "$work/merged/." "$dst/"
rmdir "$dst/lost+found" 2>/dev/null || true
`

// Export writes the machine's root as it is now (the image with the
// writable layer over it) to dst, a new directory: the guest flushes its
// writes, the VM is paused while its writable disk is copied, then the
// copy's journal is replayed and both disks are mounted read-only on the
// host, overlaid and copied. A paused machine stays paused.
func (m *machine) Export(ctx context.Context, dst string) error {
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("export machine %s: %s: %w", m.id, dst, vmm.ErrExists)
	}
	for _, tool := range []string{"e2fsck", "mount", "cp"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("export machine %s: %w (apt-get install e2fsprogs mount coreutils)", m.id, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	work, err := os.MkdirTemp(m.dir, "export-")
	if err != nil {
		return fmt.Errorf("export machine %s: %w", m.id, err)
	}
	defer os.RemoveAll(work)
	rw := filepath.Join(work, rwDisk)
	if err := m.copyDiskPaused(ctx, rw); err != nil {
		return fmt.Errorf("export machine %s: %w", m.id, err)
	}
	// The copy was taken from a mounted filesystem: what is only in its
	// journal is put in place before a read-only mount can see it.
	if out, err := exec.CommandContext(ctx, "e2fsck", "-y", "-E", "journal_only", rw).CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			return fmt.Errorf("export machine %s: e2fsck: %w: %s", m.id, err, bytes.TrimSpace(out))
		}
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", exportScript, "sh", m.st.Root, rw, dst, work)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("export machine %s: %w: %s", m.id, err, bytes.TrimSpace(out))
	}
	m.d.record(m.id, "export", dst)
	return nil
}

// copyDiskPaused copies the writable disk to dst with the VM paused, after
// a running guest has flushed its writes.
func (m *machine) copyDiskPaused(ctx context.Context, dst string) error {
	state, err := m.vmState(ctx)
	if err != nil {
		return err
	}
	if state == "Paused" {
		return copySparse(ctx, m.path(rwDisk), dst)
	}
	if gc := m.Guest(); gc != nil {
		st, err := gc.Exec(ctx, guest.ExecRequest{Argv: []string{"sync"}}, nil, nil, nil)
		if err != nil || st.Code != 0 {
			return fmt.Errorf("sync in the guest: %v (exit %d %s)", err, st.Code, st.Error)
		}
	}
	if err := m.api.put(ctx, "vm.pause"); err != nil {
		return err
	}
	err = copySparse(ctx, m.path(rwDisk), dst)
	return errors.Join(err, m.api.put(ctx, "vm.resume"))
}

// Usage reports what the machine's host processes use: the CPU time of
// cloud-hypervisor (the guest's vCPUs and devices) and of virtiofsd, the
// resident memory of cloud-hypervisor (the guest's memory as far as it
// has touched it), and the blocks the writable disk takes. Processes
// inside the VM are not counted from the host: Processes is the host
// processes of the machine.
func (m *machine) Usage(ctx context.Context) (vmm.Usage, error) {
	p := m.proc()
	if p == nil || !p.alive() {
		return vmm.Usage{}, fmt.Errorf("machine %s: usage: not running", m.id)
	}
	cpu, rss, err := procStat(p.pid)
	if err != nil {
		return vmm.Usage{}, fmt.Errorf("machine %s: usage: %w", m.id, err)
	}
	mem := m.spec.Memory
	if mem == 0 {
		mem = m.d.cfg.Memory
	}
	u := vmm.Usage{CPUTime: cpu, Memory: rss, MemoryLimit: mem, DiskLimit: m.spec.Disk, Disk: -1, Processes: 1}
	if fsd := m.virtiofsdPID(); fsd > 0 {
		if cpu, _, err := procStat(fsd); err == nil {
			u.CPUTime += cpu
			u.Processes++
		}
	}
	var st syscall.Stat_t
	if syscall.Stat(m.path(rwDisk), &st) == nil {
		u.Disk = st.Blocks * 512
	}
	return u, nil
}

// virtiofsdPID is the machine's running virtiofsd, 0 if none.
func (m *machine) virtiofsdPID() int {
	if p := m.virtiofsd.Load(); p != nil {
		if p.alive() {
			return p.pid
		}
		return 0
	}
	m.mu.Lock()
	pid := m.st.Virtiofsd
	m.mu.Unlock()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if pid <= 0 || err != nil || trimDeleted(exe) != m.d.cfg.Virtiofsd {
		return 0
	}
	return pid
}

// procStat reads a process's CPU time (user and system) and resident
// memory from /proc/<pid>/stat.
func procStat(pid int) (cpu time.Duration, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The fields after the command name (which may hold spaces and
	// parentheses): utime is the 14th field of the line, stime the 15th,
	// rss (in pages) the 24th.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 22 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields, want at least 24", pid, len(f)+2)
	}
	var n [3]int64
	for j, k := range []int{11, 12, 21} {
		if n[j], err = strconv.ParseInt(f[k], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return time.Duration(n[0]+n[1]) * time.Second / 100, n[2] * int64(os.Getpagesize()), nil // USER_HZ
}
