package appliance

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"hearth/image"
)

// Check is one thing the doctor looked at on the host.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Diagnosis is what the host offers Hearth, and the isolation tier it will
// use.
type Diagnosis struct {
	Checks []Check `json:"checks"`
	Tier   string  `json:"tier"`
	Why    string  `json:"why"`
}

// Doctor looks at the host as the daemon would use it, without starting
// it: KVM, the VM monitors, FUSE, cgroups, user namespaces, the guest
// agent, and the images built in cfg's state directory.
func Doctor(cfg Config) Diagnosis {
	var d Diagnosis
	add := func(name string, ok bool, format string, args ...any) {
		d.Checks = append(d.Checks, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	kvm := usableKVM()
	// Opening /dev/kvm is not proof: a nested paravirtual KVM opens too
	// but boots no stock kernel. The VM drivers will find out by booting.
	add("kvm", kvm == nil, "%s", orOK(kvm, "/dev/kvm opens read-write (whether it boots a stock kernel shows only when a VM boots)"))
	chv, chvErr := exec.LookPath("cloud-hypervisor")
	add("cloud-hypervisor", chvErr == nil, "%s", orOK(chvErr, chv))
	qemu, qemuErr := exec.LookPath("qemu-system-x86_64")
	add("qemu", qemuErr == nil, "%s", orOK(qemuErr, qemu))
	_, fuseErr := os.Stat("/dev/fuse")
	add("fuse", fuseErr == nil && os.Geteuid() == 0, "%s", fuseDetail(fuseErr))
	add("cgroups", true, "%s", cgroupsDetail())
	userns, _ := os.ReadFile("/proc/sys/user/max_user_namespaces")
	n := strings.TrimSpace(string(userns))
	add("user namespaces", n != "" && n != "0", "max_user_namespaces = %s", orNone(n))
	agent, agentErr := guestAgentPath(cfg)
	add("guest agent", agentErr == nil, "%s", orOK(agentErr, agent))
	add("images", true, "%s", imagesDetail(cfg))
	// Only the jail driver exists so far; the VM tiers come with their
	// issue. Say what would be picked and why.
	d.Tier, d.Why = "jail", "the jail is the only tier built so far"
	if kvm == nil && (chvErr == nil || qemuErr == nil) {
		d.Why += " (this host could run VMs once the chv and qemu drivers land)"
	}
	return d
}

func usableKVM() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("no usable KVM: %w", err)
	}
	f.Close()
	return nil
}

func fuseDetail(err error) string {
	switch {
	case err != nil:
		return "no /dev/fuse: load the fuse module (modprobe fuse)"
	case os.Geteuid() != 0:
		return "/dev/fuse exists; the daemon must run as root (FUSE passthrough, namespaces, cgroups)"
	}
	return "/dev/fuse, running as root"
}

func cgroupsDetail() string {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return "v2 (unified)"
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
		return "v1 with a v2 hierarchy beside it (hybrid): limits use v1"
	}
	return "v1"
}

func imagesDetail(cfg Config) string {
	cat, err := image.BuiltinCatalog()
	if err != nil {
		return err.Error()
	}
	b, err := image.NewBuilder(filepath.Join(cfg.StateDir, "images"), cat, nil)
	if err != nil {
		return err.Error()
	}
	imgs, err := b.List()
	if err != nil {
		return err.Error()
	}
	if len(imgs) == 0 {
		return "none built yet: hearth images build claude-code (or base)"
	}
	var names []string
	for _, img := range imgs {
		names = append(names, img.Name)
	}
	return strings.Join(names, ", ")
}

func orOK(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
