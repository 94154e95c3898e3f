package main

import (
	"fmt"
	"os"
	"syscall"
)

// initMounts does what an init must before anything runs: keep mounts from
// leaking to the host's namespace, then mount proc, sys, a minimal /dev
// where none is there, and a fresh /tmp.
func initMounts() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	mounts := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "/proc", "proc", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC | syscall.MS_RDONLY, ""},
		{"tmpfs", "/tmp", "tmpfs", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=1777"},
	}
	for _, m := range mounts {
		if m.fstype == "sysfs" && exists("/sys/kernel") {
			continue // already there (bind-mounted by the jail); sysfs cannot be mounted twice outside a new netns
		}
		os.MkdirAll(m.dst, 0o755)
		if err := syscall.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	if _, err := os.Stat("/dev/null"); err != nil {
		if err := syscall.Mount("devtmpfs", "/dev", "devtmpfs", syscall.MS_NOSUID, "mode=0755"); err != nil {
			return fmt.Errorf("mount devtmpfs on /dev: %w", err)
		}
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// powerOff ends the machine when PID 1 is done: in a VM the hypervisor
// sees a power-off; in a PID namespace the kernel kills every process in
// it as PID 1 exits.
func powerOff() {
	syscall.Sync()
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	os.Exit(0)
}
