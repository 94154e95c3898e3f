package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// JailConfig is what the jail driver asks the agent to set up before it
// serves: the agent runs as PID 1 of fresh mount, PID, network, IPC and
// UTS namespaces, so what it mounts here is the machine's alone.
type JailConfig struct {
	Lower     string `json:"lower"`     // image root, read-only
	Upper     string `json:"upper"`     // this machine's writable layer
	Work      string `json:"work"`      // overlayfs work directory
	Merged    string `json:"merged"`    // where the root is assembled
	Workspace string `json:"workspace"` // the session's workspace view, or ""
}

func loadJail(path string) (*JailConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c JailConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("jail config %s: %w", path, err)
	}
	return &c, nil
}

// enterJail assembles the machine's root and pivots into it.
func enterJail(c *JailConfig) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", c.Lower, c.Upper, c.Work)
	if err := syscall.Mount("overlay", c.Merged, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	if c.Workspace != "" {
		dst := filepath.Join(c.Merged, "workspace/agents")
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(c.Workspace, dst, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind workspace: %w", err)
		}
	}
	if err := minimalDev(filepath.Join(c.Merged, "dev")); err != nil {
		return err
	}
	return pivot(c.Merged)
}

// minimalDev gives the machine a /dev with the harmless devices only.
func minimalDev(dev string) error {
	os.MkdirAll(dev, 0o755)
	if err := syscall.Mount("tmpfs", dev, "tmpfs", syscall.MS_NOSUID|syscall.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		p := filepath.Join(dev, name)
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return err
		}
		if err := syscall.Mount("/dev/"+name, p, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", name, err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		os.MkdirAll(filepath.Join(dev, d), 0o755)
	}
	syscall.Mount("tmpfs", filepath.Join(dev, "shm"), "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777")
	// Terminals of its own for PTY execs, none of the host's.
	if err := syscall.Mount("devpts", filepath.Join(dev, "pts"), "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	os.Symlink("pts/ptmx", filepath.Join(dev, "ptmx"))
	for link, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		os.Symlink(target, filepath.Join(dev, link))
	}
	return nil
}

// pivot makes root the new / and drops the old one entirely.
func pivot(root string) error {
	old := filepath.Join(root, ".oldroot")
	if err := os.MkdirAll(old, 0o700); err != nil {
		return err
	}
	if err := syscall.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := syscall.Unmount("/.oldroot", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return os.Remove("/.oldroot")
}

// loopbackUp brings up lo, the only interface in the machine's network
// namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}
