package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cavaliergopher/cpio"
)

// requireKernelPackage skips unless apt can fetch the VM kernel here.
func requireKernelPackage(t *testing.T) {
	t.Helper()
	for _, cmd := range []string{"apt-cache", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("%s is not on PATH: VM boot artifacts need Debian's apt tools", cmd)
		}
	}
	if _, _, err := kernelCandidate(context.Background(), KernelPackage); err != nil {
		t.Skipf("apt does not know %s (run apt-get update): %v", KernelPackage, err)
	}
}

func TestBoot(t *testing.T) {
	requireKernelPackage(t)
	b, err := NewBuilder(t.TempDir(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("#!/bin/sh\necho not really an agent\n"), 0o755)
	ctx := context.Background()
	boot, err := b.Boot(ctx, agent)
	if err != nil {
		t.Fatalf("Boot = %v", err)
	}
	if err := checkKernelFile(boot.Kernel); err != nil {
		t.Errorf("kernel %s: %v", boot.Kernel, err)
	}
	files := readInitramfs(t, boot.Initramfs)
	if got := string(files["init"]); got != "#!/bin/sh\necho not really an agent\n" {
		t.Errorf("/init = %q, want the agent", got)
	}
	list := strings.Fields(string(files["lib/modules/"+boot.Release+"/"+ModuleList]))
	if strings.Join(list, " ") != strings.Join(boot.Modules, " ") {
		t.Errorf("module list in the initramfs = %v, want %v", list, boot.Modules)
	}
	pos := map[string]int{}
	for i, m := range list {
		pos[strings.TrimSuffix(filepath.Base(m), ".ko")] = i
		if _, ok := files["lib/modules/"+boot.Release+"/"+m]; !ok {
			t.Errorf("module %s listed but not in the initramfs", m)
		}
	}
	// Dependencies load first.
	for _, dep := range [][2]string{{"virtio", "virtio_mmio"}, {"virtio_ring", "virtio"}, {"fuse", "virtiofs"}, {"vsock", "vmw_vsock_virtio_transport"}} {
		a, aok := pos[dep[0]]
		b, bok := pos[dep[1]]
		if !aok || !bok || a > b {
			t.Errorf("module order %v: want %s (at %d, %v) before %s (at %d, %v)", list, dep[0], a, aok, dep[1], b, bok)
		}
	}
	for _, m := range []string{"overlay", "virtio_blk", "virtio_console", "virtio_pci"} {
		if _, ok := pos[m]; !ok {
			t.Errorf("module %s missing from %v", m, list)
		}
	}

	// Unchanged: cached, no download.
	start := time.Now()
	again, err := b.Boot(ctx, agent)
	if err != nil || again.Initramfs != boot.Initramfs || again.Kernel != boot.Kernel {
		t.Errorf("second Boot = %+v, %v; want the cached %+v", again, err, boot)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cached Boot took %v", d)
	}
	// Another agent: another initramfs, the same kernel.
	os.WriteFile(agent, []byte("another"), 0o755)
	other, err := b.Boot(ctx, agent)
	if err != nil || other.Initramfs == boot.Initramfs || other.Kernel != boot.Kernel {
		t.Errorf("Boot with a changed agent = %+v, %v; want a new initramfs and the same kernel", other, err)
	}

	if _, err := b.Boot(ctx, filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "guest agent") {
		t.Errorf("Boot(missing agent) = %v, want an error naming the guest agent", err)
	}
}

func checkKernelFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return checkPVH(data)
}

func readInitramfs(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("initramfs %s: %v", path, err)
	}
	files := map[string][]byte{}
	r := cpio.NewReader(zr)
	for {
		hdr, err := r.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("initramfs %s: %v", path, err)
		}
		if hdr.Mode.IsRegular() {
			files[hdr.Name], _ = io.ReadAll(r)
		}
	}
}

