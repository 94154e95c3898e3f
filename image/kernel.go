package image

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cavaliergopher/cpio"
	"github.com/pierrec/lz4/v4"
)

// ExtractVmlinux returns the ELF vmlinux inside bzImage, the x86 boot
// image format of Linux (arch/x86/boot/header.S), checking that it has the
// PVH entry note direct boot needs. Payloads compressed with LZ4 (what
// Debian's kernels use) or gzip are understood; others get an error
// naming the compression.
func ExtractVmlinux(bzImage []byte) ([]byte, error) {
	payload, err := bzPayload(bzImage)
	if err != nil {
		return nil, err
	}
	var vmlinux []byte
	switch {
	case bytes.HasPrefix(payload, []byte{0x02, 0x21, 0x4c, 0x18}):
		vmlinux, err = unlz4Legacy(payload)
	case bytes.HasPrefix(payload, []byte{0x1f, 0x8b}):
		vmlinux, err = gunzip(payload)
	case bytes.HasPrefix(payload, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		err = errors.New("payload is xz-compressed; only LZ4 and gzip are supported")
	case bytes.HasPrefix(payload, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		err = errors.New("payload is zstd-compressed; only LZ4 and gzip are supported")
	default:
		err = fmt.Errorf("payload starts with % x: not a compression this code knows (LZ4, gzip)", payload[:min(len(payload), 6)])
	}
	if err != nil {
		return nil, fmt.Errorf("extract vmlinux: %w", err)
	}
	if err := checkPVH(vmlinux); err != nil {
		return nil, fmt.Errorf("extract vmlinux: %w", err)
	}
	return vmlinux, nil
}

// bzPayload returns the compressed kernel in a bzImage, found through the
// setup header's payload_offset and payload_length (boot protocol 2.08+).
func bzPayload(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage: no HdrS setup header")
	}
	if v := binary.LittleEndian.Uint16(bz[0x206:]); v < 0x208 {
		return nil, fmt.Errorf("bzImage boot protocol %#x has no payload fields (want 2.08 or later)", v)
	}
	setup := int(bz[0x1f1])
	if setup == 0 {
		setup = 4
	}
	start := (setup + 1) * 512
	off := int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if start+off+n > len(bz) || n < 8 {
		return nil, fmt.Errorf("bzImage payload (offset %d, length %d) lies outside its %d bytes", start+off, n, len(bz))
	}
	return bz[start+off : start+off+n], nil
}

// unlz4Legacy decompresses the kernel's LZ4 payload: the legacy LZ4 frame
// (magic, then blocks each preceded by its compressed length, each
// decompressing to at most 8 MiB) followed by the uncompressed size as
// 4 little-endian bytes, which the kernel's build appends.
func unlz4Legacy(p []byte) ([]byte, error) {
	want := int(binary.LittleEndian.Uint32(p[len(p)-4:]))
	p = p[4 : len(p)-4]
	out := make([]byte, 0, want)
	block := make([]byte, 8<<20)
	for len(p) >= 4 {
		n := int(binary.LittleEndian.Uint32(p))
		p = p[4:]
		if n > len(p) {
			return nil, fmt.Errorf("lz4 block of %d bytes runs past the payload's end (%d left)", n, len(p))
		}
		m, err := lz4.UncompressBlock(p[:n], block)
		if err != nil {
			return nil, fmt.Errorf("lz4 block at output offset %d: %w", len(out), err)
		}
		out = append(out, block[:m]...)
		p = p[n:]
	}
	if len(out) != want {
		return nil, fmt.Errorf("lz4 payload gave %d bytes, its trailer says %d", len(out), want)
	}
	return out, nil
}

func gunzip(p []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(p))
	if err != nil {
		return nil, err
	}
	zr.Multistream(false) // the kernel's size trailer follows the stream
	return io.ReadAll(zr)
}

