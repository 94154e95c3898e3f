package fs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// smallFS mounts a tmpfs of size bytes for the store's state directory.
func smallFS(t *testing.T, size int) string {
	t.Helper()
	requireFUSE(t)
	dir := filepath.Join(t.TempDir(), "small")
	os.MkdirAll(dir, 0o700)
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("mount a %d-byte tmpfs for the state directory: %v", size, err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// treeOf reads a session directory through a mount: path -> content, or
// "dir" for directories.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			out[rel] = "dir"
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

// lostEntries counts the differences between the expected tree and the
// one found: missing or changed entries, and entries that came back.
func lostEntries(t *testing.T, want, got map[string]string) int {
	t.Helper()
	var bad []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			bad = append(bad, "missing "+p)
		} else if g != w {
			bad = append(bad, fmt.Sprintf("changed %s (%d bytes %.1q, want %d %.1q)", p, len(g), g, len(w), w))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			bad = append(bad, "came back "+p)
		}
	}
	sort.Strings(bad)
	for i, b := range bad {
		if i == 10 {
			t.Errorf("... and %d more", len(bad)-10)
			break
		}
		t.Error(b)
	}
	return len(bad)
}

func isNoSpace(err error) bool { return errors.Is(err, syscall.ENOSPC) }

// TestFullDiskLosesNothing fills a small state filesystem through a real
// mount. Every operation either succeeds and survives a reopen, or fails
// with ENOSPC and leaves nothing behind; deleting files and a snapshot
// frees space while the disk is full; then writes work again, and after a
// reopen the tree is exactly what the operations that succeeded made.
//
// With a byte quota the session's data goes through FUSE writes instead of
// the kernel's passthrough, and the store records sizes as they grow.
func TestFullDiskLosesNothing(t *testing.T) {
	t.Run("passthrough", func(t *testing.T) { testFullDisk(t, false) })
	t.Run("fuse writes", func(t *testing.T) { testFullDisk(t, true) })
}

