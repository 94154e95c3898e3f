package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"hearth/vmm"
)

// Probe says what this host offers the QEMU tier, for choosing a tier and
// for a doctor's report.
type Probe struct {
	// QEMU is the path of qemu-system-x86_64, empty if there is none, and
	// Version its first line of --version.
	QEMU    string `json:"qemu,omitempty"`
	Version string `json:"version,omitempty"`
	// Virtiofsd is the path of virtiofsd, empty if there is none (then
	// machines can have no workspace).
	Virtiofsd string `json:"virtiofsd,omitempty"`
	// KVM says /dev/kvm can be opened and speaks the stable KVM API.
	// Whether it can boot a stock kernel (a paravirtual nested KVM cannot)
	// is only known by booting one: Create finds out.
	KVM bool `json:"kvm"`
	// Problems says, for each thing missing, what is wrong and what to do.
	Problems []string `json:"problems,omitempty"`
}

// Usable reports whether machines can be made at all (with TCG if KVM is
// not there).
func (p Probe) Usable() bool { return p.QEMU != "" }

// ProbeHost looks for the binaries and KVM, with the paths of cfg where it
// gives them (its defaults otherwise). It never fails: what is missing is
// in Problems.
func ProbeHost(ctx context.Context, cfg Config) Probe {
	cfg.setDefaults()
	var p Probe
	if path, err := exec.LookPath(cfg.QEMU); err == nil {
		p.QEMU = path
		if out, err := exec.CommandContext(ctx, path, "--version").Output(); err == nil {
			p.Version, _, _ = strings.Cut(string(out), "\n")
		}
	} else {
		p.Problems = append(p.Problems, fmt.Sprintf("%s not found (%v): apt-get install qemu-system-x86", cfg.QEMU, err))
	}
	if _, err := os.Stat(cfg.Virtiofsd); err == nil {
		p.Virtiofsd = cfg.Virtiofsd
	} else {
		p.Problems = append(p.Problems, fmt.Sprintf("virtiofsd not found at %s: apt-get install qemu-system-common (machines get no workspace without it)", cfg.Virtiofsd))
	}
	if err := kvmUsable(); err != nil {
		p.Problems = append(p.Problems, fmt.Sprintf("KVM: %v; machines run under software emulation (TCG) only if allowed, much slower", err))
	} else {
		p.KVM = true
	}
	return p
}

// kvmUsable opens /dev/kvm and checks its API version.
func kvmUsable() error {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/kvm: %w", err)
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion = 0xae00 // _IO(KVMIO, 0x00)
	v, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kvmGetAPIVersion, 0)
	if errno != 0 {
		return fmt.Errorf("KVM_GET_API_VERSION: %w", errno)
	}
	if v != 12 {
		return fmt.Errorf("/dev/kvm speaks API version %d, want 12", v)
	}
	return nil
}

// probeReply is what the guest agent prints on the console when booted
// with hearth.probe (cmd/hearth-guest, vm_linux.go).
const probeReply = "hearth-guest: probe: the kernel started the agent"

// BootsWithKVM finds out whether KVM can run the kernel here by booting
// it: QEMU under KVM with cfg's kernel and initramfs, whose agent prints a
// line and powers off at once (hearth.probe on the kernel command line).
// It returns nil once the agent's line shows on the console, and otherwise
// an error saying why not: no usable /dev/kvm, QEMU failing under KVM (as
// under a nested, paravirtual KVM that only runs kernels built for it),
// or no answer within 30s. It takes about a second where KVM works.
func BootsWithKVM(ctx context.Context, cfg Config) error {
	cfg.setDefaults()
	if err := kvmUsable(); err != nil {
		return err
	}
	return trialBoot(ctx, cfg, "kvm")
}

// trialBoot boots the kernel with hearth.probe under accel and waits for
// the agent's line on the console.
func trialBoot(ctx context.Context, cfg Config, accel string) error {
	qemu, err := exec.LookPath(cfg.QEMU)
	if err != nil {
		return fmt.Errorf("%w: apt-get install qemu-system-x86", err)
	}
	for _, f := range []string{cfg.Kernel, cfg.Initramfs} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("trial boot: %w (make the kernel and initramfs with image.Builder.Boot)", err)
		}
	}
	dir, err := os.MkdirTemp("", "hearth-kvm-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	serial := filepath.Join(dir, "serial.log")
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmdline := append([]string{vmm.KernelArgs, "hearth.probe"}, clockArgs(accel)...)
	cmd := exec.CommandContext(ctx, qemu, "-M", "microvm", "-accel", accel, "-cpu", cpuModel(accel), "-m", "256M", "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-display", "none", "-no-reboot",
		"-kernel", cfg.Kernel, "-initrd", cfg.Initramfs,
		"-append", strings.Join(cmdline, " "), "-serial", "file:"+serial)
	out, err := cmd.CombinedOutput()
	console, _ := os.ReadFile(serial)
	if bytes.Contains(console, []byte(probeReply)) {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("a trial boot under %s did not reach the guest agent within 30s; console: %s", accel, lastLines(console, 4))
	}
	return fmt.Errorf("a trial boot under %s failed (%v): %s", accel, err, lastLines(out, 3))
}