// checkPVH checks that vmlinux is an x86-64 ELF with the Xen
// PHYS32_ENTRY note (type 18), the entry point PVH direct boot uses.
func checkPVH(vmlinux []byte) error {
	f, err := elf.NewFile(bytes.NewReader(vmlinux))
	if err != nil {
		return fmt.Errorf("result is not an ELF file: %w", err)
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("result is an ELF for %v, want x86-64", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(p.Open())
		if err != nil {
			return fmt.Errorf("read ELF notes: %w", err)
		}
		if hasNote(notes, "Xen", 18) {
			return nil
		}
	}
	return errors.New("vmlinux has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): the kernel was built without CONFIG_PVH and cannot be direct-booted")
}

// hasNote reports whether an ELF note segment holds a note of name and typ.
func hasNote(b []byte, name string, typ uint32) bool {
	align4 := func(n uint32) int { return int((n + 3) &^ 3) }
	for len(b) >= 12 {
		nsz, dsz, t := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:])
		b = b[12:]
		if align4(nsz)+align4(dsz) > len(b) {
			return false
		}
		if t == typ && strings.TrimRight(string(b[:nsz]), "\x00") == name {
			return true
		}
		b = b[align4(nsz)+align4(dsz):]
	}
	return false
}

// moduleOrder returns the files (relative to dir, a release's module
// directory) of the named modules and everything they depend on,
// dependencies first. Dependencies are read from each module's .modinfo
// section, so no modules.dep (which depmod writes on install) is needed.
func moduleOrder(dir string, names []string) ([]string, error) {
	files := map[string]string{} // module name -> path relative to dir
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if strings.HasSuffix(name, ".ko.xz") || strings.HasSuffix(name, ".ko.zst") || strings.HasSuffix(name, ".ko.gz") {
			return fmt.Errorf("module %s is compressed; this kernel package's modules are not supported (want uncompressed .ko)", name)
		}
		if mod, ok := strings.CutSuffix(name, ".ko"); ok {
			rel, _ := filepath.Rel(dir, path)
			files[strings.ReplaceAll(mod, "-", "_")] = rel
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("modules in %s: %w", dir, err)
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("module %s: dependency cycle through %s", name, from)
		case 2:
			return nil
		}
		rel, ok := files[name]
		if !ok {
			return fmt.Errorf("module %s (needed by %s) is not in %s; was it built in?", name, from, dir)
		}
		state[name] = 1
		deps, err := moduleDepends(filepath.Join(dir, rel))
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, rel)
		return nil
	}
	for _, n := range names {
		if err := visit(n, "a VM"); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleDepends reads the depends= entry of a module's .modinfo section.
func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", path, err)
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("module %s has no .modinfo section", path)
	}
	data, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: .modinfo: %w", path, err)
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
			sort.Strings(deps)
			return deps, nil
		}
	}
	return nil, nil
}

// archive writes a newc cpio, the format the kernel unpacks an initramfs
// from, with the first error kept for close.
type archive struct {
	w    *cpio.Writer
	dirs map[string]bool
	ino  int64
	err  error
}

func newArchive(w io.Writer) *archive {
	return &archive{w: cpio.NewWriter(w), dirs: map[string]bool{}}
}

func (a *archive) add(name string, mode cpio.FileMode, data []byte) {
	if a.err != nil {
		return
	}
	a.ino++
	hdr := &cpio.Header{Name: name, Mode: mode, Size: int64(len(data)), Links: 1, Inode: a.ino}
	if mode.IsDir() {
		hdr.Links = 2
	}
	if a.err = a.w.WriteHeader(hdr); a.err == nil && len(data) > 0 {
		_, a.err = a.w.Write(data)
	}
}

func (a *archive) dir(name string) {
	if !a.dirs[name] {
		a.dirs[name] = true
		a.add(name, cpio.TypeDir|0o755, nil)
	}
}

// parents adds the directories above name not yet in the archive.
func (a *archive) parents(name string) {
	var todo []string
	for d := filepath.Dir(name); d != "." && !a.dirs[d]; d = filepath.Dir(d) {
		todo = append(todo, d)
	}
	for i := len(todo) - 1; i >= 0; i-- {
		a.dir(todo[i])
	}
}

func (a *archive) data(name string, perm cpio.FileMode, data []byte) {
	a.add(name, cpio.TypeReg|perm, data)
}

func (a *archive) file(name string, perm cpio.FileMode, src string) {
	data, err := os.ReadFile(src)
	if err != nil {
		if a.err == nil {
			a.err = err
		}
		return
	}
	a.data(name, perm, data)
}

func (a *archive) close() error {
	if a.err != nil {
		return a.err
	}
	return a.w.Close()
}
