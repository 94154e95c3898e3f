package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// floorFS is the least a FUSE file system that stores files can cost:
// the baseline BenchmarkSmallFiles20k measures beside the view, so that
// each run says how much of the view's time is its own and how much any
// FUSE server would pay on this host. It serves one flat directory from
// memory. Every file it creates is passed through to one backing file,
// opened and registered once at mount, so a create makes no inode and a
// release or an unlink has nothing to close or remove; a getattr is one
// fstat(2) of that file. It keeps no journal and no data of its own: the
// files' bytes overwrite each other. It is a benchmark's yardstick, not
// a file system; the view does what it skips (an inode and a blob per
// file, a durable record of every change, permissions, snapshots).
//
// It is mounted with the view's options and reader policy, so both pay
// the same transport: per file of the benchmark's client, the kernel
// sends LOOKUP (the new name), CREATE, GETXATTR (security.capability,
// at the write: FUSE never caches its absence), GETATTR (at stat) and
// UNLINK, and each waits for an answer.
type floorFS struct {
	fuse.RawFileSystem
	srv     *fuse.Server
	backing *os.File

	mu    sync.Mutex
	id    int32 // backing's passthrough id
	names map[string]uint64
	next  uint64
}

func (f *floorFS) attr(ino uint64, out *fuse.Attr) fuse.Status {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.backing.Fd()), &st); err != nil {
		return fuse.ToStatus(err)
	}
	*out = fuse.Attr{Ino: ino, Size: uint64(st.Size), Blocks: uint64(st.Blocks), Mode: syscall.S_IFREG | 0o644, Nlink: 1, Blksize: 4096,
		Owner: fuse.Owner{Uid: st.Uid, Gid: st.Gid}}
	out.SetTimes(nil, &time.Time{}, nil)
	return fuse.OK
}

func (f *floorFS) entry(ino uint64, out *fuse.EntryOut) fuse.Status {
	out.NodeId = ino
	out.SetAttrTimeout(cacheTTL)
	out.SetEntryTimeout(entryTTL)
	return f.attr(ino, &out.Attr)
}

func (f *floorFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	f.mu.Lock()
	ino, ok := f.names[name]
	f.mu.Unlock()
	if h.NodeId != fuse.FUSE_ROOT_ID || !ok {
		return fuse.ENOENT
	}
	return f.entry(ino, out)
}

func (f *floorFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	out.SetTimeout(cacheTTL)
	if in.NodeId == fuse.FUSE_ROOT_ID {
		out.Attr = fuse.Attr{Ino: fuse.FUSE_ROOT_ID, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Blksize: 4096}
		return fuse.OK
	}
	return f.attr(in.NodeId, &out.Attr)
}

func (f *floorFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	return 0, fuse.ENOATTR
}

func (f *floorFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if in.NodeId != fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	f.mu.Lock()
	f.next++
	ino := f.next
	f.names[name] = ino
	out.BackingID = f.id
	f.mu.Unlock()
	out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
	out.Fh = ino
	return f.entry(ino, &out.EntryOut)
}

func (f *floorFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.names[name]; !ok || h.NodeId != fuse.FUSE_ROOT_ID {
		return fuse.ENOENT
	}
	delete(f.names, name)
	return fuse.OK
}

// mountFloor mounts a floorFS in a new directory, backed by a file in
// backingDir, and returns the mount's directory, or "" and why not where
// the kernel will not pass files through (where the view will not
// either).
func mountFloor(t testing.TB, backingDir string) (string, string) {
	t.Helper()
	requireFUSE(t)
	backing, err := os.OpenFile(filepath.Join(backingDir, "floor-backing"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backing.Close() })
	dir := filepath.Join(t.TempDir(), "floor")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := &floorFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), backing: backing, names: map[string]uint64{}, next: fuse.FUSE_ROOT_ID}
	mo := &fuse.MountOptions{DirectMount: true, FsName: "hearth-floor", Name: "hearth", MaxWrite: 1 << 20,
		DisableReadDirPlus: true, QuickRequest: quickRequest, QuickSpin: quickSpin}
	srv, err := fuse.NewServer(f, dir, mo)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	go srv.Serve()
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount floor: %v", err)
		}
	})
	if err := srv.WaitMount(); err != nil {
		t.Fatal(err)
	}
	id, errno := srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(backing.Fd())})
	if errno != 0 {
		return "", fmt.Sprintf("no FUSE passthrough here (registering a backing file: %v)", errno)
	}
	f.mu.Lock() // the kernel's requests are read on other goroutines
	f.id = id
	f.mu.Unlock()
	return dir, ""
}

// TestFloorServesTheClient checks that the yardstick does what the
// benchmark's client asks of it (write, stat, remove), so that its
// figure is a real round of the same work.
func TestFloorServesTheClient(t *testing.T) {
	dir, why := mountFloor(t, t.TempDir())
	if dir == "" {
		t.Skip(why)
	}
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil || st.Size != 10 {
		t.Fatalf("stat %s: %v, size %d, want 10", p, err, st.Size)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("after remove, stat %s: %v, want it gone", p, err)
	}
}
