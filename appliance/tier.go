package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"hearth/fs"
	"hearth/image"
	"hearth/internal/atomicfile"
	"hearth/vmm"
	"hearth/vmm/chv"
	"hearth/vmm/jail"
	"hearth/vmm/qemu"
)

// The isolation tiers, strongest first, and "auto", which picks the
// strongest the host can run.
const (
	TierAuto = "auto"
	TierCHV  = "chv"
	TierQEMU = "qemu"
	TierJail = "jail"
)

// errTierUnavailable is the error of a forced tier this host cannot run:
// the daemon does not start.
var errTierUnavailable = errors.New("the isolation tier asked for cannot run here")

// tierProbes say what the host offers the VM tiers, each nil when the
// tier can run and otherwise why not. They are asked lazily, strongest
// first, since some boot a kernel to find out.
type tierProbes struct {
	chv     func() error // cloud-hypervisor is there and KVM boots a stock kernel with it
	qemu    func() error // qemu-system-x86_64 and virtiofsd are there
	qemuKVM func() error // KVM boots a stock kernel under QEMU
}

// tierChoice is the tier picked and why, for the log, hearth up and
// hearth doctor.
type tierChoice struct {
	Tier string    `json:"tier"`
	Why  string    `json:"why"`
	TCG  bool      `json:"tcg,omitempty"` // qemu under software emulation
	When time.Time `json:"when"`
}

// chooseTier picks the tier: the one the config forces (an error if the
// host cannot run it, saying why), or for auto the strongest the host
// can run: chv when Cloud Hypervisor is there and KVM boots a stock
// kernel, else qemu when KVM boots one under QEMU, else the jail. Auto
// never picks QEMU's software emulation, which is many times slower than
// the jail; forcing qemu with allow_tcg does.
func chooseTier(want string, allowTCG bool, p tierProbes) (tierChoice, error) {
	switch want {
	case TierJail:
		return tierChoice{Tier: TierJail, Why: "sandbox.tier = \"jail\""}, nil
	case TierCHV:
		if err := p.chv(); err != nil {
			return tierChoice{}, fmt.Errorf("sandbox.tier = \"chv\", but %v (or set tier = \"auto\")", err)
		}
		return tierChoice{Tier: TierCHV, Why: "sandbox.tier = \"chv\""}, nil
	case TierQEMU:
		if err := p.qemu(); err != nil {
			return tierChoice{}, fmt.Errorf("sandbox.tier = \"qemu\", but %v (or set tier = \"auto\")", err)
		}
		if err := p.qemuKVM(); err != nil {
			if !allowTCG {
				return tierChoice{}, fmt.Errorf("sandbox.tier = \"qemu\", but %v: set sandbox.allow_tcg = true to run VMs under software emulation (much slower), or tier = \"auto\"", err)
			}
			return tierChoice{Tier: TierQEMU, TCG: true, Why: fmt.Sprintf("sandbox.tier = \"qemu\" with allow_tcg: software emulation, since %v", err)}, nil
		}
		return tierChoice{Tier: TierQEMU, Why: "sandbox.tier = \"qemu\", with KVM"}, nil
	case TierAuto, "":
	default:
		return tierChoice{}, fmt.Errorf("sandbox.tier = %q: use auto, chv, qemu or jail", want)
	}
	chvErr := p.chv()
	if chvErr == nil {
		return tierChoice{Tier: TierCHV, Why: "Cloud Hypervisor is installed and KVM boots a stock kernel"}, nil
	}
	qemuErr := p.qemu()
	if qemuErr == nil {
		qemuErr = p.qemuKVM()
		if qemuErr == nil {
			return tierChoice{Tier: TierQEMU, Why: fmt.Sprintf("KVM boots a stock kernel under QEMU; chv: %v", chvErr)}, nil
		}
	}
	return tierChoice{Tier: TierJail, Why: fmt.Sprintf("no VM tier can run here: chv: %v; qemu: %v", chvErr, qemuErr)}, nil
}

