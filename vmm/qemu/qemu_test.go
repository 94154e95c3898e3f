package qemu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hearth/image"
	"hearth/vmm"
	"hearth/vmm/vmmtest"
)

var (
	bootOnce sync.Once
	bootArt  image.Boot
	bootErr  error
)

// requireQEMU skips unless QEMU machines can run here.
func requireQEMU(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the qemu tests need root (virtiofsd, guest-owned files in the workspace)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not on PATH: apt-get install qemu-system-x86")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not on PATH: apt-get install e2fsprogs")
	}
	if _, err := exec.LookPath("apt-cache"); err != nil {
		t.Skip("apt-cache not on PATH: the VM kernel comes from Debian's " + image.KernelPackage)
	}
	if out, err := exec.Command("apt-cache", "show", "--no-all-versions", image.KernelPackage).Output(); err != nil || len(out) == 0 {
		t.Skipf("apt does not know %s (run apt-get update): %v", image.KernelPackage, err)
	}
}

// requireVirtiofsd skips unless workspaces can be shared.
func requireVirtiofsd(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/usr/lib/qemu/virtiofsd"); err != nil {
		t.Skip("/usr/lib/qemu/virtiofsd missing: apt-get install qemu-system-common")
	}
}

// boot returns the kernel and an initramfs with this tree's agent, made
// once per test binary in a cache kept between runs (keyed by kernel
// version and agent hash, so never stale).
func boot(t testing.TB) image.Boot {
	t.Helper()
	requireQEMU(t)
	agent := vmmtest.GuestAgent(t)
	bootOnce.Do(func() {
		b, err := image.NewBuilder(filepath.Join(os.TempDir(), "hearth-test-vm-boot"), nil, nil)
		if err == nil {
			bootArt, err = b.Boot(context.Background(), agent)
		}
		bootErr = err
	})
	if bootErr != nil {
		t.Fatalf("boot artifacts: %v", bootErr)
	}
	return bootArt
}

// testNoKVM: the tests' machines run under TCG. The development and CI
// hosts' /dev/kvm is a paravirtual KVM that, depending on the host, fails
// a stock kernel at once or boots it and stops it later on an instruction
// it cannot emulate, so a test through it would pass or fail with the
// host. The KVM path is TestKVMWithoutTCG's (and the appliance's trial
// boot's).
const testNoKVM = true

func newDriver(t testing.TB) *Driver {
	t.Helper()
	bt := boot(t)
	d, err := New(Config{Dir: filepath.Join(t.TempDir(), "qemu"), Kernel: bt.Kernel, Initramfs: bt.Initramfs, AllowTCG: true, NoKVM: testNoKVM})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reapAll(d); d.Close() })
	return d
}

// reapAll kills the machines a failed test left running.
func reapAll(d *Driver) {
	ids, _ := d.List(context.Background())
	for _, id := range ids {
		d.reap(d.machineDir(id), "left by a test")
	}
}

// busyboxImage makes a small image as package image lays one out: a
// root directory (busybox, users root and agent) and its ext4 file beside
// it. It returns the root directory.
func busyboxImage(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := vmmtest.BusyboxRoot(vmmtest.Busybox(t), root); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-d", root, root+".ext4", "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return root
}

func TestConformance(t *testing.T) {
	d := newDriver(t)
	root := busyboxImage(t)
	vmmtest.Run(t, d, func(id string) vmm.Spec {
		return vmm.Spec{ID: id, RootFS: root, UID: 1000, GID: 1000, Memory: 256 << 20}
	})
}

