package appliance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dustin/go-humanize"

	"hearth/fs"
	"hearth/image"
	"hearth/vmm"
	"hearth/vmm/chv"
	"hearth/vmm/jail"
	"hearth/vmm/qemu"
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
	// but boots no stock kernel. The daemon finds out with a trial boot.
	add("kvm", kvm == nil, "%s", orOK(kvm, "/dev/kvm opens read-write (whether it boots a stock kernel shows in a trial boot when the daemon starts)"))
	chvPath, chvErr := exec.LookPath("cloud-hypervisor")
	add("cloud-hypervisor", chvErr == nil, "%s", orOK(chvErr, chvPath))
	qp := qemu.ProbeHost(context.Background(), qemu.Config{})
	add("qemu", qp.QEMU != "", "%s", orDefault(qp.QEMU+" "+qp.Version, qemuProblem(qp)))
	add("virtiofsd", qp.Virtiofsd != "", "%s", orDefault(qp.Virtiofsd, "not found: apt-get install qemu-system-common (VMs get their workspace through it)"))
	_, fuseErr := os.Stat("/dev/fuse")
	add("fuse", fuseErr == nil && os.Geteuid() == 0, "%s", fuseDetail(fuseErr))
	add("cgroups", true, "%s", cgroupsDetail())
	userns, _ := os.ReadFile("/proc/sys/user/max_user_namespaces")
	n := strings.TrimSpace(string(userns))
	add("user namespaces", n != "" && n != "0", "max_user_namespaces = %s", orNone(n))
	agent, agentErr := guestAgentPath(cfg)
	add("guest agent", agentErr == nil, "%s", orOK(agentErr, agent))
	add("images", true, "%s", imagesDetail(cfg))
	d.Checks = append(d.Checks, daemonChecks(cfg)...)
	for _, a := range lastAttestations(cfg.StateDir) {
		detail := fmt.Sprintf("attested when the daemon last started, in %v", a.Took.Round(time.Millisecond))
		if !a.OK {
			detail = "failed when the daemon last started, so not used: " + a.Failed()
		}
		add("isolation ("+a.Tier+")", a.OK, "%s", detail)
	}
	if ws := filepath.Join(cfg.StateDir, "workspace"); dirExists(ws) {
		free, err := fs.SpaceHealth(ws)
		add("workspace space", err == nil, "%s", orOK(err, humanize.IBytes(uint64(free))+" free for the workspace"))
		detail := "intact"
		if damaged := fs.DamagedJournals(ws); len(damaged) > 0 {
			detail = strings.Join(damaged, ", ") + ": a journal was damaged in its middle; the operations after the damage were " +
				"not replayed, and their bytes are kept there for recovery (remove the file once dealt with)"
		}
		add("workspace journal", detail == "intact", "%s", detail)
	}
	pool := idPool(cfg)
	poolErr := pool.Check()
	add("jail ids", poolErr == nil, "%s", orOK(poolErr, fmt.Sprintf("machines run as host ids %d and up, %d ids each; no /etc/subuid or /etc/subgid line overlaps them", pool.Base+jail.IDCount, jail.IDCount)))
	modes := stateModeProblems(cfg.StateDir)
	add("state modes", len(modes) == 0, "%s", orDefault(strings.Join(modes, "; "), cfg.StateDir+" and its files are root's only"))
	want := cfg.Sandbox.Tier
	last, haveLast := lastTierChoice(cfg.StateDir)
	switch {
	case want != "" && want != TierAuto:
		d.Tier, d.Why = want, fmt.Sprintf("sandbox.tier = %q forces it", want)
		if want == TierQEMU && kvm != nil && !cfg.Sandbox.AllowTCG {
			d.Why += fmt.Sprintf("; but %v, and allow_tcg is off: the daemon will not start", kvm)
		}
	case haveLast:
		d.Tier, d.Why = last.Tier, fmt.Sprintf("picked when the daemon last started (%s): %s", last.When.Format(time.RFC3339), last.Why)
	case chvErr != nil && (qp.QEMU == "" || kvm != nil):
		d.Tier, d.Why = TierJail, "no VM tier can run here: no cloud-hypervisor, and no QEMU with KVM"
	default:
		d.Tier, d.Why = TierAuto, "the daemon decides when it starts: a trial boot tells whether KVM boots a stock kernel (then chv or qemu), else jail"
	}
	return d
}

func qemuProblem(p qemu.Probe) string {
	for _, pr := range p.Problems {
		if strings.Contains(pr, "qemu") {
			return pr
		}
	}
	return "qemu-system-x86_64 not found: apt-get install qemu-system-x86"
}

func orDefault(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return strings.TrimSpace(s)
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

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
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

// DoctorIsolation attests every tier this host can run (AttestIsolation),
// each in a scratch state directory of its own so a running daemon is
// not disturbed: the jail always, qemu when it is installed (under
// software emulation only with sandbox.allow_tcg), chv when Cloud
// Hypervisor is. The VM kernel comes from cfg's image cache. Needs root.
func DoctorIsolation(ctx context.Context, cfg Config) ([]Attestation, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("doctor --isolation boots machines: run it as root")
	}
	agent, err := guestAgentPath(cfg)
	if err != nil {
		return nil, err
	}
	scratch, err := os.MkdirTemp("", "hearth-attest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	store, err := fs.Open(fs.Options{Dir: filepath.Join(scratch, "workspace")})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	var out []Attestation
	for _, tier := range []string{TierJail, TierQEMU, TierCHV} {
		d, err := doctorDriver(ctx, cfg, tier, agent, filepath.Join(scratch, tier))
		switch {
		case d == nil && err == nil:
			continue // not installed here
		case err != nil:
			out = append(out, Attestation{Tier: tier, Skipped: err.Error()})
			continue
		}
		out = append(out, AttestIsolation(ctx, d, tier, agent, filepath.Join(scratch, tier, "attest"), store))
		closeDriver(d)
	}
	return out, nil
}

// doctorDriver makes a driver of tier in dir, or nil if the host does
// not have what it needs.
func doctorDriver(ctx context.Context, cfg Config, tier, agent, dir string) (vmm.Driver, error) {
	if tier == TierJail {
		return jail.NewWithIDs(dir, agent, idPool(cfg))
	}
	if tier == TierCHV {
		if _, err := exec.LookPath("cloud-hypervisor"); err != nil {
			return nil, nil
		}
	} else if p := qemu.ProbeHost(ctx, qemu.Config{}); p.QEMU == "" || p.Virtiofsd == "" {
		return nil, nil
	}
	b, err := image.NewBuilder(filepath.Join(cfg.StateDir, "images"), nil, nil)
	if err != nil {
		return nil, err
	}
	boot, err := b.Boot(ctx, agent)
	if err != nil {
		return nil, fmt.Errorf("no VM kernel: %w", err)
	}
	if tier == TierCHV {
		c := chv.DefaultConfig(dir)
		c.Kernel, c.Initramfs = boot.Kernel, boot.Initramfs
		if r := chv.Probe(ctx, c); !r.Usable {
			return nil, errors.New(r.Reason)
		}
		return chv.New(c)
	}
	c := qemu.Config{Dir: dir, Kernel: boot.Kernel, Initramfs: boot.Initramfs, AllowTCG: cfg.Sandbox.AllowTCG}
	if err := bootsWithKVM(ctx, cfg.StateDir, c); err != nil {
		if !cfg.Sandbox.AllowTCG {
			return nil, fmt.Errorf("%v, and sandbox.allow_tcg is off", err)
		}
		c.NoKVM = true
	}
	return qemu.New(c)
}
