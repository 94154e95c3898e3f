package chv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"hearth/vmm"
	"hearth/vmm/chv/api"
)

// ProbeResult says whether this host can run the tier, and why not.
type ProbeResult struct {
	Usable  bool
	Binary  string // the cloud-hypervisor found
	Version string // as vmm.ping reports it
	Reason  string // for people: what is missing, or what worked
}

// probeTimeout bounds the trial boot: a stock kernel reaches its first
// serial line in well under a second with hardware KVM.
const probeTimeout = 20 * time.Second

// Probe checks, for tier selection, that cloud-hypervisor is installed,
// that /dev/kvm can be opened, and that KVM can run a stock kernel: it
// boots cfg's kernel and initramfs in a scratch VM until the kernel prints
// its banner on the serial port, then ends it. (Where /dev/kvm is a
// paravirtual nested KVM that only runs kernels built for it, the boot
// fails, and Probe says so.) It needs cfg's CloudHypervisor, Kernel and
// Initramfs; Dir is not used.
func Probe(ctx context.Context, cfg Config) ProbeResult {
	bin, err := exec.LookPath(cfg.CloudHypervisor)
	if err != nil {
		return ProbeResult{Reason: fmt.Sprintf("%s not found (%v): install cloud-hypervisor-static from Cloud Hypervisor's releases", cfg.CloudHypervisor, err)}
	}
	r := ProbeResult{Binary: bin}
	kvm, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		r.Reason = fmt.Sprintf("cannot open /dev/kvm (%v): the host needs hardware virtualisation and access to /dev/kvm", err)
		return r
	}
	kvm.Close()
	if cfg.Kernel == "" || cfg.Initramfs == "" {
		r.Reason = "no kernel and initramfs to try a boot with (package image builds them)"
		return r
	}
	dir, err := os.MkdirTemp("", "chv-probe-")
	if err != nil {
		r.Reason = err.Error()
		return r
	}
	defer os.RemoveAll(dir)
	r.Version, err = trialBoot(ctx, bin, cfg, dir)
	if err != nil {
		r.Reason = "KVM cannot boot a stock kernel here: " + err.Error()
		return r
	}
	r.Usable = true
	r.Reason = fmt.Sprintf("cloud-hypervisor %s booted %s with KVM", r.Version, filepath.Base(cfg.Kernel))
	return r
}

// trialBoot boots the kernel in a scratch VMM under dir until its banner
// reaches the serial log.
func trialBoot(ctx context.Context, bin string, cfg Config, dir string) (string, error) {
	m := &machine{dir: dir, api: newClient(filepath.Join(dir, apiSock)), d: &Driver{cfg: cfg, ch: bin}, done: make(chan struct{})}
	m.destroying.Store(true) // a scratch VM: its end is no event
	if err := m.startVMM(ctx); err != nil {
		return "", err
	}
	defer m.stopVMM(context.Background())
	ping, err := m.api.ping(ctx)
	if err != nil {
		return "", err
	}
	cmdline := vmm.KernelArgs + " hearth.probe=1"
	serial := m.path(serialLog)
	vm := api.VmConfig{
		Payload: api.PayloadConfig{Kernel: &cfg.Kernel, Initramfs: &cfg.Initramfs, Cmdline: &cmdline},
		Memory:  &api.MemoryConfig{Size: 256 << 20},
		Serial:  &api.SerialConfig{Mode: "File", File: &serial},
		Console: &api.ConsoleConfig{Mode: "Off"},
	}
	if err := m.api.create(ctx, vm); err != nil {
		return ping.Version, err
	}
	if err := m.api.put(ctx, "vm.boot"); err != nil {
		return ping.Version, err
	}
	deadline := time.Now().Add(probeTimeout)
	for {
		b, _ := os.ReadFile(serial)
		if strings.Contains(string(b), "Linux version") {
			return ping.Version, nil
		}
		if !m.proc().alive() {
			return ping.Version, fmt.Errorf("cloud-hypervisor exited before the kernel printed anything: %s", m.tail(vmmLog, vmmOut))
		}
		if ctx.Err() != nil {
			return ping.Version, ctx.Err()
		}
		if time.Now().After(deadline) {
			return ping.Version, fmt.Errorf("no kernel banner on the serial port within %v: %s", probeTimeout, m.tail(serialLog, vmmLog))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