func TestInsideTheVM(t *testing.T) {
	d := newDriver(t)
	root := busyboxImage(t)
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "inside", RootFS: root, UID: 1000, GID: 1000, CPUs: 1, Memory: 256 << 20, Disk: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Destroy(ctx)
	checks := []struct{ name, script, want string }{
		{"runs as agent", "id -u", "1000\n"},
		{"own kernel", "uname -r | grep -c cloud-amd64", "1\n"},
		{"hostname", "hostname", "inside\n"},
		{"image is read-only below the overlay", "touch /bin/x 2>/dev/null && echo wrote || echo refused", "refused\n"},
		{"writable layer", "echo data > /home/agent/f && cat /home/agent/f", "data\n"},
		{"memory as asked", "awk '/MemTotal/ { print ($2 > 200000 && $2 <= 262144) }' /proc/meminfo", "1\n"},
		{"writable disk as asked", "df -k / | awk 'NR == 2 { print ($2 > 200000 && $2 <= 262144) }'", "1\n"},
		{"no privileges to gain", "grep NoNewPrivs /proc/self/status | tr -d '\\t '", "NoNewPrivs:1\n"},
	}
	for _, c := range checks {
		if out, st := vmmtest.Sh(t, m, c.script); out != c.want {
			t.Errorf("%s: %q = %q (exit %d), want %q", c.name, c.script, out, st.Code, c.want)
		}
	}
	u, err := m.(vmm.UsageReporter).Usage(ctx)
	if err != nil || u.CPUTime <= 0 || u.Memory <= 0 || u.Disk <= 0 {
		t.Errorf("Usage = %+v, %v; want CPU time, memory and disk above 0", u, err)
	}
}

func TestBadInput(t *testing.T) {
	bt := boot(t)
	ctx := context.Background()
	dir := t.TempDir()
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{Kernel: bt.Kernel, Initramfs: bt.Initramfs, AllowTCG: true}, "Config.Dir"},
		{"no kernel", Config{Dir: dir, Initramfs: bt.Initramfs, AllowTCG: true}, "no kernel given"},
		{"missing kernel", Config{Dir: dir, Kernel: filepath.Join(dir, "vmlinux"), Initramfs: bt.Initramfs, AllowTCG: true}, "image.Builder.Boot"},
		{"missing initramfs", Config{Dir: dir, Kernel: bt.Kernel, Initramfs: filepath.Join(dir, "initrd"), AllowTCG: true}, "initramfs"},
		{"no qemu", Config{Dir: dir, Kernel: bt.Kernel, Initramfs: bt.Initramfs, QEMU: "/nonexistent/qemu", AllowTCG: true}, "apt-get install qemu-system-x86"},
		{"TCG not allowed", Config{Dir: dir, Kernel: bt.Kernel, Initramfs: bt.Initramfs, NoKVM: true}, "AllowTCG"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error saying %q", err, tc.want)
			}
		})
	}

	d := newDriver(t)
	root := busyboxImage(t)
	noExt4 := filepath.Join(t.TempDir(), "rootfs")
	os.Mkdir(noExt4, 0o755)
	specs := []struct {
		name string
		spec vmm.Spec
		want string
	}{
		{"bad id", vmm.Spec{ID: "Bad/ID", RootFS: root}, "machine id"},
		{"no root", vmm.Spec{ID: "noroot"}, "no root filesystem"},
		{"missing root", vmm.Spec{ID: "noroot2", RootFS: filepath.Join(noExt4, "none")}, "root filesystem"},
		{"missing workspace", vmm.Spec{ID: "nows", RootFS: root, Workspace: filepath.Join(dir, "none")}, "workspace"},
		{"negative memory", vmm.Spec{ID: "negmem", RootFS: root, Memory: -1}, "negative"},
		{"socket path too long", vmm.Spec{ID: strings.Repeat("x", 63), RootFS: root}, "shorter state directory"},
	}
	for _, tc := range specs {
		t.Run(tc.name, func(t *testing.T) {
			m, err := d.Create(ctx, tc.spec)
			if err == nil {
				m.Destroy(ctx)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create(%+v) = %v, want an error saying %q", tc.spec, err, tc.want)
			}
		})
	}
	if ids, _ := d.List(ctx); len(ids) != 0 {
		t.Errorf("List after failed creates = %v, want none", ids)
	}
}

// TestKVMWithoutTCG: with TCG not allowed, a host whose KVM cannot boot
// the kernel (this project's CI: a nested, paravirtual KVM) gets an error
// that points at AllowTCG; a host with working KVM gets a machine.
func TestKVMWithoutTCG(t *testing.T) {
	bt := boot(t)
	if err := kvmUsable(); err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	d, err := New(Config{Dir: filepath.Join(t.TempDir(), "qemu"), Kernel: bt.Kernel, Initramfs: bt.Initramfs})
	if err != nil {
		t.Fatalf("New with KVM present = %v", err)
	}
	defer d.Close()
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "kvm", RootFS: busyboxImage(t), UID: 1000, GID: 1000})
	if err != nil {
		t.Logf("Create under KVM: %v", err)
		if !strings.Contains(err.Error(), "AllowTCG") {
			t.Errorf("Create under a KVM that fails = %v, want an error pointing at AllowTCG", err)
		}
		if ids, _ := d.List(ctx); len(ids) != 0 {
			t.Errorf("List after the failed Create = %v, want none", ids)
		}
		return
	}
	defer m.Destroy(ctx)
	if out, _ := vmmtest.Sh(t, m, "echo kvm"); out != "kvm\n" {
		t.Errorf("exec under KVM = %q", out)
	}
}

