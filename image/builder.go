package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"
)

// Builder builds images from a catalog into a cache directory. Its methods
// are safe to call from several goroutines and several processes sharing
// the directory: they take turns.
type Builder struct {
	dir      string
	recipes  *Catalog
	progress io.Writer

	// Mirror, when set, is the Debian mirror debootstrap uses instead of
	// the one found in AptDir.
	Mirror string
	// AptDir is the host apt configuration searched for a mirror.
	AptDir string

	mu sync.Mutex

	// read keeps the manifests List parsed, by image directory: parsing
	// every image's manifest (tens of KiB each) on each List cost a
	// sandbox create ~6 ms. An entry serves while the manifest file is
	// the same one (stat identity); a rebuilt or replaced image has
	// another.
	readMu sync.Mutex
	read   map[string]cachedImage
}

// cachedImage is a parsed manifest and the identity of the file it came
// from.
type cachedImage struct {
	id  fileID
	img Image
}

// fileID tells a file's version apart: replaced (another inode) or
// rewritten in place (size, modification or change time).
type fileID struct {
	dev, ino, size   uint64
	mtimeNs, ctimeNs int64
}

// Image is a built image in the cache.
type Image struct {
	// Dir holds rootfs/, rootfs.ext4 and manifest.json.
	Dir string
	Manifest
}

// Rootfs is the image's root directory, for jails.
func (i Image) Rootfs() string { return filepath.Join(i.Dir, "rootfs") }

// Ext4 is the image as an ext4 filesystem file, for VMs.
func (i Image) Ext4() string { return filepath.Join(i.Dir, "rootfs.ext4") }

// Manifest records what went into an image; it is manifest.json.
type Manifest struct {
	Name       string    `json:"name"`
	Hash       string    `json:"hash"`
	Parent     string    `json:"parent,omitempty"`
	ParentHash string    `json:"parent_hash,omitempty"`
	Suite      string    `json:"suite"`
	Mirror     string    `json:"mirror"`
	Built      time.Time `json:"built"`
	// BuildSeconds is how long this image's own steps took, parents
	// excluded.
	BuildSeconds float64 `json:"build_seconds"`
	// User is the default user, inherited from the nearest recipe with one.
	User *User `json:"user,omitempty"`
	// CLI is the agent CLI the image runs, inherited from the nearest
	// recipe that names one.
	CLI string `json:"cli,omitempty"`
	// Env is what /etc/environment sets, parents' values included.
	Env    map[string]string `json:"env,omitempty"`
	Debian []Package         `json:"debian_packages"`
	Npm    []Package         `json:"npm_packages"`
	// Size is the bytes the root directory takes, in 4 KiB blocks.
	Size int64 `json:"size"`
	// Ext4Size is the size of rootfs.ext4.
	Ext4Size int64 `json:"ext4_size"`
	// SavedFrom says what a saved image was made from (a machine), for
	// images that have no recipe.
	SavedFrom string `json:"saved_from,omitempty"`
}

// Package is an installed package and its version.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// NewBuilder returns a builder caching images in dir, which it creates.
// Progress lines go to progress (nil discards them).
func NewBuilder(dir string, recipes *Catalog, progress io.Writer) (*Builder, error) {
	if progress == nil {
		progress = io.Discard
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image cache %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache %s: %w", dir, err)
	}
	return &Builder{dir: dir, recipes: recipes, progress: progress, AptDir: "/etc/apt"}, nil
}

// Build returns the named recipe's image, building it and any parent that
// is not cached yet. Nothing is left in the cache if it fails; the error is
// a *StepError when a build step failed.
func (b *Builder) Build(ctx context.Context, name string) (Image, error) {
	unlock, err := b.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	if err := b.removeStale(); err != nil {
		return Image{}, err
	}
	return b.build(ctx, name)
}

func (b *Builder) build(ctx context.Context, name string) (Image, error) {
	r, err := b.recipes.Get(name)
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w", name, err)
	}
	hash, err := b.recipes.Hash(name)
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w", name, err)
	}
	dir := b.imageDir(name, hash)
	if img, err := readImage(dir); err == nil {
		fmt.Fprintf(b.progress, "image %s: cached %s\n", name, filepath.Base(dir))
		return img, nil
	}
	var parent Image
	if r.Parent != "" {
		// The parent's error already names the parent and its step.
		if parent, err = b.build(ctx, r.Parent); err != nil {
			return Image{}, err
		}
	}
	return b.buildNew(ctx, r, hash, parent)
}

