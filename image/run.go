package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// chrootScript runs in a private mount namespace (see chrootCmd), so the
// proc and sysfs mounts vanish with the command and never leak to the host
// or block removing the root directory.
const chrootScript = `set -e
root=$1; shift
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys"
exec chroot "$root" "$@"`

// hostEnv lists variables passed from the host into the chroot, so a build
// behind a proxy reaches the mirror and the npm registry the same way the
// host does.
var hostEnv = []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"}

func chrootEnv() []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LC_ALL=C",
		"DEBIAN_FRONTEND=noninteractive",
		"DEBCONF_NONINTERACTIVE_SEEN=true",
		"npm_config_update_notifier=false",
		"npm_config_fund=false",
		"npm_config_audit=false",
	}
	for _, k := range hostEnv {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// command prepares a host command whose whole process group dies when ctx
// ends, so an apt or dpkg grandchild does not outlive a cancelled build.
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = chrootEnv()
	return cmd
}

// privateMounts gives cmd its own mount namespace: whatever it mounts is
// gone when it exits, even if it is killed. Go also marks / recursively
// private in the new namespace, so nothing propagates back to the host.
func privateMounts(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	return cmd
}

// chrootCmd prepares args to run inside root with proc and sys mounted.
func chrootCmd(ctx context.Context, root string, args ...string) *exec.Cmd {
	return privateMounts(command(ctx, "/bin/sh", append([]string{"-c", chrootScript, "sh", root}, args...)...))
}

// tail keeps the last bytes written to it, for error messages.
type tail struct {
	buf []byte
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

// lines returns the last n non-empty lines.
func (t *tail) lines(n int) string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(t.buf))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// runLogged runs cmd with its output going to log under the line shown;
// an error carries the last lines of that output.
func runLogged(cmd *exec.Cmd, log io.Writer, shown string) error {
	t := &tail{max: 8 << 10}
	fmt.Fprintf(log, "$ %s\n", shown)
	// One writer for both, so exec writes to it from one goroutine.
	w := io.MultiWriter(log, t)
	if cmd.Stdout == nil {
		cmd.Stdout = w
	}
	cmd.Stderr = w
	if err := cmd.Run(); err != nil {
		if last := t.lines(8); last != "" {
			return fmt.Errorf("%w: %s", err, last)
		}
		return err
	}
	return nil
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if c, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll detaches every mount at or below dir.
func unmountAll(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	return nil
}

// removeTree deletes dir, refusing while anything is mounted below it:
// deleting through a mount of a host filesystem would delete host files.
func removeTree(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := unmountAll(dir); err != nil {
		return err
	}
	if mps, err := mountsUnder(dir); err != nil || len(mps) > 0 {
		return fmt.Errorf("remove %s: still mounted: %v %v", dir, mps, err)
	}
	return os.RemoveAll(dir)
}
