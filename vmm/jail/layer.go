package jail

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A layer is a machine's writable layer: the upper and work directories
// of its overlay root, on one filesystem as overlayfs requires.
//
// Both live in rw/ of the machine's state dir, which the jail hands the
// machine as one id-mapped mount. In an unlimited layer rw/ is a plain
// directory. A limited one lives in its own ext4 filesystem: a sparse image
// file, rw.img, loop-mounted at rw/, so the machine cannot write more
// than the image holds and the host never spends more than the image's
// size on it. The image is a copy of a template formatted once per size.
type layer struct {
	dir  string // the machine's state dir
	root string // dir/rw: holds upper/ and work/; a mount if limited
	img  string // dir/rw.img, or "" if unlimited
}

const (
	// overlayXattrs: overlayfs keeps its metadata (opaque dirs, redirects)
	// in user.overlay.* xattrs, the ones a machine's user namespace may
	// set; every overlay over a layer must be mounted with it.
	overlayXattrs = "userxattr"

	layerImage = "rw.img"
	layerMount = "rw"

	// minLayerLimit keeps ext4's fixed costs (a journal of at least 1024
	// blocks) from eating most of a layer.
	minLayerLimit = 16 << 20

	// templateVersion names the mkfs options below; change it with them
	// so images cached by an older version are not reused.
	templateVersion = "v1"
)

// mkfsArgs format a layer image. One inode per 4 KiB block (-i 4096)
// means inodes run out before space only if most files are empty or
// symlinks: trees of small files, which agents make, average 8 KiB per
// inode (node_modules) to 14 KiB (Python packages) measured on the
// development machine, so the default of one per 16 KiB would fail on
// them with free space left. It costs 6.25% of the image in inode
// tables. Zeroing the inode tables at mkfs (lazy_itable_init=0) punches
// holes in a file, so it is free and spares each machine the kernel's
// background zeroing, which would allocate them on the host; the journal
// is left unzeroed as a hole reads as zeros anyway. No blocks are
// reserved for root, and no resize_inode: layers never grow, and its
// reserved descriptor blocks would be copied to every machine.
var mkfsArgs = []string{"-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-i", "4096", "-m", "0",
	"-O", "^resize_inode", "-E", "lazy_itable_init=0,lazy_journal_init=1,root_owner=0:0"}

// newLayer makes the writable layer of the machine whose state dir is
// dir. With limit 0 it is unlimited; otherwise it holds at most limit
// bytes (rounded down to 4 KiB, at least 16 MiB) including ext4's own
// overhead, and its image is copied from a template cached in templates.
// It fails with fs.ErrExist if dir has a layer already, and otherwise
// leaves nothing behind on error.
func newLayer(dir string, limit int64, templates string) (*layer, error) {
	dir, err := filepath.Abs(dir) // the kernel reports a loop's backing file by absolute path
	if err != nil {
		return nil, fmt.Errorf("make layer: %w", err)
	}
	l := &layer{dir: dir, root: filepath.Join(dir, layerMount)}
	if limit < 0 || limit > 0 && limit < minLayerLimit {
		return nil, fmt.Errorf("layer limit %d: want 0 (unlimited) or at least %d", limit, minLayerLimit)
	}
	// Checked first: cleaning up after a failure would remove it.
	for _, p := range []string{l.Upper(), filepath.Join(dir, layerImage)} {
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("make layer in %s: %w", dir, fs.ErrExist)
		}
	}
	if limit > 0 {
		l.img = filepath.Join(dir, layerImage)
		if err := l.makeImage(limit&^4095, templates); err != nil {
			l.Remove()
			return nil, err
		}
	}
	if err := l.makeDirs(); err != nil {
		l.Remove()
		return nil, err
	}
	return l, nil
}

// openLayer returns the layer newLayer made in dir, after a daemon
// restart: a limited layer's image is mounted again unless it still is.
func openLayer(dir string) (*layer, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open layer: %w", err)
	}
	img := filepath.Join(dir, layerImage)
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		l := &layer{dir: dir, root: filepath.Join(dir, layerMount)}
		if _, err := os.Stat(l.Upper()); err != nil {
			return nil, fmt.Errorf("open layer: %w", err)
		}
		return l, l.makeDirs()
	} else if err != nil {
		return nil, fmt.Errorf("open layer: %w", err)
	}
	l := &layer{dir: dir, root: filepath.Join(dir, layerMount), img: img}
	if err := l.mount(); err != nil {
		return nil, err
	}
	return l, l.makeDirs()
}

