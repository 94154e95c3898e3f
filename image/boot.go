package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"hearth/internal/atomicfile"
)

// KernelPackage is the Debian package whose kernel VMs boot: a metapackage
// that depends on the current versioned image package.
const KernelPackage = "linux-image-cloud-amd64"

// ModuleList is where, in an initramfs made by Boot, the modules to load
// are listed in load order (dependencies first), relative to
// /lib/modules/<kernel release>/, one per line. The guest agent reads it.
const ModuleList = "hearth.modules"

// vmModules are the modules a VM needs that Debian's cloud kernel builds
// as modules: virtio transports and devices, virtio-fs, vsock over virtio
// and overlayfs. Their dependencies are added from the modules themselves.
var vmModules = []string{
	"virtio_mmio", "virtio_pci", "virtio_blk", "virtio_console",
	"fuse", "virtiofs", "vmw_vsock_virtio_transport", "overlay",
}

// Boot is what a VM boots besides its root disk.
type Boot struct {
	// Kernel is an uncompressed ELF vmlinux with a PVH entry note, for
	// direct boot (qemu -kernel, cloud-hypervisor --kernel).
	Kernel string `json:"kernel"`
	// Initramfs is a gzip'd newc cpio: /init is the guest agent, and the
	// kernel modules a VM needs are under /lib/modules/<Release>/, listed
	// in load order in ModuleList there.
	Initramfs string `json:"initramfs"`
	// Release is the kernel's release (uname -r), e.g. 6.1.0-56-cloud-amd64.
	Release string `json:"release"`
	// Package and Version name the Debian package the kernel came from.
	Package string `json:"package"`
	Version string `json:"version"`
	// Modules are the modules in the initramfs, in load order.
	Modules []string `json:"modules"`
}

// Boot returns the kernel and an initramfs whose /init is agent (a static
// hearth-guest binary) for booting VMs, making them if they are not cached.
//
// The kernel comes from the candidate version of Debian's
// linux-image-cloud-amd64 in the host's apt lists: apt-get download fetches
// the package into a temporary directory and dpkg-deb unpacks it there (it
// is never installed on the host); the vmlinux is extracted from its
// bzImage. Results are cached under the builder's directory in boot/,
// keyed by the kernel package's version and, for the initramfs, the
// agent's content hash, so a call with nothing changed costs a hash of
// the agent and an apt-cache query.
//
// Boot needs apt-cache, apt-get and dpkg-deb, and apt lists that know the
// package (apt-get update). Calls from several goroutines or processes
// sharing the directory take turns.
func (b *Builder) Boot(ctx context.Context, agent string) (Boot, error) {
	sum, err := fileHash(agent)
	if err != nil {
		return Boot{}, fmt.Errorf("boot artifacts: guest agent: %w", err)
	}
	pkg, version, err := kernelCandidate(ctx, KernelPackage)
	if err != nil {
		return Boot{}, fmt.Errorf("boot artifacts: %w", err)
	}
	dir := filepath.Join(b.dir, "boot")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Boot{}, fmt.Errorf("boot artifacts: %w", err)
	}
	unlock, err := flock(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return Boot{}, fmt.Errorf("boot artifacts: %w", err)
	}
	defer unlock()
	k, err := b.kernel(ctx, dir, pkg, version)
	if err != nil {
		return Boot{}, fmt.Errorf("boot artifacts: kernel %s %s: %w", pkg, version, err)
	}
	out := filepath.Join(dir, fmt.Sprintf("initramfs-%s-%s.cpio.gz", safeName(version), sum[:12]))
	if _, err := os.Stat(out); err != nil {
		fmt.Fprintf(b.progress, "boot: initramfs for kernel %s with agent %s\n", k.Release, sum[:12])
		if err := writeInitramfs(out, agent, k); err != nil {
			return Boot{}, fmt.Errorf("boot artifacts: initramfs: %w", err)
		}
	}
	k.Initramfs = out
	pruneBoot(dir, out, filepath.Dir(k.Kernel), time.Now())
	return k, nil
}

// keepBoot is how many initramfs files and kernel directories besides
// the ones in use are kept, the most recently used: an initramfs per guest
// agent build (3 MB) and a kernel per package version (50 MB) would
// otherwise pile up. A daemon that still boots VMs from older ones (after
// more builds than that in the same directory) finds them gone.
const keepBoot = 2

// pruneBoot marks the initramfs and the kernel directory in use as used
// now and removes all but the keepBoot most recently used others of each.
func pruneBoot(dir, initramfs, kernelDir string, now time.Time) {
	os.Chtimes(initramfs, now, now)
	os.Chtimes(kernelDir, now, now)
	type entry struct {
		path string
		used time.Time
	}
	var inits, kernels []entry
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if err != nil || p == initramfs || p == kernelDir {
			continue
		}
		switch {
		case strings.HasPrefix(e.Name(), "initramfs-") && strings.HasSuffix(e.Name(), ".cpio.gz"):
			inits = append(inits, entry{p, info.ModTime()})
		case strings.HasPrefix(e.Name(), "kernel-") && e.IsDir():
			kernels = append(kernels, entry{p, info.ModTime()})
		}
	}
	for _, list := range [][]entry{inits, kernels} {
		slices.SortFunc(list, func(a, b entry) int { return b.used.Compare(a.used) })
		for _, e := range list[min(keepBoot, len(list)):] {
			os.RemoveAll(e.path)
		}
	}
}