func testFullDisk(t *testing.T, quota bool) {
	state := filepath.Join(smallFS(t, 4<<20), "state")
	opts := Options{Dir: state, ReserveBytes: 64 << 10}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	mustSession(t, s, "s1")
	if quota {
		if err := s.SetQuota("s1", Quota{Bytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	v, err := s.Mount(mnt, ViewOptions{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { v.Unmount() }()
	root := filepath.Join(mnt, "s1")
	want := treeOf(t, root)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))

	// A big file only a snapshot keeps: deleting the snapshot must free it.
	big := bytes.Repeat([]byte("s"), 512<<10)
	if err := os.WriteFile(filepath.Join(root, "outputs", "snapped"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot("s1", "keep"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "outputs", "snapped")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "outputs", "big"), bytes.Repeat([]byte("b"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	want["outputs/big"] = string(bytes.Repeat([]byte("b"), 1<<20))
	// A session to delete on the full disk.
	mustSession(t, s, "s0")
	if _, err := s.WriteFile("s0", "outputs/x", bytes.NewReader(make([]byte, 256<<10)), 0, Owner{}); err != nil {
		t.Fatal(err)
	}

	var files []string
	dirs := []string{"inputs", "outputs"}
	created, refused := 0, 0
	// op does one random change and keeps want in step with what succeeded.
	op := func(i int) {
		dir := dirs[rng.IntN(len(dirs))]
		switch k := rng.IntN(10); {
		case k < 6: // a file with content
			p := filepath.Join(dir, fmt.Sprintf("f%d", i))
			f, err := os.OpenFile(filepath.Join(root, p), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				if !isNoSpace(err) {
					t.Fatalf("create %s: %v, want success or ENOSPC", p, err)
				}
				if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("create %s failed with ENOSPC but left it behind (lstat: %v)", p, err)
				}
				refused++
				return
			}
			data := bytes.Repeat([]byte{byte('a' + i%26)}, 1+rng.IntN(48<<10))
			n, werr := f.Write(data)
			if werr != nil && !isNoSpace(werr) {
				t.Fatalf("write %s: %v", p, werr)
			}
			if err := f.Close(); err != nil && !isNoSpace(err) {
				t.Fatalf("close %s: %v", p, err)
			}
			created++
			want[p] = string(data[:n])
			files = append(files, p)
		case k < 8: // a directory
			p := filepath.Join(dir, fmt.Sprintf("d%d", i))
			if err := os.Mkdir(filepath.Join(root, p), 0o755); err != nil {
				if !isNoSpace(err) {
					t.Fatalf("mkdir %s: %v", p, err)
				}
				if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("mkdir %s failed with ENOSPC but left it behind (lstat: %v)", p, err)
				}
				refused++
				return
			}
			created++
			want[p] = "dir"
			dirs = append(dirs, p)
		case k < 9 && len(files) > 0: // rename a file
			j := rng.IntN(len(files))
			from, to := files[j], filepath.Join(dir, fmt.Sprintf("r%d", i))
			if err := os.Rename(filepath.Join(root, from), filepath.Join(root, to)); err != nil {
				if !isNoSpace(err) {
					t.Fatalf("rename %s: %v", from, err)
				}
				refused++
				return
			}
			want[to] = want[from]
			delete(want, from)
			files[j] = to
		case len(files) > 0: // delete a file: must work even on a full disk
			j := rng.IntN(len(files))
			if err := os.Remove(filepath.Join(root, files[j])); err != nil {
				t.Fatalf("delete %s: %v; deleting must work on a full disk", files[j], err)
			}
			delete(want, files[j])
			files = append(files[:j], files[j+1:]...)
		}
	}
	sub := s.Events().Subscribe(1 << 16)
	defer sub.Close()
	i := 0
	for ; refused < 100 && i < 20000; i++ {
		op(i)
	}
	if refused < 100 {
		t.Fatalf("the 4 MiB state filesystem never filled in %d operations", i)
	}
	// Health said so: an OpHealth event, and Health() unless the flusher
	// has already found space again (deletions are among the operations).
	announced := false
	for len(sub.C) > 0 {
		if e := <-sub.C; e.Op == OpHealth && strings.Contains(e.Path, ErrNoSpace.Error()) {
			announced = true
		}
	}
	if !announced {
		t.Errorf("no %s event said the workspace is read-only for lack of space (Health() = %v)", OpHealth, s.Health())
	}
	t.Logf("filled: %d created, %d refused with ENOSPC, %d bytes free", created, refused, freeBytes(t, state))

	// Sessions and API writes are refused alike, leaving nothing, unless
	// a deletion among the operations has made room meanwhile.
	sessionWhileFull := false
	if err := s.CreateSession("while-full", Owner{}); err == nil {
		sessionWhileFull = true
	} else if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("CreateSession on a full disk = %v, want ErrNoSpace", err)
	} else if slices.Contains(sessionIDs(s), "while-full") {
		t.Fatal("CreateSession failed on a full disk but the session is there")
	}
	if _, err := s.WriteFile("s1", "outputs/api", bytes.NewReader(make([]byte, 64<<10)), 0, Owner{}); err == nil {
		want["outputs/api"] = string(make([]byte, 64<<10))
	} else if _, serr := os.Lstat(filepath.Join(root, "outputs", "api")); !errors.Is(serr, os.ErrNotExist) {
		t.Fatalf("WriteFile failed on a full disk (%v) but left the file (lstat: %v)", err, serr)
	}

	// Get out: delete the big file, a session and the snapshot on the
	// full disk.
	before := freeBytes(t, state)
	if err := os.Remove(filepath.Join(root, "outputs", "big")); err != nil {
		t.Fatalf("delete a big file on a full disk: %v", err)
	}
	delete(want, "outputs/big")
	if err := s.DeleteSnapshot("s1", "keep"); err != nil {
		t.Fatalf("delete a snapshot on a full disk: %v", err)
	}
	if err := s.DeleteSession("s0"); err != nil {
		t.Fatalf("delete a session on a full disk: %v", err)
	}
	// The journal reserve (64 KiB) is taken back from what is freed.
	const wantFreed = 1<<20 + 512<<10 + 256<<10 - 128<<10
	deadline := time.Now().Add(10 * time.Second)
	for freeBytes(t, state)-before < wantFreed && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	freed := freeBytes(t, state) - before
	t.Logf("deleting a 1 MiB file, a snapshot holding 512 KiB and a session holding 256 KiB on the full disk freed %d bytes", freed)
	if freed < wantFreed {
		t.Fatalf("freed %d bytes, want at least %d", freed, wantFreed)
	}
	for s.Health() != nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if h := s.Health(); h != nil {
		t.Fatalf("Health() after freeing space = %v, want nil", h)
	}
	// Writes work again: files, directories and a session.
	for j := 0; j < 20; j++ {
		p := filepath.Join("outputs", fmt.Sprintf("after%d", j))
		if err := os.WriteFile(filepath.Join(root, p), []byte(p), 0o644); err != nil {
			t.Fatalf("write %s after space was freed: %v", p, err)
		}
		want[p] = p
	}
	mustSession(t, s, "s2")

	if err := v.Unmount(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(opts); err != nil {
		t.Fatal(err)
	}
	if v, err = s.Mount(mnt, ViewOptions{Host: true}); err != nil {
		t.Fatal(err)
	}
	lost := lostEntries(t, want, treeOf(t, root))
	if _, err := os.Stat(filepath.Join(mnt, "s2", "outputs")); err != nil {
		t.Errorf("session made after space was freed is gone after a reopen: %v", err)
		lost++
	}
	if ids := sessionIDs(s); slices.Contains(ids, "s0") || slices.Contains(ids, "while-full") != sessionWhileFull {
		t.Errorf("sessions after a reopen: %v (s0 was deleted; while-full made: %v)", ids, sessionWhileFull)
		lost++
	}
	t.Logf("entries lost after reopen: %d of %d", lost, len(want)+1)
}

// TestSpaceHealthOffline: the doctor's view of a stopped store says
// read-only exactly when the journal reserve is gone.
func TestSpaceHealthOffline(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := openStore(t, dir)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if free, err := SpaceHealth(dir); err != nil || free <= 0 {
		t.Fatalf("SpaceHealth of a healthy store = %d, %v", free, err)
	}
	os.Remove(filepath.Join(dir, reserveName)) // as a freeing operation on a full disk does
	if _, err := SpaceHealth(dir); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("SpaceHealth without the reserve = %v, want ErrNoSpace", err)
	}
	s = openStore(t, dir) // space is there: Open brings the reserve back
	defer s.Close()
	if h := s.Health(); h != nil {
		t.Fatalf("Health() = %v", h)
	}
	if _, err := SpaceHealth(dir); err != nil {
		t.Fatalf("SpaceHealth after a reopen = %v", err)
	}
}