// movedTo is the layer of a machine directory renamed to dir: its image
// and its mount move with the directory (a prepared jail's, claimed).
func (l *layer) movedTo(dir string) *layer {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	m := &layer{dir: dir, root: filepath.Join(dir, layerMount)}
	if l.img != "" {
		m.img = filepath.Join(dir, layerImage)
	}
	return m
}

// Upper is the overlay's upperdir.
func (l *layer) Upper() string { return filepath.Join(l.root, "upper") }

// Work is the overlay's workdir.
func (l *layer) Work() string { return filepath.Join(l.root, "work") }

// Usage reports the bytes in use and the most the layer can hold, as df
// in the machine would (ext4's own overhead is in neither). An unlimited
// layer reports used -1 (unknown: counting would mean walking the whole
// tree) and limit 0.
func (l *layer) Usage() (used, limit int64, err error) {
	if l.img == "" {
		return -1, 0, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(l.root, &st); err != nil {
		return 0, 0, fmt.Errorf("layer usage: %w", err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// Checkpoint copies the upper directory to dst, which must not exist,
// with everything overlayfs keeps there: whiteouts, opaque and redirect
// xattrs, owners, modes, times, hard links. The machine must be frozen
// or stopped. On error dst is removed.
func (l *layer) Checkpoint(dst string) error {
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("checkpoint layer to %s: %w", dst, fs.ErrExist)
	}
	if err := copyTree(l.Upper(), dst); err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("checkpoint layer: %w", err)
	}
	return nil
}

// Restore replaces the upper directory by a copy of checkpoint src and
// empties the work directory. The machine must be stopped (its overlay
// unmounted). If it fails, for instance because src does not fit the
// limit, the layer is left part restored: restore again or remove it.
func (l *layer) Restore(src string) error {
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("restore layer: %w", err)
	}
	for _, p := range []string{l.Upper(), l.Work()} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("restore layer: %w", err)
		}
	}
	if err := os.Mkdir(l.Work(), 0o755); err != nil {
		return fmt.Errorf("restore layer: %w", err)
	}
	if err := copyTree(src, l.Upper()); err != nil {
		return fmt.Errorf("restore layer: %w", err)
	}
	return nil
}

// Remove unmounts the layer and deletes its files, leaving dir itself.
// The loop device goes when the kernel releases the filesystem (see
// unmountLayer). Removing a removed layer does nothing.
func (l *layer) Remove() error {
	if l.img == "" {
		return os.RemoveAll(l.root)
	}
	if err := unmountLayer(l.root); err != nil {
		return err
	}
	return errors.Join(os.RemoveAll(l.root), os.RemoveAll(l.img))
}

func (l *layer) makeDirs() error {
	for _, p := range []string{l.root, l.Upper(), l.Work()} {
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("make layer: %w", err)
		}
	}
	return nil
}

// makeImage gives the layer its image, a copy of the template of its
// size, and mounts it.
func (l *layer) makeImage(size int64, templates string) error {
	tmpl, err := layerTemplate(templates, size)
	if err != nil {
		return err
	}
	if err := cloneFile(l.img, tmpl); err != nil {
		return fmt.Errorf("copy layer template: %w", err)
	}
	if err := os.Mkdir(l.root, 0o700); err != nil {
		return fmt.Errorf("make layer: %w", err)
	}
	return l.mount()
}

// mount mounts the image at root unless that is done: a mount from
// before a daemon restart is kept if it is this image's.
func (l *layer) mount() error {
	if err := os.MkdirAll(l.root, 0o700); err != nil {
		return fmt.Errorf("mount layer: %w", err)
	}
	backing, err := mountedImage(l.root)
	if err != nil {
		return fmt.Errorf("mount layer: %w", err)
	}
	if backing == "" {
		return mountImage(l.img, l.root)
	}
	if a, err := os.Stat(backing); err != nil || !sameFile(a, l.img) {
		return fmt.Errorf("mount layer: %s has %s mounted, not %s", l.root, backing, l.img)
	}
	return nil
}

