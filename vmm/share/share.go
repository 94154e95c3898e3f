// Package share is the host side of a VM's workspace, shared by the VM
// tiers (vmm/qemu, vmm/chv): virtiofsd exports a plain directory of the
// machine's own (the share), and the session's workspace view is mounted
// at its agents/ subdirectory. The guest mounts the share at GuestMount
// and reaches the view through the symlink /workspace/agents ->
// GuestAgents, which the guest's kernel resolves again on every new path
// lookup. So when a daemon restarts and its views die, a new view put at
// agents/ (Replace) reaches the running guest without touching the VM or
// virtiofsd: the share is a shared mount, and virtiofsd's own mount
// namespace (a slave of the host's) receives the change.
//
// The VM drivers (vmm/qemu, vmm/chv) import it for the host side; the
// guest agent (cmd/hearth-guest) and the Cloud Hypervisor double
// (vmm/chv/chvdouble) for the guest contract. Nothing else does.
package share

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The guest contract, kept by hearth-guest's VM mode and by the Cloud
// Hypervisor double: /workspace is a small tmpfs holding the share's
// mount point and the symlink to the view.
const (
	// GuestMount is where the guest mounts the virtio-fs share.
	GuestMount = "/workspace/.share"
	// GuestAgents is the view inside the share, the target of
	// /workspace/agents.
	GuestAgents = GuestMount + "/" + Sub
	// Sub is the share's subdirectory the view is mounted at.
	Sub = "agents"
)

// Setup prepares dir and mounts the view at dir/agents.
func Setup(dir, view string) error {
	if err := checkView(view); err != nil {
		return err
	}
	if err := Prepare(dir); err != nil {
		return err
	}
	if err := Replace(dir, view); err != nil {
		Teardown(dir)
		return err
	}
	return nil
}

// Prepare makes dir (created if missing) a mount point of its own with
// shared propagation, so mounts under it reach the mount namespaces of
// its slaves (virtiofsd's), with no view yet: a machine booted before a
// session takes it gets its view with Replace.
func Prepare(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("workspace share: %w", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("workspace share: bind %s on itself: %w", dir, err)
	}
	// Private first: a peer group of its own, not the parent's.
	for _, flag := range []uintptr{unix.MS_PRIVATE, unix.MS_SHARED} {
		if err := unix.Mount("", dir, "", flag, ""); err != nil {
			Teardown(dir)
			return fmt.Errorf("workspace share: propagation of %s: %w", dir, err)
		}
	}
	return nil
}

// isMount reports whether dir is a mount point.
func isMount(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for _, p := range mountsUnder(dir) {
		if p == dir {
			return true
		}
	}
	return false
}

// Replace puts view at dir/agents in place of what is mounted there (a
// view whose daemon died, say). Guests see it on their next lookup of
// the share's agents entry, once their cached entry expires.
func Replace(dir, view string) error {
	if err := checkView(view); err != nil {
		return err
	}
	if !isMount(dir) {
		return fmt.Errorf("workspace share %s is not set up: the machine was made without one (by an older Hearth?); make it again to give it a new view", dir)
	}
	mnt := filepath.Join(dir, Sub)
	if err := os.Mkdir(mnt, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("workspace share: %w", err)
	}
	// Lazily: a dead view's mount may still be busy in virtiofsd.
	detachAll(mnt)
	if err := unix.Mount(view, mnt, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("workspace share: bind view %s at %s: %w", view, mnt, err)
	}
	return nil
}

// Teardown unmounts the view and the share and removes dir. It fails,
// leaving dir, if something is still mounted under it: never remove a
// directory whose view would be emptied with it. Idempotent.
func Teardown(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	mnt := filepath.Join(dir, Sub)
	detachAll(mnt)
	detachAll(dir)
	if left := mountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("workspace share %s: still mounted: %s", dir, strings.Join(left, ", "))
	}
	// Nothing is mounted under dir any more, so RemoveAll cannot reach
	// into a view. (The guest may have written to the share itself.)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("workspace share: %w", err)
	}
	return nil
}

// detachAll lazily unmounts every mount stacked at path.
func detachAll(path string) {
	for i := 0; i < 16 && unix.Unmount(path, unix.MNT_DETACH) == nil; i++ {
	}
}

func checkView(view string) error {
	st, err := os.Stat(view)
	if err != nil {
		return fmt.Errorf("workspace view: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("workspace view %s is not a directory", view)
	}
	return nil
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"(cannot read /proc/self/mountinfo: " + err.Error() + ")"}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescape(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
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