// kernel returns the cached unpacked kernel of pkg at version (vmlinux and
// the modules a VM needs, with Initramfs empty), fetching it if needed.
func (b *Builder) kernel(ctx context.Context, dir, pkg, version string) (Boot, error) {
	kdir := filepath.Join(dir, "kernel-"+safeName(pkg+"_"+version))
	var k Boot
	if data, err := os.ReadFile(filepath.Join(kdir, "kernel.json")); err == nil {
		if err := json.Unmarshal(data, &k); err != nil {
			return Boot{}, fmt.Errorf("%s: %w", filepath.Join(kdir, "kernel.json"), err)
		}
		k.Kernel = filepath.Join(kdir, "vmlinux") // the cache may have moved
		return k, nil
	}
	fmt.Fprintf(b.progress, "boot: fetching %s %s\n", pkg, version)
	tmp, err := os.MkdirTemp(dir, ".kernel-")
	if err != nil {
		return Boot{}, err
	}
	defer os.RemoveAll(tmp)
	k, err = unpackKernel(ctx, tmp, pkg, version)
	if err != nil {
		return Boot{}, err
	}
	os.RemoveAll(kdir) // a partial one from a crash
	if err := os.Rename(filepath.Join(tmp, "out"), kdir); err != nil {
		return Boot{}, err
	}
	k.Kernel = filepath.Join(kdir, "vmlinux")
	data, _ := json.MarshalIndent(k, "", "  ")
	return k, os.WriteFile(filepath.Join(kdir, "kernel.json"), data, 0o600)
}

// unpackKernel downloads and unpacks pkg into tmp and fills tmp/out with
// vmlinux and modules/ (the VM's modules, paths relative to the release's
// module directory).
func unpackKernel(ctx context.Context, tmp, pkg, version string) (Boot, error) {
	dl := command(ctx, "apt-get", "download", pkg+"="+version)
	dl.Dir = tmp
	if out, err := dl.CombinedOutput(); err != nil {
		return Boot{}, fmt.Errorf("apt-get download: %w: %s", err, lastLines(out, 5))
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return Boot{}, fmt.Errorf("apt-get download left %d .deb files in %s, want 1", len(debs), tmp)
	}
	root := filepath.Join(tmp, "root")
	if out, err := command(ctx, "dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		return Boot{}, fmt.Errorf("dpkg-deb -x: %w: %s", err, lastLines(out, 5))
	}
	images, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return Boot{}, fmt.Errorf("package has %d boot/vmlinuz-* files, want 1", len(images))
	}
	release := strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")
	out := filepath.Join(tmp, "out")
	if err := os.MkdirAll(filepath.Join(out, "modules"), 0o755); err != nil {
		return Boot{}, err
	}
	bz, err := os.ReadFile(images[0])
	if err != nil {
		return Boot{}, err
	}
	elf, err := ExtractVmlinux(bz)
	if err != nil {
		return Boot{}, fmt.Errorf("%s: %w", filepath.Base(images[0]), err)
	}
	if err := os.WriteFile(filepath.Join(out, "vmlinux"), elf, 0o644); err != nil {
		return Boot{}, err
	}
	mods, err := moduleOrder(filepath.Join(root, "lib/modules", release), vmModules)
	if err != nil {
		return Boot{}, err
	}
	for _, m := range mods {
		if err := copyFile(filepath.Join(root, "lib/modules", release, m), filepath.Join(out, "modules", m)); err != nil {
			return Boot{}, err
		}
	}
	return Boot{Release: release, Package: pkg, Version: version, Modules: mods}, nil
}

// kernelCandidate asks apt which versioned kernel package meta (a
// metapackage) would install, and at what version.
func kernelCandidate(ctx context.Context, meta string) (pkg, version string, err error) {
	out, err := command(ctx, "apt-cache", "show", "--no-all-versions", meta).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, lastLines(ee.Stderr, 3))
		}
		return "", "", fmt.Errorf("apt-cache show %s: %w (is it in the apt lists? run apt-get update)", meta, err)
	}
	return parseKernelDepends(meta, out)
}

var kernelDep = regexp.MustCompile(`(linux-image-[0-9][^ ,]*) \(= ([^)]+)\)`)

// parseKernelDepends finds the versioned image package in the Depends of
// the metapackage's apt-cache record.
func parseKernelDepends(meta string, record []byte) (pkg, version string, err error) {
	for _, line := range strings.Split(string(record), "\n") {
		deps, ok := strings.CutPrefix(line, "Depends: ")
		if !ok {
			continue
		}
		if m := kernelDep.FindStringSubmatch(deps); m != nil {
			return m[1], m[2], nil
		}
	}
	return "", "", fmt.Errorf("apt-cache show %s: no Depends on a versioned linux-image package", meta)
}

// writeInitramfs writes the gzip'd newc cpio of k's modules with agent as
// /init to out, atomically.
func writeInitramfs(out, agent string, k Boot) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	a := newArchive(zw)
	for _, d := range []string{"dev", "proc", "sys", "tmp", "newroot", "lib", "lib/modules", "lib/modules/" + k.Release} {
		a.dir(d)
	}
	a.file("init", 0o755, agent)
	modDir := filepath.Join(filepath.Dir(k.Kernel), "modules")
	base := "lib/modules/" + k.Release + "/"
	for _, m := range k.Modules {
		a.parents(base + m)
		a.file(base+m, 0o644, filepath.Join(modDir, m))
	}
	a.data(base+ModuleList, 0o644, []byte(strings.Join(k.Modules, "\n")+"\n"))
	if err := a.close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return atomicfile.WriteFile(out, buf.Bytes(), 0o644)
}

func fileHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// safeName keeps a Debian version usable in a file name (an epoch's ':').
func safeName(s string) string { return strings.ReplaceAll(s, ":", "%3a") }

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// flock takes an exclusive lock on path, for processes sharing a cache.
func flock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Polled rather than blocking, so that ctx (Ctrl-C while another
	// process builds the kernel) ends the wait.
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: held by another process: %w", path, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