var templateMu sync.Mutex // one mkfs at a time: machines of a new size wait for the first

// layerTemplate returns the path of a formatted image of size bytes in
// dir, making it the first time.
func layerTemplate(dir string, size int64) (string, error) {
	path := filepath.Join(dir, templateVersion+"-"+strconv.FormatInt(size, 10)+".ext4")
	templateMu.Lock()
	defer templateMu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("layer template: %w", err)
	}
	f, err := os.CreateTemp(dir, ".mkfs-*")
	if err != nil {
		return "", fmt.Errorf("layer template: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return "", fmt.Errorf("layer template: %w", err)
	}
	// upper/ and work/ made by mkfs: a first mkdir in a fresh mount
	// costs a machine most of a millisecond.
	content, err := os.MkdirTemp(dir, ".root-")
	if err != nil {
		return "", fmt.Errorf("layer template: %w", err)
	}
	defer os.RemoveAll(content)
	tl := &layer{root: content}
	if err := tl.makeDirs(); err != nil {
		return "", err
	}
	if err := os.Chmod(content, 0o755); err != nil {
		return "", fmt.Errorf("layer template: %w", err)
	}
	args := append(mkfsArgs[:len(mkfsArgs):len(mkfsArgs)], "-d", content, f.Name())
	if out, err := exec.Command("mkfs.ext4", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("layer template: mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	// Synced before it gets its name: every later machine copies it.
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("layer template: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", fmt.Errorf("layer template: %w", err)
	}
	return path, nil
}

// cloneFile makes dst, which must not exist, a copy of src: a reflink
// where the filesystem has them, else a copy of src's data extents only,
// so a sparse src gives a sparse dst.
func cloneFile(dst, src string) error {
	_, err := cloneFileShared(dst, src)
	return err
}

// cloneFileShared is cloneFile, reporting whether dst is a reflink.
func cloneFileShared(dst, src string) (reflinked bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	reflinked = unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil
	if !reflinked {
		err = copySparse(out, in)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
	}
	return reflinked, err
}

// copySparse copies in's data extents to the same offsets of out,
// leaving its holes holes.
func copySparse(out, in *os.File) error {
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := out.Truncate(st.Size()); err != nil {
		return err
	}
	for off := int64(0); off < st.Size(); {
		data, err := in.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		} else if err != nil {
			return err
		}
		hole, err := in.Seek(data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		// Both offsets at data: SEEK_HOLE moved in's.
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		// A LimitedReader of a file lets io.Copy use copy_file_range.
		if _, err := io.Copy(out, &io.LimitedReader{R: in, N: hole - data}); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// mountImage attaches img to a free loop device and mounts its ext4 at
// mnt. The device is set to detach itself when unmounted; discard makes
// space the machine frees a hole in img again, giving it back to the
// host.
func mountImage(img, mnt string) error {
	backing, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("mount layer: %w", err)
	}
	defer backing.Close()
	dev, err := attachLoop(backing)
	if err != nil {
		return fmt.Errorf("mount layer %s: %w", img, err)
	}
	// Our descriptor is the device's last opener if the mount fails: then
	// closing it detaches the device.
	defer dev.Close()
	if err := unix.Mount(dev.Name(), mnt, "ext4", 0, "discard"); err != nil {
		return fmt.Errorf("mount layer %s on %s: %w", img, mnt, err)
	}
	return nil
}

// attachLoop binds a free loop device to backing and returns it open.
// It bypasses the host's page cache (direct I/O) where it can, so the
// layer's data is cached once, in the layer's filesystem.
func attachLoop(backing *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: 4096,
		Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO}}
	copy(cfg.Info.File_name[:unix.LO_NAME_SIZE-1], backing.Name())
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EINVAL) && cfg.Info.Flags&unix.LO_FLAGS_DIRECT_IO != 0 {
			// The backing filesystem cannot do direct I/O (older kernels
			// refuse rather than fall back).
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		}
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("configure %s: %w", dev.Name(), err)
		}
		// Another process took it between GET_FREE and CONFIGURE.
	}
	return nil, errors.New("no free loop device after 16 tries")
}