func (b *Builder) imageDir(name, hash string) string {
	return filepath.Join(b.dir, name+"-"+hash[:12])
}

// dirImageName is the image name an image directory's name gives
// (imageDir), false if it is not one of those.
func dirImageName(dir string) (string, bool) {
	name, hash, ok := cutLast(dir, "-")
	if !ok || name == "" || len(hash) != 12 || strings.Trim(hash, "0123456789abcdef") != "" {
		return "", false
	}
	return name, true
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// buildNew builds recipe r's image.
func (b *Builder) buildNew(ctx context.Context, r *Recipe, hash string, parent Image) (Image, error) {
	return b.make(ctx, r, hash, parent, func(bd *build) []step { return bd.steps() })
}

// make runs the steps in a temporary directory and renames it into place
// only when all of them succeeded.
func (b *Builder) make(ctx context.Context, r *Recipe, hash string, parent Image, steps func(*build) []step) (Image, error) {
	dir := b.imageDir(r.Name, hash)
	if err := removeTree(dir); err != nil { // a leftover without a manifest
		return Image{}, fmt.Errorf("build image %s: %w", r.Name, err)
	}
	tmp, err := os.MkdirTemp(b.dir, tmpPrefix+r.Name+"-")
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w", r.Name, err)
	}
	bd, err := b.newBuild(r, hash, parent, tmp)
	if err == nil {
		err = bd.run(ctx, steps(bd))
		bd.log.Close()
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		if rerr := removeTree(tmp); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return Image{}, wrapBuildErr(r.Name, err)
	}
	took := time.Duration(bd.man.BuildSeconds * float64(time.Second)).Round(100 * time.Millisecond)
	fmt.Fprintf(b.progress, "image %s: built %s in %s (rootfs %s, ext4 %s)\n", r.Name, filepath.Base(dir), took,
		humanize.IBytes(uint64(bd.man.Size)), humanize.IBytes(uint64(bd.man.Ext4Size)))
	return readImage(dir)
}

func wrapBuildErr(name string, err error) error {
	var se *StepError
	if errors.As(err, &se) {
		return err
	}
	return fmt.Errorf("build image %s: %w", name, err)
}

// StepError says which build step failed.
type StepError struct {
	Image string
	Step  string
	Err   error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("build image %s: step %q: %v", e.Image, e.Step, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// tmpPrefix marks build directories; any found while holding the lock
// belong to a build that crashed.
const tmpPrefix = ".build-"

func (b *Builder) removeStale() error {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return fmt.Errorf("image cache %s: %w", b.dir, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := removeTree(filepath.Join(b.dir, e.Name())); err != nil {
				return fmt.Errorf("image cache %s: %w", b.dir, err)
			}
		}
	}
	return nil
}

// lock serialises builders in this process and in others sharing the dir.
func (b *Builder) lock() (func(), error) {
	b.mu.Lock()
	f, err := os.OpenFile(filepath.Join(b.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		b.mu.Unlock()
		return nil, fmt.Errorf("image cache %s: lock: %w", b.dir, err)
	}
	return func() { f.Close(); b.mu.Unlock() }, nil
}

func readImage(dir string) (Image, error) {
	img, _, err := readImageID(dir)
	return img, err
}

// readImageID is readImage, also returning the identity of the manifest
// it read.
func readImageID(dir string) (Image, fileID, error) {
	f, err := os.Open(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return Image{}, fileID{}, err
	}
	defer f.Close()
	id, err := statID(f)
	if err != nil {
		return Image{}, id, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return Image{}, id, err
	}
	img, err := parseImage(dir, data)
	return img, id, err
}

func statID(f *os.File) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fileID{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: uint64(st.Size), mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano()}, nil
}

// cachedRead returns the image in dir, parsing its manifest only when it
// is not the one parsed last time. The image is the cached one, shared:
// clone it before it leaves the Builder.
func (b *Builder) cachedRead(dir string) (Image, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "manifest.json"), &st); err != nil {
		return Image{}, err
	}
	id := fileID{dev: st.Dev, ino: st.Ino, size: uint64(st.Size), mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano()}
	b.readMu.Lock()
	c, ok := b.read[dir]
	b.readMu.Unlock()
	if ok && c.id == id {
		return c.img, nil
	}
	img, id, err := readImageID(dir)
	if err != nil {
		return img, err
	}
	b.readMu.Lock()
	if b.read == nil {
		b.read = map[string]cachedImage{}
	}
	b.read[dir] = cachedImage{id: id, img: img.clone()}
	b.readMu.Unlock()
	return img, nil
}