func TestExtractVmlinuxBadInput(t *testing.T) {
	bz := func(payload []byte) []byte {
		b := make([]byte, 5*512)
		b[0x1f1] = 4
		copy(b[0x202:], "HdrS")
		binary.LittleEndian.PutUint16(b[0x206:], 0x20f)
		binary.LittleEndian.PutUint32(b[0x248:], 0)
		binary.LittleEndian.PutUint32(b[0x24c:], uint32(len(payload)))
		return append(b, payload...)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("\x7fELF but not really"))
	zw.Close()
	gz.Write([]byte{19, 0, 0, 0}) // the size trailer
	cases := []struct {
		name  string
		input []byte
		want  string
	}{
		{"empty", nil, "not a bzImage"},
		{"no header", make([]byte, 4096), "not a bzImage"},
		{"payload out of range", func() []byte { b := bz(nil); binary.LittleEndian.PutUint32(b[0x24c:], 1<<20); return b }(), "outside"},
		{"xz", bz([]byte{0xfd, '7', 'z', 'X', 'Z', 0, 1, 2, 3}), "xz"},
		{"unknown", bz([]byte("plain text payload")), "not a compression"},
		{"bad lz4", bz([]byte{0x02, 0x21, 0x4c, 0x18, 200, 0, 0, 0, 1, 2, 3, 4}), "lz4"},
		{"gzip, not ELF", bz(gz.Bytes()), "not an ELF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ExtractVmlinux(tc.input)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ExtractVmlinux = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestCheckPVHRefusesELFWithoutNote(t *testing.T) {
	// The test binary is an x86-64 ELF with notes, but not the PVH one.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(exe)
	if f, err := elf.NewFile(bytes.NewReader(data)); err != nil || f.Machine != elf.EM_X86_64 {
		t.Skipf("the test binary is not an x86-64 ELF (%v)", err)
	}
	if err := checkPVH(data); err == nil || !strings.Contains(err.Error(), "PVH") {
		t.Errorf("checkPVH(test binary) = %v, want a no-PVH-note error", err)
	}
}

func TestParseKernelDepends(t *testing.T) {
	rec := "Package: linux-image-cloud-amd64\nVersion: 6.1.192-2\nDepends: linux-image-6.1.0-56-cloud-amd64 (= 6.1.192-2)\n"
	pkg, ver, err := parseKernelDepends(KernelPackage, []byte(rec))
	if pkg != "linux-image-6.1.0-56-cloud-amd64" || ver != "6.1.192-2" || err != nil {
		t.Errorf("parseKernelDepends = %q, %q, %v", pkg, ver, err)
	}
	if _, _, err := parseKernelDepends(KernelPackage, []byte("Package: x\nDepends: libc6\n")); err == nil {
		t.Errorf("parseKernelDepends(no kernel dependency) = nil error")
	}
}

func TestModuleOrderMissingModule(t *testing.T) {
	_, err := moduleOrder(t.TempDir(), []string{"virtio_blk"})
	if err == nil || !strings.Contains(err.Error(), "virtio_blk") {
		t.Errorf("moduleOrder(empty dir) = %v, want an error naming virtio_blk", err)
	}
}

// TestPruneBoot keeps the artifacts in use and the two most recently used
// others of each kind, and removes the rest.
func TestPruneBoot(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	mk := func(name string, age time.Duration, isDir bool) string {
		p := filepath.Join(dir, name)
		if isDir {
			os.MkdirAll(filepath.Join(p, "modules"), 0o755)
		} else {
			os.WriteFile(p, []byte("x"), 0o644)
		}
		os.Chtimes(p, now.Add(-age), now.Add(-age))
		return p
	}
	current := mk("initramfs-1-aaa.cpio.gz", 90*24*time.Hour, false) // old, but in use
	kernel := mk("kernel-linux-image_1", 90*24*time.Hour, true)
	for i, age := range []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour, 4 * time.Hour} {
		mk(fmt.Sprintf("initramfs-1-%d.cpio.gz", i), age, false)
		mk(fmt.Sprintf("kernel-linux-image_0.%d", i), age, true)
	}
	mk(".lock", 90*24*time.Hour, false)
	pruneBoot(dir, current, kernel, now)
	var left []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{".lock", "initramfs-1-0.cpio.gz", "initramfs-1-1.cpio.gz", "initramfs-1-aaa.cpio.gz",
		"kernel-linux-image_0.0", "kernel-linux-image_0.1", "kernel-linux-image_1"}
	if !slices.Equal(left, want) {
		t.Errorf("after pruning: %v, want %v", left, want)
	}
	if st, _ := os.Stat(current); now.Sub(st.ModTime()) > time.Minute {
		t.Errorf("the initramfs in use was not marked used")
	}
}
