package appliance

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/vmm/qemu"
)

// TestKVMTrialKept: a trial's answer is reused while the host boot, the
// kernel and the initramfs are the same, and not once the kernel changes.
func TestKVMTrialKept(t *testing.T) {
	dir := t.TempDir()
	cfg := qemu.Config{Kernel: filepath.Join(dir, "vmlinux"), Initramfs: filepath.Join(dir, "initrd")}
	os.WriteFile(cfg.Kernel, []byte("k"), 0o600)
	os.WriteFile(cfg.Initramfs, []byte("i"), 0o600)
	key, err := kvmTrialKey(cfg)
	if err != nil {
		t.Skipf("no host boot id: %v", err)
	}
	b, _ := json.Marshal(kvmTrial{Key: key, Err: "a trial boot under kvm did not reach the guest agent within 30s"})
	os.WriteFile(filepath.Join(dir, "kvm-trial.json"), b, 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := bootsWithKVM(ctx, dir, cfg); err == nil || !strings.Contains(err.Error(), "found at an earlier start") {
		t.Fatalf("bootsWithKVM with a kept failure = %v; want the kept answer", err)
	}
	b, _ = json.Marshal(kvmTrial{Key: key, OK: true})
	os.WriteFile(filepath.Join(dir, "kvm-trial.json"), b, 0o600)
	if err := bootsWithKVM(ctx, dir, cfg); err != nil {
		t.Fatalf("bootsWithKVM with a kept success = %v", err)
	}
	// The image cache touches the files it hands out (image.Builder.Boot
	// marks them used): a touched file is the same file.
	later := time.Now().Add(time.Minute)
	os.Chtimes(cfg.Kernel, later, later)
	os.Chtimes(cfg.Initramfs, later, later)
	if k, _ := kvmTrialKey(cfg); k != key {
		t.Fatalf("touching the kernel and initramfs changed the key %q to %q: every start would boot the trial again", key, k)
	}
	// A new kernel is a new file renamed in, of the same size here.
	os.WriteFile(cfg.Kernel+".new", []byte("K"), 0o600)
	os.Rename(cfg.Kernel+".new", cfg.Kernel)
	if k, _ := kvmTrialKey(cfg); k == key {
		t.Fatal("a changed kernel keeps the same key: a kept answer would outlive it")
	}
}