// mountedImage returns the backing file of the loop device mounted at
// mnt, or "" if nothing is mounted there.
func mountedImage(mnt string) (string, error) {
	dev, mounted, err := mountDev(mnt)
	if err != nil || !mounted {
		return "", err
	}
	b, err := os.ReadFile(loopSysfs(dev) + "/backing_file")
	if err != nil {
		return "", fmt.Errorf("%s is mounted but not from a loop device: %w", mnt, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// mountDev returns the device of the filesystem at mnt and whether that
// is a mount of its own (a different device from its parent's).
func mountDev(mnt string) (dev uint64, mounted bool, err error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(mnt, &st); err != nil {
		return 0, false, err
	}
	if err := unix.Lstat(filepath.Dir(mnt), &parent); err != nil {
		return 0, false, err
	}
	return st.Dev, st.Dev != parent.Dev, nil
}

func sameFile(fi fs.FileInfo, path string) bool {
	fj, err := os.Stat(path)
	return err == nil && os.SameFile(fi, fj)
}

func loopSysfs(dev uint64) string {
	return fmt.Sprintf("/sys/dev/block/%d:%d/loop", unix.Major(dev), unix.Minor(dev))
}

// unmountLayer unmounts a layer's image from mnt; a busy mount is
// detached lazily instead. It does not wait for the loop device: that
// detaches itself (autoclear) once the kernel lets go of the
// filesystem, which is not up to this process. Every mount namespace
// made on the host while the layer was mounted holds a copy of its
// mount, private on hosts whose mounts are not shared (this one's), so
// an unmount here does not reach it: an image build's chroot, another
// test's `unshare -m`, any container runtime's. The copy keeps the
// filesystem, and so the loop device and the deleted image's blocks,
// until that namespace ends; a destroy that waited for it waited as long
// as that namespace lived (a minute, then failed, in CI).
func unmountLayer(mnt string) error {
	_, mounted, err := mountDev(mnt)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !mounted {
		return nil
	} else if err != nil {
		return fmt.Errorf("unmount layer: %w", err)
	}
	err = unix.Unmount(mnt, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmount layer %s: %w", mnt, err)
	}
	return nil
}

// mergeLayers makes dst, which must not exist, a copy of the root that
// an overlay of upper (a layer's upper directory) over lower shows:
// whiteouts delete, opaque directories hide what is below them,
// redirects are followed. Neither layer may be in use by a mounted
// overlay with an upperdir. dst has no overlay metadata left in it.
func mergeLayers(lower, upper, dst string) error {
	for _, p := range []string{lower, upper} {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("merge layers: overlay cannot take %q: it has one of , : \\", p)
		}
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("merge layers into %s: %w", dst, fs.ErrExist)
	}
	mnt, err := os.MkdirTemp("", "hearth-merge-")
	if err != nil {
		return fmt.Errorf("merge layers: %w", err)
	}
	defer os.Remove(mnt)
	// Two lower layers and no upper make a read-only overlay. It is
	// mounted by a child in a mount namespace of its own (Go makes its
	// mounts private), so nobody else sees it and it goes away with the
	// child even if we die first. Doing this on a thread of our own would
	// leave that thread's copy of every mount pinned if the runtime had
	// to keep the thread (it keeps the main one).
	cmd := exec.Command("sh", "-c", `mount -t overlay -o "$1" overlay "$2" && shift 2 && exec "$@"`, "merge",
		"ro,lowerdir="+upper+":"+lower+","+overlayXattrs, mnt)
	cmd.Args = append(cmd.Args, copyArgs(mnt, dst)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("merge layers: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyArgs is the command copyTree runs.
func copyArgs(src, dst string) []string {
	return []string{"cp", "--no-dereference", "--recursive", "--no-target-directory", "--reflink=auto",
		"--preserve=mode,ownership,timestamps,links,xattr", "--", src, dst}
}

// copyTree copies directory src to dst, which must not exist, as root:
// owners, modes, times, hard links, device nodes (overlay's whiteouts)
// and xattrs of every namespace (trusted.overlay.*), sharing extents
// where the filesystem can. Naming the attributes instead of
// --preserve=all makes cp fail, not warn, when an xattr cannot be set.
func copyTree(src, dst string) error {
	args := copyArgs(src, dst)
	cmd := exec.Command(args[0], args[1:]...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("copy %s to %s: %w: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}
