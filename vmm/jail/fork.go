package jail

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"hearth/vmm"
)

// Forking a machine: its writable layer is captured while it is frozen
// (a limited layer's image file, cloned or copied sparse; an unlimited
// layer's upper directory, copied with reflinks where the filesystem has
// them) and new machines start with a copy of that capture as their
// layer. Processes are not carried over: a jail has no way to copy them;
// nor is /tmp, a tmpfs of the machine's own.

var _ vmm.Forker = (*machine)(nil)

// CaptureLayer copies the writable layer to dst while the machine is
// frozen; a paused machine stays paused.
func (m *machine) CaptureLayer(ctx context.Context, dst string) (reflinked bool, err error) {
	if _, err := os.Lstat(dst); err == nil {
		return false, fmt.Errorf("capture layer of machine %s to %s: %w", m.id, dst, fs.ErrExist)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.layer == nil {
		return false, fmt.Errorf("capture layer of machine %s: %w", m.id, vmm.ErrNotFound)
	}
	start := time.Now()
	err = m.frozen(func() error {
		reflinked, err = m.layer.capture(dst)
		return err
	})
	if err != nil {
		os.RemoveAll(dst)
		return false, fmt.Errorf("capture layer of machine %s: %w", m.id, err)
	}
	m.d.record(m.id, "capture", fmt.Sprintf("%s in %v (reflinked %t)", dst, time.Since(start).Round(time.Microsecond), reflinked))
	return reflinked, nil
}

// capture copies the layer to dst; its machine must be frozen. A limited
// layer's filesystem is synced first, so that its image holds every
// write (what is left in its journal, a copy replays when mounted).
func (l *layer) capture(dst string) (reflinked bool, err error) {
	if l.img == "" {
		if err := copyTree(l.Upper(), dst); err != nil {
			return false, err
		}
		return vmm.CanReflink(filepath.Dir(dst)) && sameDevice(l.root, filepath.Dir(dst)), nil
	}
	root, err := os.Open(l.root)
	if err != nil {
		return false, err
	}
	err = unix.Syncfs(int(root.Fd()))
	root.Close()
	if err != nil {
		return false, fmt.Errorf("sync layer: %w", err)
	}
	return cloneFileShared(dst, l.img)
}

// makeLayer gives a new machine its writable layer: an empty one, or a
// copy of the captured layer spec.Layer.
func (d *Driver) makeLayer(dir string, spec vmm.Spec) (*layer, error) {
	if spec.Layer == "" {
		return newLayer(dir, spec.Disk, d.templates())
	}
	l, err := seedLayer(dir, spec.Disk, spec.Layer, spec.TakeLayer)
	if err != nil {
		if l != nil {
			l.Remove()
		}
		return nil, fmt.Errorf("copy captured layer %s: %w", spec.Layer, err)
	}
	return l, nil
}

// errLayerKind is a captured layer that does not fit the new machine's
// disk limit (an image of another size, or a tree for a limited layer).
var errLayerKind = errors.New("captured layer does not match the disk limit: a fork must have its source's limit")

// seedLayer makes the layer of dir a copy of the captured layer seed,
// or seed itself if take. On error the layer it returns (if any) is to
// be removed.
func seedLayer(dir string, limit int64, seed string, take bool) (*layer, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	st, err := os.Lstat(seed)
	if err != nil {
		return nil, err
	}
	l := &layer{dir: dir, root: filepath.Join(dir, layerMount)}
	switch {
	case limit == 0 && st.IsDir():
		if err := os.Mkdir(l.root, 0o755); err != nil {
			return nil, err
		}
		if take && os.Rename(seed, l.Upper()) == nil {
			return l, l.makeDirs()
		}
		if err := copyTree(seed, l.Upper()); err != nil {
			return l, err
		}
		return l, l.makeDirs()
	case limit > 0 && st.Mode().IsRegular() && st.Size() == limit&^4095:
		l.img = filepath.Join(dir, layerImage)
		if err := takeOrClone(l.img, seed, take); err != nil {
			return nil, err
		}
		if err := os.Mkdir(l.root, 0o700); err != nil {
			return l, err
		}
		if err := l.mount(); err != nil {
			return l, err
		}
		return l, l.makeDirs()
	}
	return nil, errLayerKind
}

func sameDevice(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}

// takeOrClone makes dst seed's file: seed itself, moved, if take and
// both are on one filesystem; else a clone.
func takeOrClone(dst, seed string, take bool) error {
	if take && os.Rename(seed, dst) == nil {
		return nil
	}
	return cloneFile(dst, seed)
}
