package fs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// overwriteStart writes data over the first bytes of file f in place.
func overwriteStart(f, data string) error {
	fd, err := os.OpenFile(f, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if _, err := fd.WriteAt([]byte(data), 0); err != nil {
		fd.Close()
		return err
	}
	return fd.Close()
}

// put writes a file through the Go API.
func put(t testing.TB, s *Store, sess, p, data string) {
	t.Helper()
	if _, err := s.WriteFile(sess, p, strings.NewReader(data), 0, Owner{}); err != nil {
		t.Fatalf("WriteFile(%q, %q) = %v", sess, p, err)
	}
}

// wantFile checks a file's content through the Go API (snap "" is live).
func wantFile(t testing.TB, s *Store, sess, snap, p, want string) {
	t.Helper()
	got, err := s.ReadFile(sess, snap, p, 0)
	if err != nil || string(got) != want {
		t.Errorf("ReadFile(%q, %q, %q) = %q, %v, want %q", sess, snap, p, got, err, want)
	}
}

// wantGone checks that a file is missing through the Go API.
func wantGone(t testing.TB, s *Store, sess, snap, p string) {
	t.Helper()
	if got, err := s.ReadFile(sess, snap, p, 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadFile(%q, %q, %q) = %q, %v, want ErrNotFound", sess, snap, p, got, err)
	}
}

func mustSnapshot(t testing.TB, s *Store, sess, name string) {
	t.Helper()
	if err := s.Snapshot(sess, name); err != nil {
		t.Fatalf("Snapshot(%q, %q) = %v", sess, name, err)
	}
}

// wantMountFile polls a file through a mount until it has want ("" with
// gone set: until it is missing).
func wantMountFile(t testing.TB, p, want string, gone bool) {
	t.Helper()
	eventually(t, 1500*time.Millisecond, func() error {
		got, err := os.ReadFile(p)
		switch {
		case gone && !errors.Is(err, syscall.ENOENT):
			return fmt.Errorf("ReadFile(%q) = %q, %v, want ENOENT", p, got, err)
		case !gone && (err != nil || string(got) != want):
			return fmt.Errorf("ReadFile(%q) = %q, %v, want %q", p, got, err, want)
		}
		return nil
	})
}

func TestSnapshotUnchangedByLaterWrites(t *testing.T) {
	const orig = "original content"
	tests := []struct {
		name     string
		mount    bool
		mutate   func(t *testing.T, s *Store, f string) error // f: the file's path in the mount
		wantLive string                                       // "" means gone
	}{
		{"api-rewrite", false, func(t *testing.T, s *Store, f string) error {
			_, err := s.WriteFile("s", "outputs/f", strings.NewReader("new"), 0, Owner{})
			return err
		}, "new"},
		{"mount-rewrite", true, func(t *testing.T, s *Store, f string) error {
			return os.WriteFile(f, []byte("new"), 0o644)
		}, "new"},
		{"mount-in-place", true, func(t *testing.T, s *Store, f string) error {
			return overwriteStart(f, "ORIG")
		}, "ORIGinal content"},
		{"mount-append", true, func(t *testing.T, s *Store, f string) error {
			fd, err := os.OpenFile(f, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			if _, err := fd.WriteString("+more"); err != nil {
				fd.Close()
				return err
			}
			return fd.Close()
		}, orig + "+more"},
		{"mount-truncate", true, func(t *testing.T, s *Store, f string) error {
			return os.Truncate(f, 4)
		}, "orig"},
		{"mount-extend", true, func(t *testing.T, s *Store, f string) error {
			return os.Truncate(f, int64(len(orig)+3))
		}, orig + "\x00\x00\x00"},
		{"mount-remove", true, func(t *testing.T, s *Store, f string) error {
			return os.Remove(f)
		}, ""},
		{"mount-rename-over", true, func(t *testing.T, s *Store, f string) error {
			if err := os.WriteFile(f+".tmp", []byte("replacement"), 0o644); err != nil {
				return err
			}
			return os.Rename(f+".tmp", f)
		}, "replacement"},
		{"mount-reader-held-then-write", true, func(t *testing.T, s *Store, f string) error {
			r, err := os.Open(f)
			if err != nil {
				return err
			}
			defer r.Close()
			return overwriteStart(f, "XXXX")
		}, "XXXXinal content"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			mustSession(t, s, "s")
			var mnt string
			if tc.mount {
				mnt = mountView(t, s, ViewOptions{Session: "s"})
			}
			put(t, s, "s", "outputs/f", orig)
			mustSnapshot(t, s, "s", "snap")
			if err := tc.mutate(t, s, filepath.Join(mnt, "s/outputs/f")); err != nil {
				t.Fatalf("mutate: %v", err)
			}
			wantFile(t, s, "s", "snap", "outputs/f", orig)
			eventually(t, 1500*time.Millisecond, func() error {
				got, err := s.ReadFile("s", "", "outputs/f", 0)
				if tc.wantLive == "" {
					if !errors.Is(err, ErrNotFound) {
						return fmt.Errorf("live ReadFile = %q, %v, want ErrNotFound", got, err)
					}
					return nil
				}
				if err != nil || string(got) != tc.wantLive {
					return fmt.Errorf("live ReadFile = %q, %v, want %q", got, err, tc.wantLive)
				}
				return nil
			})
			// A second snapshot sees the new state, the first still the old.
			mustSnapshot(t, s, "s", "snap2")
			if tc.wantLive != "" {
				wantFile(t, s, "s", "snap2", "outputs/f", tc.wantLive)
			}
			wantFile(t, s, "s", "snap", "outputs/f", orig)
		})
	}
}

func TestRestore(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "s")
	mustSession(t, s, "other")
	host := mountView(t, s, ViewOptions{Host: true})
	sv := mountView(t, s, ViewOptions{Session: "s"})
	put(t, s, "s", "outputs/keep", "keep")
	put(t, s, "s", "outputs/mod", "mod v1")
	put(t, s, "s", "outputs/del", "del")
	if err := s.MkdirAll("s", "outputs/dir/sub", Owner{}); err != nil {
		t.Fatal(err)
	}
	put(t, s, "s", "outputs/dir/sub/deep", "deep")
	put(t, s, "s", "outputs/moved", "moved")
	put(t, s, "other", "outputs/o", "other v1")
	mustSnapshot(t, s, "s", "snap")

	// Change everything through the session's own view.
	o := filepath.Join(sv, "s/outputs")
	if err := os.WriteFile(filepath.Join(o, "mod"), []byte("mod v2, longer"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(o, "del")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(o, "dir")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o, "new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(o, "moved"), filepath.Join(o, "moved2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(o, "newdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	put(t, s, "other", "outputs/o", "other v2")
	// Prime the kernel caches of both views.
	for _, mnt := range []string{host, sv} {
		wantMountFile(t, filepath.Join(mnt, "s/outputs/new"), "new", false)
		wantMountFile(t, filepath.Join(mnt, "s/outputs/mod"), "mod v2, longer", false)
		wantMountFile(t, filepath.Join(mnt, "s/outputs/del"), "", true)
	}

	for round := range 2 {
		if err := s.Restore("s", "snap"); err != nil {
			t.Fatalf("Restore = %v", err)
		}
		files := map[string]string{
			"outputs/keep":         "keep",
			"outputs/mod":          "mod v1",
			"outputs/del":          "del",
			"outputs/dir/sub/deep": "deep",
			"outputs/moved":        "moved",
		}
		gone := []string{"outputs/new", "outputs/moved2", "outputs/newdir"}
		for p, want := range files {
			wantFile(t, s, "s", "", p, want)
		}
		for _, p := range gone[:2] {
			wantGone(t, s, "s", "", p)
		}
		for _, mnt := range []string{host, sv} {
			for p, want := range files {
				wantMountFile(t, filepath.Join(mnt, "s", p), want, false)
			}
			for _, p := range gone {
				eventually(t, 1500*time.Millisecond, func() error {
					if _, err := os.Stat(filepath.Join(mnt, "s", p)); !errors.Is(err, syscall.ENOENT) {
						return fmt.Errorf("round %d: Stat(%q) after Restore = %v, want ENOENT", round, p, err)
					}
					return nil
				})
			}
			ents, err := os.ReadDir(filepath.Join(mnt, "s/outputs"))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if want := []string{"del", "dir", "keep", "mod", "moved"}; !slices.Equal(names, want) {
				t.Errorf("round %d: ReadDir(s/outputs) after Restore = %q, want %q", round, names, want)
			}
		}
		// Other sessions are not touched.
		wantFile(t, s, "other", "", "outputs/o", "other v2")
		// The restored tree is writable and does not write the snapshot.
		if err := os.WriteFile(filepath.Join(o, "mod"), []byte("after restore"), 0o644); err != nil {
			t.Fatalf("write after Restore: %v", err)
		}
		wantFile(t, s, "s", "", "outputs/mod", "after restore")
		wantFile(t, s, "s", "snap", "outputs/mod", "mod v1")
	}
}

// TestRestoreWhileOpenForWriting: a handle open across a restore keeps
// writing its old file, which the restored tree no longer holds.
func TestRestoreWhileOpenForWriting(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	put(t, s, "s", "outputs/f", "v1")
	mustSnapshot(t, s, "s", "snap")
	f, err := os.OpenFile(filepath.Join(mnt, "s/outputs/f"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("v2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore("s", "snap"); err != nil {
		t.Fatal(err)
	}
	f.WriteString(" and more") // may fail: the old file is stale
	f.Close()
	time.Sleep(100 * time.Millisecond) // the release is asynchronous
	wantFile(t, s, "s", "", "outputs/f", "v1")
	wantFile(t, s, "s", "snap", "outputs/f", "v1")
	wantMountFile(t, filepath.Join(mnt, "s/outputs/f"), "v1", false)
}

func TestBranch(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Host: true})
	put(t, s, "s", "outputs/a", "a v1")
	put(t, s, "s", "outputs/b", "b v1")
	put(t, s, "s", "inputs/c", "c v1")
	mustSnapshot(t, s, "s", "snap")
	put(t, s, "s", "outputs/after", "made after the snapshot")

	if err := s.Branch("s", "snap", "s", "br"); err != nil {
		t.Fatalf("Branch = %v", err)
	}
	if err := s.Branch("s", "snap", "", "br2"); err != nil {
		t.Fatalf("Branch with from \"\" = %v", err)
	}
	if err := s.Branch("s", "snap", "s", "br"); !errors.Is(err, ErrExists) {
		t.Errorf("Branch to an existing session = %v, want ErrExists", err)
	}
	if err := s.Branch("s", "nosuch", "s", "br3"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Branch of a missing snapshot = %v, want ErrNotFound", err)
	}
	for _, br := range []string{"br", "br2"} {
		wantFile(t, s, br, "", "outputs/a", "a v1")
		wantFile(t, s, br, "", "inputs/c", "c v1")
		wantGone(t, s, br, "", "outputs/after")
	}
	var ids []string
	for _, si := range s.Sessions() {
		ids = append(ids, si.ID)
	}
	if want := []string{"br", "br2", "s"}; !slices.Equal(ids, want) {
		t.Errorf("Sessions() = %q, want %q", ids, want)
	}

	// Writes to the branch, through the API and a mount.
	put(t, s, "br", "outputs/a", "a in branch")
	fd, err := os.OpenFile(filepath.Join(mnt, "br/outputs/b"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.WriteAt([]byte("B"), 0); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	if err := os.Remove(filepath.Join(mnt, "br/inputs/c")); err != nil {
		t.Fatal(err)
	}
	// Writes to the original, in place through the mount.
	fd, err = os.OpenFile(filepath.Join(mnt, "s/inputs/c"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.WriteAt([]byte("C"), 0); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	time.Sleep(50 * time.Millisecond)

	for _, tc := range []struct{ sess, snap, p, want string }{
		{"br", "", "outputs/a", "a in branch"},
		{"br", "", "outputs/b", "B v1"},
		{"br2", "", "outputs/a", "a v1"},
		{"br2", "", "outputs/b", "b v1"},
		{"br2", "", "inputs/c", "c v1"},
		{"s", "", "outputs/a", "a v1"},
		{"s", "", "outputs/b", "b v1"},
		{"s", "", "inputs/c", "C v1"},
		{"s", "snap", "outputs/a", "a v1"},
		{"s", "snap", "outputs/b", "b v1"},
		{"s", "snap", "inputs/c", "c v1"},
	} {
		wantFile(t, s, tc.sess, tc.snap, tc.p, tc.want)
		if tc.snap == "" {
			wantMountFile(t, filepath.Join(mnt, tc.sess, tc.p), tc.want, false)
		}
	}
	wantGone(t, s, "br", "", "inputs/c")
	// Deleting the snapshot and the original leaves the branch whole.
	if err := s.DeleteSnapshot("s", "snap"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSession("s"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let garbage collection run
	wantFile(t, s, "br", "", "outputs/b", "B v1")
	wantFile(t, s, "br2", "", "inputs/c", "c v1")
	wantMountFile(t, filepath.Join(mnt, "br2/outputs/b"), "b v1", false)
}

func TestSnapshotDeepTree(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	const depth, nfiles = 50, 1000
	deep := "outputs"
	for i := range depth {
		deep += fmt.Sprintf("/d%02d", i)
	}
	if err := os.MkdirAll(filepath.Join(mnt, "s", deep), 0o755); err != nil {
		t.Fatal(err)
	}
	path := func(i int) string {
		// Spread the files over the levels of the deep chain.
		p := "outputs"
		for j := range i % depth {
			p += fmt.Sprintf("/d%02d", j)
		}
		return fmt.Sprintf("%s/f%04d", p, i)
	}
	content := func(i int) string { return fmt.Sprintf("file %d\n", i) }
	for i := range nfiles {
		if err := os.WriteFile(filepath.Join(mnt, "s", path(i)), []byte(content(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var want int64
	for i := range nfiles {
		want += int64(len(content(i)))
	}
	// Handles are released asynchronously after close.
	eventually(t, 2*time.Second, func() error {
		if b := s.Sessions()[0].Bytes; b != want {
			return fmt.Errorf("session Bytes = %d, want %d", b, want)
		}
		return nil
	})
	before := s.Sessions()[0]
	mustSnapshot(t, s, "s", "deep")
	infos, err := s.Snapshots("s")
	if err != nil || len(infos) != 1 {
		t.Fatalf("Snapshots = %v, %v", infos, err)
	}
	if infos[0].Files != before.Files {
		t.Errorf("snapshot Files = %d, want %d", infos[0].Files, before.Files)
	}
	// Wreck the tree.
	if err := os.RemoveAll(filepath.Join(mnt, "s/outputs/d00")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "s", path(0)), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantGone(t, s, "s", "", path(1))
	wantFile(t, s, "s", "deep", path(1), content(1))
	wantFile(t, s, "s", "deep", path(nfiles-1), content(nfiles-1))

	if err := s.Restore("s", "deep"); err != nil {
		t.Fatal(err)
	}
	after := s.Sessions()[0]
	if after.Files != before.Files || after.Bytes != before.Bytes {
		t.Errorf("after Restore: Files, Bytes = %d, %d, want %d, %d", after.Files, after.Bytes, before.Files, before.Bytes)
	}
	for i := range nfiles {
		wantFile(t, s, "s", "", path(i), content(i))
	}
	// And through the mount.
	var n int
	eventually(t, 2*time.Second, func() error {
		n = 0
		err := filepath.WalkDir(filepath.Join(mnt, "s/outputs"), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() {
				n++
			}
			return nil
		})
		if err != nil || n != nfiles {
			return fmt.Errorf("walk after Restore: %d files, %v, want %d", n, err, nfiles)
		}
		return nil
	})
	for _, i := range []int{0, 1, depth - 1, nfiles - 1} {
		wantMountFile(t, filepath.Join(mnt, "s", path(i)), content(i), false)
	}
}

func TestSnapshotWholeTree(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "a")
	mustSession(t, s, "b")
	mnt := mountView(t, s, ViewOptions{Host: true})
	put(t, s, "a", "outputs/x", "a's x")
	put(t, s, "b", "outputs/y", "b's y v1")
	if err := s.SetQuota("a", Quota{Inodes: 100}); err != nil {
		t.Fatal(err)
	}
	mustSnapshot(t, s, "", "whole")
	infos, err := s.Snapshots("")
	if err != nil || len(infos) != 1 {
		t.Fatalf("Snapshots(\"\") = %v, %v, want one", infos, err)
	}
	if want := []string{"a", "b"}; !slices.Equal(infos[0].Sessions, want) {
		t.Errorf("whole-tree snapshot Sessions = %q, want %q", infos[0].Sessions, want)
	}
	if got, err := s.Snapshots("a"); err != nil || len(got) != 0 {
		t.Errorf("Snapshots(\"a\") = %v, %v, want none (whole-tree snapshots are listed under \"\")", got, err)
	}

	if err := s.DeleteSession("a"); err != nil {
		t.Fatal(err)
	}
	mustSession(t, s, "c")
	put(t, s, "c", "outputs/z", "c's z")
	put(t, s, "b", "outputs/y", "b's y v2")
	wantMountFile(t, filepath.Join(mnt, "a/outputs/x"), "", true)
	wantMountFile(t, filepath.Join(mnt, "c/outputs/z"), "c's z", false)

	if err := s.Restore("", "whole"); err != nil {
		t.Fatalf("Restore(\"\", whole) = %v", err)
	}
	var ids []string
	for _, si := range s.Sessions() {
		ids = append(ids, si.ID)
		if si.ID == "a" && si.Quota.Inodes != 100 {
			t.Errorf("restored session a has quota %+v, want Inodes 100", si.Quota)
		}
	}
	if want := []string{"a", "b"}; !slices.Equal(ids, want) {
		t.Errorf("Sessions() after whole-tree Restore = %q, want %q", ids, want)
	}
	wantFile(t, s, "a", "", "outputs/x", "a's x")
	wantFile(t, s, "b", "", "outputs/y", "b's y v1")
	if _, err := s.ReadFile("c", "", "outputs/z", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadFile in removed session c = %v, want ErrNotFound", err)
	}
	wantMountFile(t, filepath.Join(mnt, "a/outputs/x"), "a's x", false)
	wantMountFile(t, filepath.Join(mnt, "b/outputs/y"), "b's y v1", false)
	wantMountFile(t, filepath.Join(mnt, "c/outputs/z"), "", true)
	eventually(t, 1500*time.Millisecond, func() error {
		ents, err := os.ReadDir(mnt)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if err != nil || !slices.Equal(names, []string{"a", "b"}) {
			return fmt.Errorf("ReadDir(mount root) = %q, %v, want [a b]", names, err)
		}
		return nil
	})
	// The restored a is writable; the snapshot keeps its copy.
	if err := os.WriteFile(filepath.Join(mnt, "a/outputs/x"), []byte("a's x v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A session can be branched from a whole-tree snapshot.
	if err := s.Branch("", "whole", "a", "a-again"); err != nil {
		t.Fatalf("Branch from a whole-tree snapshot = %v", err)
	}
	wantFile(t, s, "a-again", "", "outputs/x", "a's x")
	if err := s.Branch("", "whole", "", "nothing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Branch from a whole-tree snapshot without a session = %v, want ErrNotFound", err)
	}
}

// TestReadFileWholeTreeSnapshot: ReadFile cannot name a session inside a
// whole-tree snapshot; asking with id "" must fail, not crash.
func TestReadFileWholeTreeSnapshot(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "state"))
	mustSession(t, s, "a")
	put(t, s, "a", "outputs/x", "x")
	mustSnapshot(t, s, "", "whole")
	panicked := false
	func() {
		defer func() {
			if r := recover(); r != nil {
				panicked = true
				t.Errorf("ReadFile(\"\", \"whole\", \"a/outputs/x\") panicked: %v", r)
			}
		}()
		if _, err := s.ReadFile("", "whole", "a/outputs/x", 0); err == nil {
			t.Errorf("ReadFile(\"\", \"whole\", ...) = nil error, want one")
		}
	}()
	if panicked {
		return // the store's lock is lost: Close would hang
	}
	defer s.Close()
	got, err := s.ReadFile("a", "whole", "outputs/x", 0)
	if err != nil || string(got) != "x" {
		t.Errorf("ReadFile(%q, %q, %q) = %q, %v, want %q", "a", "whole", "outputs/x", got, err, "x")
	}
}

// treeBlobs returns the blobs a session's live tree (snap "") or its
// snapshot holds.
func treeBlobs(t testing.TB, s *Store, sess, snap string) []uint64 {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var tr tree
	if snap == "" {
		tr = s.sessions[sess].t
	} else {
		sn := s.snaps[snapKey{sess, snap}]
		if sn == nil {
			t.Fatalf("no snapshot %q of %q", snap, sess)
		}
		tr = sn.trees[sess].t
	}
	var ids []uint64
	tr.blobs(func(b uint64, _ int64) { ids = append(ids, b) })
	return ids
}

// waitClosed waits for the closed event of path in sess on sub.
func waitClosed(t testing.TB, sub *Subscription, sess, path string) {
	t.Helper()
	timeout := time.After(2 * time.Second)
	for {
		select {
		case ev := <-sub.C:
			if ev.Op == OpClosed && ev.Session == sess && ev.Path == path {
				return
			}
		case <-timeout:
			t.Fatalf("no closed event for %s/%s", sess, path)
		}
	}
}

func TestSnapshotsSharedUnique(t *testing.T) {
	for _, rewrite := range []string{"api", "mount-in-place"} {
		t.Run(rewrite, func(t *testing.T) {
			s := testStore(t)
			mustSession(t, s, "s")
			data := strings.Repeat("x", 1000)
			put(t, s, "s", "outputs/f", data)
			mustSnapshot(t, s, "s", "one")
			infos, err := s.Snapshots("s")
			if err != nil || len(infos) != 1 {
				t.Fatalf("Snapshots = %+v, %v", infos, err)
			}
			if got := infos[0]; got.Name != "one" || got.Session != "s" || got.Bytes != 1000 || got.Shared != 1000 || got.Unique != 0 || got.Created.IsZero() {
				t.Errorf("Snapshots()[0] = %+v, want Name one, Session s, Bytes 1000, Shared 1000, Unique 0", got)
			}
			switch rewrite {
			case "api":
				put(t, s, "s", "outputs/f", strings.Repeat("y", 1000))
			case "mount-in-place":
				mnt := mountView(t, s, ViewOptions{Session: "s"})
				sub := s.Events().Subscribe(100)
				defer sub.Close()
				fd, err := os.OpenFile(filepath.Join(mnt, "s/outputs/f"), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := fd.WriteAt([]byte("yyyy"), 0); err != nil {
					t.Fatal(err)
				}
				fd.Close()
				// Until the kernel releases the handle, a snapshot copies
				// the file instead of sharing it.
				waitClosed(t, sub, "s", "outputs/f")
			}
			eventually(t, time.Second, func() error {
				infos, err = s.Snapshots("s")
				if err != nil || len(infos) != 1 || infos[0].Shared != 0 || infos[0].Unique != 1000 {
					return fmt.Errorf("after a rewrite: Snapshots = %+v, %v, want Shared 0, Unique 1000", infos, err)
				}
				return nil
			})
			// A second snapshot of the new state; the first keeps its own.
			mustSnapshot(t, s, "s", "two")
			infos, err = s.Snapshots("s")
			if err != nil || len(infos) != 2 || infos[0].Name != "one" || infos[1].Name != "two" {
				t.Fatalf("Snapshots = %+v, %v, want one, two (oldest first)", infos, err)
			}
			if infos[0].Unique != 1000 || infos[1].Shared != 1000 || infos[1].Unique != 0 {
				t.Errorf("Snapshots = %+v, want one Unique 1000, two Shared 1000 Unique 0", infos)
			}
			oneBlobs := treeBlobs(t, s, "s", "one")
			liveBlobs := treeBlobs(t, s, "s", "")
			if len(oneBlobs) != 1 || len(liveBlobs) != 1 || oneBlobs[0] == liveBlobs[0] {
				t.Fatalf("blobs of snapshot one %v and of the live tree %v, want one each, different", oneBlobs, liveBlobs)
			}
			if err := s.DeleteSnapshot("s", "one"); err != nil {
				t.Fatalf("DeleteSnapshot = %v", err)
			}
			if err := s.DeleteSnapshot("s", "one"); !errors.Is(err, ErrNotFound) {
				t.Errorf("DeleteSnapshot twice = %v, want ErrNotFound", err)
			}
			if _, err := s.ReadFile("s", "one", "outputs/f", 0); !errors.Is(err, ErrNotFound) {
				t.Errorf("ReadFile in a deleted snapshot = %v, want ErrNotFound", err)
			}
			infos, err = s.Snapshots("s")
			if err != nil || len(infos) != 1 || infos[0].Name != "two" {
				t.Fatalf("Snapshots after DeleteSnapshot = %+v, %v, want [two]", infos, err)
			}
			// The deleted snapshot's blob goes; the shared one stays.
			eventually(t, 2*time.Second, func() error {
				if _, err := os.Stat(s.blobPath(oneBlobs[0])); !os.IsNotExist(err) {
					return fmt.Errorf("blob %x of the deleted snapshot: Stat = %v, want it gone", oneBlobs[0], err)
				}
				return nil
			})
			if _, err := os.Stat(s.blobPath(liveBlobs[0])); err != nil {
				t.Errorf("live blob %x: %v", liveBlobs[0], err)
			}
			wantFile(t, s, "s", "two", "outputs/f", func() string {
				if rewrite == "api" {
					return strings.Repeat("y", 1000)
				}
				return "yyyy" + data[4:]
			}())
		})
	}
}

// TestSnapshotWithOpenWriter: a file open for writing across a snapshot.
func TestSnapshotWithOpenWriter(t *testing.T) {
	cases := []struct {
		name  string
		quota Quota // a byte quota keeps writes on the FUSE path
	}{
		{"passthrough", Quota{}},
		{"fuse-path", Quota{Bytes: 1 << 30}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			mustSession(t, s, "s")
			if err := s.SetQuota("s", tc.quota); err != nil {
				t.Fatal(err)
			}
			mnt := mountView(t, s, ViewOptions{Session: "s"})
			p := filepath.Join(mnt, "s/outputs/f")
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString("before"); err != nil {
				t.Fatal(err)
			}
			mustSnapshot(t, s, "s", "mid")
			if _, err := f.WriteString("after"); err != nil {
				t.Fatal(err)
			}
			wantFile(t, s, "s", "mid", "outputs/f", "before")
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			wantMountFile(t, p, "beforeafter", false)
			eventually(t, time.Second, func() error {
				got, err := s.ReadFile("s", "", "outputs/f", 0)
				if err != nil || string(got) != "beforeafter" {
					return fmt.Errorf("live ReadFile = %q, %v, want %q", got, err, "beforeafter")
				}
				return nil
			})
			wantFile(t, s, "s", "mid", "outputs/f", "before")
		})
	}
}

// TestSnapshotWithOpenWriterRestore restores a snapshot taken while a file
// was open for writing and reads the file through a mount.
func TestSnapshotWithOpenWriterRestore(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	p := filepath.Join(mnt, "s/outputs/f")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("before"); err != nil {
		t.Fatal(err)
	}
	mustSnapshot(t, s, "s", "mid")
	if _, err := f.WriteString("after"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	infos, err := s.Snapshots("s")
	if err != nil || len(infos) != 1 || infos[0].Bytes != int64(len("before")) {
		t.Errorf("Snapshots = %+v, %v, want Bytes %d", infos, err, len("before"))
	}
	time.Sleep(100 * time.Millisecond)
	if err := s.Restore("s", "mid"); err != nil {
		t.Fatal(err)
	}
	wantFile(t, s, "s", "", "outputs/f", "before")
	wantMountFile(t, p, "before", false)
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != int64(len("before")) {
		t.Errorf("Stat after Restore: size %d, %v, want %d", fi.Size(), err, len("before"))
	}
	if b := s.Sessions()[0].Bytes; b != int64(len("before")) {
		t.Errorf("Sessions()[0].Bytes after Restore = %d, want %d", b, len("before"))
	}
}

func TestBadIDs(t *testing.T) {
	bad := []string{"", "../x", "..", ".", "a/b", "/a", "a\x00b", "\x00", strings.Repeat("a", 300),
		strings.Repeat("a", 64), "A", "Upper", "-x", ".x", "_x", "a..b", "a b", "a\nb", "é"}
	s := testStore(t)
	mustSession(t, s, "s")
	mustSnapshot(t, s, "s", "ok")
	ops := []struct {
		name string
		fn   func(id string) error
	}{
		{"CreateSession", func(id string) error { return s.CreateSession(id, Owner{}) }},
		{"RenameSession", func(id string) error { return s.RenameSession("s", id) }},
		{"Snapshot", func(id string) error { return s.Snapshot("s", id) }},
		{"WholeTreeSnapshot", func(id string) error { return s.Snapshot("", id) }},
		{"Branch", func(id string) error { return s.Branch("s", "ok", "s", id) }},
		{"ValidateID", func(id string) error { return ValidateID("session", id) }},
	}
	for _, op := range ops {
		for _, id := range bad {
			if err := op.fn(id); !errors.Is(err, ErrBadName) {
				t.Errorf("%s(%q) = %v, want ErrBadName", op.name, id, err)
			}
		}
	}
	if _, err := s.Mount(filepath.Join(t.TempDir(), "m"), ViewOptions{Session: "../x"}); !errors.Is(err, ErrBadName) {
		t.Errorf("Mount(Session %q) = %v, want ErrBadName", "../x", err)
	}
	// Nothing was made.
	var ids []string
	for _, si := range s.Sessions() {
		ids = append(ids, si.ID)
	}
	if !slices.Equal(ids, []string{"s"}) {
		t.Errorf("Sessions() = %q, want [s]", ids)
	}
	if infos, _ := s.Snapshots("s"); len(infos) != 1 {
		t.Errorf("Snapshots(s) = %+v, want only ok", infos)
	}
	// The longest and odd-but-valid names work.
	for _, id := range []string{strings.Repeat("a", 63), "0", "a.b_c-d", "a-"} {
		if err := s.CreateSession(id, Owner{}); err != nil {
			t.Errorf("CreateSession(%q) = %v, want nil", id, err)
		}
		if err := s.Snapshot("s", id); err != nil {
			t.Errorf("Snapshot(s, %q) = %v, want nil", id, err)
		}
	}
}

// slowReader yields data a little at a time, so a WriteFile stays in
// progress for a while.
type slowReader struct {
	data  []byte
	delay time.Duration
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.delay)
	n := copy(p[:min(len(p), 16)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// TestWriteFileDuringGarbageCollection: garbage collection (after
// DeleteSnapshot) must not delete the blob of a WriteFile in progress.
func TestWriteFileDuringGarbageCollection(t *testing.T) {
	s, err := Open(Options{Dir: filepath.Join(t.TempDir(), "state"), TidyInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustSession(t, s, "s")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // keep garbage collection busy
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("gc%d", i)
			if err := s.Snapshot("s", name); err != nil {
				t.Error(err)
				return
			}
			if err := s.DeleteSnapshot("s", name); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	want := bytes.Repeat([]byte("0123456789abcdef"), 8)
	for i := range 5 {
		p := fmt.Sprintf("outputs/f%d", i)
		if _, err := s.WriteFile("s", p, &slowReader{data: want, delay: 2 * time.Millisecond}, 0, Owner{}); err != nil {
			t.Fatalf("WriteFile(%q) = %v", p, err)
		}
	}
	close(stop)
	wg.Wait()
	for i := range 5 {
		p := fmt.Sprintf("outputs/f%d", i)
		got, err := s.ReadFile("s", "", p, 0)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("ReadFile(%q) = %q, %v, want %q", p, got, err, want)
		}
	}
}
