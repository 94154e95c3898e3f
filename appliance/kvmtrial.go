package appliance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"hearth/internal/atomicfile"
	"hearth/vmm/qemu"
)

// Whether KVM boots the VM kernel here is found by booting it
// (qemu.BootsWithKVM): about a second where it works, but 30 s where it
// does not (a nested, paravirtual KVM, as on these machines), at every
// daemon start. The answer cannot change while the host runs the same
// kernel and the VM boots the same kernel and initramfs, so it is kept
// in the state directory under those, and a restart reuses it.

// kvmTrial is the kept answer.
type kvmTrial struct {
	Key string `json:"key"` // host boot, VM kernel and initramfs
	OK  bool   `json:"ok"`
	Err string `json:"error,omitempty"`
}

// bootsWithKVM is qemu.BootsWithKVM, answered from the state directory
// when this host boot already tried the same kernel and initramfs.
func bootsWithKVM(ctx context.Context, stateDir string, cfg qemu.Config) error {
	key, kerr := kvmTrialKey(cfg)
	path := filepath.Join(stateDir, "kvm-trial.json")
	if kerr == nil {
		var t kvmTrial
		if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &t) == nil && t.Key == key {
			if t.OK {
				return nil
			}
			return fmt.Errorf("%s (found at an earlier start since the host booted; remove %s to try again)", t.Err, path)
		}
	}
	err := qemu.BootsWithKVM(ctx, cfg)
	if kerr != nil || ctx.Err() != nil {
		return err // a cancelled trial says nothing about KVM
	}
	t := kvmTrial{Key: key, OK: err == nil}
	if err != nil {
		t.Err = err.Error()
	}
	b, _ := json.Marshal(t)
	atomicfile.WriteFile(path, b, 0o600) // only a cache: a failed write costs the next start a trial
	return err
}

// kvmTrialKey names what a trial's answer depends on: the host's boot
// (its kernel and KVM) and the VM's kernel and initramfs files, by path,
// size and inode. Not by modification time: the image cache touches the
// files it hands out to mark them used (image.Builder.Boot, at every
// daemon start), which made every start miss and pay the 30 s trial
// again. The cache never rewrites a file in place: a new kernel or
// initramfs is a new file, renamed in, with a new inode.
func kvmTrialKey(cfg qemu.Config) (string, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	parts := []string{strings.TrimSpace(string(boot))}
	for _, f := range []string{cfg.Kernel, cfg.Initramfs} {
		st, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		ino := uint64(0)
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			ino = sys.Ino
		}
		parts = append(parts, fmt.Sprintf("%s:%d:%d", f, st.Size(), ino))
	}
	return strings.Join(parts, "|"), nil
}