// newDriver makes the machine driver of the tier the config asks for
// (or auto picks), and says which and why. It returns the guest agent it
// runs too. VM tiers boot the kernel and initramfs image makes (fetched
// and built the first time, then cached with the images).
func newDriver(start context.Context, cfg Config, images *imageService, log *slog.Logger) (vmm.Driver, string, tierChoice, error) {
	agent, err := guestAgentPath(cfg)
	if err != nil {
		return nil, agent, tierChoice{}, err
	}
	sb := cfg.Sandbox
	want := sb.Tier
	if want == "" {
		want = TierAuto
	}
	if want == TierJail {
		d, err := newJail(cfg, agent)
		c := tierChoice{Tier: TierJail, Why: "sandbox.tier = \"jail\"", When: time.Now()}
		if err == nil {
			saveTierChoice(cfg.StateDir, c)
		}
		return d, agent, c, err
	}
	ctx, cancel := context.WithTimeout(start, 10*time.Minute)
	defer cancel()
	var boot image.Boot
	var bootErr error
	booted := false
	getBoot := func() (image.Boot, error) {
		if !booted {
			booted = true
			if images == nil {
				bootErr = errors.New("no image cache")
			} else {
				log.Info("getting the VM kernel and initramfs (fetched from Debian the first time, then cached)")
				boot, bootErr = images.builder.Boot(ctx, agent)
			}
			if bootErr != nil {
				bootErr = fmt.Errorf("no VM kernel: %w", bootErr)
			}
		}
		return boot, bootErr
	}
	chvCfg := chv.DefaultConfig(filepath.Join(cfg.StateDir, "chv"))
	qemuCfg := qemu.Config{Dir: filepath.Join(cfg.StateDir, "qemu"), AllowTCG: sb.AllowTCG, Warm: sb.Warm}
	probes := tierProbes{
		chv: func() error {
			if _, err := exec.LookPath(chvCfg.CloudHypervisor); err != nil {
				return fmt.Errorf("cloud-hypervisor is not installed (from its releases: cloud-hypervisor-static)")
			}
			b, err := getBoot()
			if err != nil {
				return err
			}
			chvCfg.Kernel, chvCfg.Initramfs = b.Kernel, b.Initramfs
			if r := chv.Probe(ctx, chvCfg); !r.Usable {
				return errors.New(r.Reason)
			}
			return nil
		},
		qemu: func() error {
			p := qemu.ProbeHost(ctx, qemuCfg)
			if p.QEMU == "" || p.Virtiofsd == "" {
				return errors.New(strings.Join(p.Problems, "; "))
			}
			return nil
		},
		qemuKVM: func() error {
			b, err := getBoot()
			if err != nil {
				return err
			}
			qemuCfg.Kernel, qemuCfg.Initramfs = b.Kernel, b.Initramfs
			return bootsWithKVM(ctx, cfg.StateDir, qemuCfg)
		},
	}
	choice, err := chooseTier(want, sb.AllowTCG, probes)
	if start.Err() != nil { // the probes failed for that: they say nothing
		return nil, agent, choice, fmt.Errorf("start cancelled: %w", start.Err())
	}
	if err != nil {
		return nil, agent, choice, fmt.Errorf("%w: %v", errTierUnavailable, err)
	}
	choice.When = time.Now()
	var d vmm.Driver
	switch choice.Tier {
	case TierCHV:
		d, err = chv.New(chvCfg)
	case TierQEMU:
		if _, err = getBoot(); err == nil {
			qemuCfg.Kernel, qemuCfg.Initramfs = boot.Kernel, boot.Initramfs
			qemuCfg.NoKVM = choice.TCG
			d, err = qemu.New(qemuCfg)
		}
	default:
		d, err = newJail(cfg, agent)
	}
	if err == nil {
		saveTierChoice(cfg.StateDir, choice)
	}
	return d, agent, choice, err
}

// saveTierChoice keeps the daemon's choice for hearth doctor.
func saveTierChoice(stateDir string, c tierChoice) {
	b, _ := json.MarshalIndent(c, "", "  ")
	os.WriteFile(filepath.Join(stateDir, "tier.json"), append(b, '\n'), 0o600)
}