func TestProbeHost(t *testing.T) {
	requireQEMU(t)
	ctx := context.Background()
	p := ProbeHost(ctx, Config{})
	if !p.Usable() || !strings.HasPrefix(p.Version, "QEMU emulator") {
		t.Errorf("ProbeHost = %+v, want qemu found with its version", p)
	}
	if _, err := os.Stat("/usr/lib/qemu/virtiofsd"); (err == nil) != (p.Virtiofsd != "") {
		t.Errorf("ProbeHost.Virtiofsd = %q, but stat says %v", p.Virtiofsd, err)
	}
	if p.KVM != (kvmUsable() == nil) {
		t.Errorf("ProbeHost.KVM = %v, kvmUsable = %v", p.KVM, kvmUsable())
	}
	p = ProbeHost(ctx, Config{QEMU: "/nonexistent/qemu-system-x86_64", Virtiofsd: "/nonexistent/virtiofsd"})
	if p.Usable() || !strings.Contains(strings.Join(p.Problems, "\n"), "apt-get install qemu-system-x86") ||
		!strings.Contains(strings.Join(p.Problems, "\n"), "qemu-system-common") {
		t.Errorf("ProbeHost(missing binaries) = %+v, want unusable with what to install", p)
	}
}

// TestDoneWhenQEMUDies: a machine whose QEMU is killed is done, and
// Destroy still cleans up after it.
func TestDoneWhenQEMUDies(t *testing.T) {
	d := newDriver(t)
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: "dies", RootFS: busyboxImage(t), UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(m.(*machine).proc.Load().pid, syscall.SIGKILL)
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10s after QEMU was killed")
	}
	if err := m.Destroy(ctx); err != nil {
		t.Errorf("Destroy after QEMU died = %v", err)
	}
	if _, err := d.Recover(ctx, "dies"); !errors.Is(err, vmm.ErrNotFound) {
		t.Errorf("Recover after Destroy = %v, want ErrNotFound", err)
	}
	audit, _ := os.ReadFile(filepath.Join(d.cfg.Dir, "audit.jsonl"))
	if !strings.Contains(string(audit), `"kind":"exit"`) {
		t.Errorf("audit log has no exit event:\n%s", audit)
	}
}

// TestBootsWithKVM runs the trial boot. Where KVM boots stock kernels it
// must say so; under this project's CI's nested, paravirtual KVM it must
// fail with QEMU's reason. Either way, its answer matches a real Create.
func TestBootsWithKVM(t *testing.T) {
	bt := boot(t)
	ctx := context.Background()
	cfg := Config{Kernel: bt.Kernel, Initramfs: bt.Initramfs}
	cfg.setDefaults()
	// The same trial under TCG shows the probe itself works here.
	if err := trialBoot(ctx, cfg, "tcg"); err != nil {
		t.Errorf("trial boot under TCG = %v, want nil", err)
	}
	if err := kvmUsable(); err != nil {
		if err := BootsWithKVM(ctx, cfg); err == nil {
			t.Errorf("BootsWithKVM without usable KVM (%v) = nil", err)
		}
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	trial := BootsWithKVM(ctx, cfg)
	t.Logf("BootsWithKVM = %v", trial)
	cfg.Dir = filepath.Join(t.TempDir(), "qemu")
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	m, err := d.Create(ctx, vmm.Spec{ID: "trial", RootFS: busyboxImage(t), UID: 1000, GID: 1000})
	if err == nil {
		defer m.Destroy(ctx)
	}
	if (trial == nil) != (err == nil) {
		t.Errorf("BootsWithKVM = %v, but Create under KVM = %v", trial, err)
	}
	cfg.Kernel = filepath.Join(t.TempDir(), "none")
	if err := BootsWithKVM(ctx, cfg); err == nil || !strings.Contains(err.Error(), "image.Builder.Boot") {
		t.Errorf("BootsWithKVM(missing kernel) = %v, want an error saying how to make one", err)
	}
}
