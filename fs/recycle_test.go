package fs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// blobOf returns the blob of path p (relative to the session directory)
// in session id.
func blobOf(t *testing.T, s *Store, id, p string) uint64 {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	sess := s.sessions[id]
	ino := uint64(rootIno)
	var n *node
	for _, name := range strings.Split(p, "/") {
		if ino, n = sess.t.lookup(ino, name); n == nil {
			t.Fatalf("%s/%s: not in the tree", id, p)
		}
	}
	return n.blob
}

// waitPooled waits (at most ten seconds) until blob is back in the pool.
func waitPooled(t *testing.T, s *Store, blob uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.RLock()
		in := slices.Contains(s.pool, blob)
		s.mu.RUnlock()
		if in {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("blob %x of a deleted file was not recycled within 10s", blob)
		}
	}
}

// A deleted file's blob is emptied and reused for the next new file,
// whichever session makes it: the agent of another session must never read
// what the deleted file held, nor see its size, through the mount or after
// a restart (which adopts the pool, and empties what a crash left).
func TestHostileRecycledBlob(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := openStore(t, dir)
	first := s
	t.Cleanup(func() { first.Close() }) // after the views' cleanups
	mustSession(t, s, "a")
	mustSession(t, s, "b")
	ma := mountFor(t, s, ViewOptions{Session: "a"})
	va := filepath.Join(ma.Dir(), "a", "outputs")
	secret := []byte("the secret of session a, which b must never read")
	if err := os.WriteFile(filepath.Join(va, "secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	blob := blobOf(t, s, "a", "outputs/secret")
	if err := os.Remove(filepath.Join(va, "secret")); err != nil {
		t.Fatal(err)
	}
	waitPooled(t, s, blob)

	if fi, err := os.Stat(s.blobPath(blob)); err != nil || fi.Size() != 0 {
		t.Fatalf("pooled blob %x: %v, size %v; want empty", blob, err, fi)
	}
	// The pool is last in, first out, and the blob maker may have put
	// blobs above the recycled one: once it is done (the pool is full and
	// nothing is being made), put the recycled blob on top, so that b's
	// next new file gets it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		if len(s.pool) >= poolSize && len(s.reserved) == len(s.pool) {
			break // locked; nothing is being made
		}
		s.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("the blob maker did not fill the pool within 10s")
		}
	}
	i := slices.Index(s.pool, blob)
	s.pool = append(slices.Delete(s.pool, i, i+1), blob)
	s.mu.Unlock()
	mb := mountFor(t, s, ViewOptions{Session: "b"})
	reused := filepath.Join(mb.Dir(), "b", "outputs", "fresh")
	if err := os.WriteFile(reused, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := blobOf(t, s, "b", "outputs/fresh"); got != blob {
		t.Fatalf("b's new file got blob %x, want the recycled %x", got, blob)
	}
	checkEmpty(t, reused)
	if err := os.WriteFile(reused, []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(reused); err != nil || string(got) != "ok" {
		t.Fatalf("read back %q, %v; want \"ok\"", got, err)
	}
	for _, v := range []*View{ma, mb} {
		if err := v.Unmount(); err != nil {
			t.Fatal(err)
		}
	}

	// A restart adopts the pool; a blob a crash left unreferenced with data
	// in it is emptied before any file gets it.
	s.mu.RLock()
	pooled, left := len(s.pool), s.nextBlob+7
	s.mu.RUnlock()
	if pooled == 0 {
		t.Fatal("the pool is empty before the restart")
	}
	if err := os.WriteFile(s.blobPath(left), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, dir)
	t.Cleanup(func() { s.Close() })
	s.mu.RLock()
	adopted := slices.Contains(s.pool, left) && len(s.pool) >= pooled
	s.mu.RUnlock()
	if !adopted {
		t.Fatalf("after a restart the pool lacks blob %x or has fewer than %d blobs", left, pooled)
	}
	if fi, err := os.Stat(s.blobPath(left)); err != nil || fi.Size() != 0 {
		t.Fatalf("adopted blob %x: %v, size %v; want empty", left, err, fi)
	}
	vb := filepath.Join(mountView(t, s, ViewOptions{Session: "b"}), "b", "outputs")
	after := filepath.Join(vb, "after")
	if err := os.WriteFile(after, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checkEmpty(t, after)
}

// mountFor mounts a view of s that the test may unmount itself (before
// it closes s); it is unmounted at the end in any case.
func mountFor(t *testing.T, s *Store, opts ViewOptions) *View {
	t.Helper()
	requireFUSE(t)
	v, err := s.Mount(filepath.Join(t.TempDir(), "mnt"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Unmount() })
	return v
}

func checkEmpty(t *testing.T, p string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != 0 {
		t.Fatalf("stat %s: %v, size %v; want an empty file", p, err, fi)
	}
	if got, err := os.ReadFile(p); err != nil || len(got) != 0 {
		t.Fatalf("read %s: %q, %v; want nothing", p, got, err)
	}
}