// lastTierChoice is the choice the daemon made when it last started.
func lastTierChoice(stateDir string) (tierChoice, bool) {
	var c tierChoice
	b, err := os.ReadFile(filepath.Join(stateDir, "tier.json"))
	return c, err == nil && json.Unmarshal(b, &c) == nil
}

// attestTier attests the tier newDriver picked (AttestIsolation) before
// it runs anything. A tier that fails is not used: when auto picked a VM
// tier the daemon falls back to the jail, attested in turn; a forced
// tier that fails keeps the daemon from starting (errTierUnavailable);
// a failed jail leaves the daemon without machines. Each result is kept
// for hearth doctor.
func attestTier(ctx context.Context, cfg Config, d vmm.Driver, c tierChoice, agent string, store *fs.Store, log *slog.Logger) (vmm.Driver, tierChoice, error) {
	a := attestDriver(ctx, cfg, d, c.Tier, agent, store, log)
	if a.OK {
		return d, c, nil
	}
	closeDriver(d)
	err := fmt.Errorf("%w: the %s tier: %s", errIsolationFailed, c.Tier, a.Failed())
	if want := cfg.Sandbox.Tier; want != "" && want != TierAuto {
		return nil, c, fmt.Errorf("%w: %w", errTierUnavailable, err)
	}
	if c.Tier == TierJail {
		return nil, c, err
	}
	log.Warn("falling back to the jail", "err", err)
	jd, jerr := newJail(cfg, agent)
	if jerr != nil {
		return nil, c, fmt.Errorf("%w; and the jail: %w", err, jerr)
	}
	jc := tierChoice{Tier: TierJail, Why: err.Error(), When: time.Now()}
	if a := attestDriver(ctx, cfg, jd, TierJail, agent, store, log); !a.OK {
		jd.Close()
		return nil, jc, fmt.Errorf("%w; and the jail: %s", err, a.Failed())
	}
	saveTierChoice(cfg.StateDir, jc)
	return jd, jc, nil
}

func attestDriver(ctx context.Context, cfg Config, d vmm.Driver, tier, agent string, store *fs.Store, log *slog.Logger) Attestation {
	a := AttestIsolation(ctx, d, tier, agent, filepath.Join(cfg.StateDir, "attest"), store)
	if a.OK {
		log.Info("isolation attested", "tier", tier, "took", a.Took.Round(time.Millisecond))
	}
	if err := saveAttestation(cfg.StateDir, a); err != nil {
		log.Error("isolation: keep the attestation for hearth doctor", "tier", tier, "err", err)
	}
	return a
}

func closeDriver(d vmm.Driver) {
	if c, ok := d.(interface{ Close() error }); ok {
		c.Close()
	}
}

// saveAttestation keeps a tier's last attestation for hearth doctor,
// in <state>/isolation-<tier>.json.
func saveAttestation(stateDir string, a Attestation) error {
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(stateDir, "isolation-"+a.Tier+".json"), append(b, '\n'), 0o600)
}

// lastAttestations are the attestations the daemon saved, by tier.
func lastAttestations(stateDir string) []Attestation {
	var out []Attestation
	for _, tier := range []string{TierCHV, TierQEMU, TierJail} {
		var a Attestation
		if b, err := os.ReadFile(filepath.Join(stateDir, "isolation-"+tier+".json")); err == nil && json.Unmarshal(b, &a) == nil {
			out = append(out, a)
		}
	}
	return out
}

// newJail makes the jail driver, its machines' host ids from the config's
// pool (sandbox.id_base, sandbox.id_machines).
func newJail(cfg Config, agent string) (*jail.Driver, error) {
	d, err := jail.NewWithIDs(filepath.Join(cfg.StateDir, "jail"), agent, idPool(cfg))
	if err == nil {
		d.SetWarm(cfg.Sandbox.Warm)
	}
	return d, err
}

// idPool is the config's pool of host ids for the jail's machines.
func idPool(cfg Config) jail.IDPool {
	pool := jail.DefaultIDPool
	if cfg.Sandbox.IDBase != 0 {
		pool.Base = cfg.Sandbox.IDBase
	}
	if cfg.Sandbox.IDMachines != 0 {
		pool.Machines = cfg.Sandbox.IDMachines
	}
	return pool
}
