package chv

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

func TestProbeMissingBinary(t *testing.T) {
	cfg := DefaultConfig("")
	cfg.CloudHypervisor = "/nonexistent/cloud-hypervisor"
	r := Probe(context.Background(), cfg)
	if r.Usable || !strings.Contains(r.Reason, "cloud-hypervisor-static") {
		t.Errorf("Probe without the binary = %+v, want unusable, saying what to install", r)
	}
}

// TestProbeNoKernelBanner: a VMM that boots no kernel (the double) is not
// usable, and Probe says the kernel did not start.
func TestProbeNoKernelBanner(t *testing.T) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("Probe checks /dev/kvm before it tries a boot; this host has none")
	}
	d, _ := doubleDriver(t)
	r := Probe(context.Background(), d.cfg)
	if r.Usable || !strings.Contains(r.Reason, "cannot boot a stock kernel") || r.Version == "" {
		t.Errorf("Probe with the double = %+v, want unusable (no kernel ran) with the version it pinged", r)
	}
}

// TestRealCloudHypervisor boots real VMs with the real binary and runs
// the conformance suite on them. It needs cloud-hypervisor on PATH, KVM
// that boots a stock kernel, and the boot artifacts of package image
// (HEARTH_VM_KERNEL, HEARTH_VM_INITRAMFS, HEARTH_VM_ROOTFS: vmlinux, the
// initramfs with hearth-guest as /init, and rootfs.ext4).
func TestRealCloudHypervisor(t *testing.T) {
	if _, err := exec.LookPath("cloud-hypervisor"); err != nil {
		t.Skip("cloud-hypervisor not on PATH: install cloud-hypervisor-static from Cloud Hypervisor's releases (it is not packaged for Debian)")
	}
	cfg := DefaultConfig(shortTemp(t))
	cfg.Kernel, cfg.Initramfs = os.Getenv("HEARTH_VM_KERNEL"), os.Getenv("HEARTH_VM_INITRAMFS")
	root := os.Getenv("HEARTH_VM_ROOTFS")
	if cfg.Kernel == "" || cfg.Initramfs == "" || root == "" {
		t.Skip("set HEARTH_VM_KERNEL, HEARTH_VM_INITRAMFS and HEARTH_VM_ROOTFS to the vmlinux, initramfs and rootfs.ext4 package image builds")
	}
	if r := Probe(context.Background(), cfg); !r.Usable {
		t.Skipf("KVM cannot boot a stock kernel on this host: %s", r.Reason)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ws := t.TempDir()
	vmmtest.Run(t, d, func(id string) vmm.Spec {
		return vmm.Spec{ID: id, RootFS: root, Workspace: ws, Memory: 512 << 20, CPUs: 1, UID: 1000, GID: 1000}
	})
}