// clone copies what callers could change in place, so that none changes
// the cached one.
func (i Image) clone() Image {
	if i.User != nil {
		u := *i.User
		i.User = &u
	}
	i.Env = maps.Clone(i.Env)
	i.Debian, i.Npm = slices.Clone(i.Debian), slices.Clone(i.Npm)
	return i
}

func parseImage(dir string, data []byte) (Image, error) {
	img := Image{Dir: dir}
	if err := json.Unmarshal(data, &img.Manifest); err != nil {
		return Image{}, fmt.Errorf("%s: %w", filepath.Join(dir, "manifest.json"), err)
	}
	return img, nil
}

// forget drops the cached manifests of image directories no longer in
// the cache (ents: its entries now).
func (b *Builder) forget(ents []os.DirEntry) {
	b.readMu.Lock()
	defer b.readMu.Unlock()
	if len(b.read) <= len(ents) {
		return
	}
	here := make(map[string]bool, len(ents))
	for _, e := range ents {
		here[filepath.Join(b.dir, e.Name())] = true
	}
	for dir := range b.read {
		if !here[dir] {
			delete(b.read, dir)
		}
	}
}

// List returns the built images, sorted by name then newest first.
func (b *Builder) List() ([]Image, error) {
	all, err := b.scan("")
	for i := range all {
		all[i] = all[i].clone()
	}
	return all, err
}

// scan is List with the cached images themselves, not copies: only what
// a caller returns is cloned (an image's package lists are long). With
// a name, only that image's versions are read and returned: the
// directories named for another image (imageDir) are passed over.
func (b *Builder) scan(name string) ([]Image, error) {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("image cache %s: %w", b.dir, err)
	}
	var out []Image
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if n, ok := dirImageName(e.Name()); name != "" && ok && n != name {
			continue
		}
		if img, err := b.cachedRead(filepath.Join(b.dir, e.Name())); err == nil && (name == "" || img.Name == name) {
			out = append(out, img)
		}
	}
	if name == "" {
		b.forget(ents)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Built.After(out[j].Built)
	})
	return out, nil
}

// Get returns the built image machines of that name run: the one
// matching the current recipe if built, else the newest (a saved image
// has no recipe). The error wraps ErrNotFound when none is built.
func (b *Builder) Get(name string) (Image, error) {
	imgs, err := b.images(name)
	if err != nil {
		return Image{}, err
	}
	if hash, err := b.recipes.Hash(name); err == nil {
		for _, img := range imgs {
			if img.Hash == hash {
				return img.clone(), nil
			}
		}
	}
	return imgs[0].clone(), nil
}

// Inspect returns the manifest of the image Get returns.
func (b *Builder) Inspect(name string) (Manifest, error) {
	img, err := b.Get(name)
	return img.Manifest, err
}

// Remove deletes every built version of the named image. Children keep
// working: each image has its own copy of the root directory. The error
// wraps ErrNotFound when none is built.
func (b *Builder) Remove(name string) error {
	unlock, err := b.lock()
	if err != nil {
		return err
	}
	defer unlock()
	imgs, err := b.images(name)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if err := removeTree(img.Dir); err != nil {
			return fmt.Errorf("remove image %s: %w", name, err)
		}
	}
	return nil
}

// images lists the built versions of name, newest first: the cached
// images, see scan.
func (b *Builder) images(name string) ([]Image, error) {
	out, err := b.scan(name)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("image %s: %w", name, ErrNotFound)
	}
	return out, nil
}
