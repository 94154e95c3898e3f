package fs

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// asNobody runs a command as the unprivileged user nobody (65534).
func asNobody(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd.CombinedOutput()
}

// openDir makes dir and its parents up to the test's temporary directory
// enterable by every user, so that what keeps them out is the code under
// test and not t.TempDir's 0700.
func openDir(t *testing.T, dir string) {
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

// Another local user must not read sessions' files through the host view,
// even those whose modes would let them.
func TestHostileHostViewOtherUser(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "a")
	if _, err := s.WriteFile("a", "inputs/brief.md", strings.NewReader("confidential brief"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	host := mountView(t, s, ViewOptions{Host: true})
	openDir(t, filepath.Dir(host))
	file := filepath.Join(host, "a", "inputs", "brief.md")
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm()&0o004 == 0 {
		t.Fatalf("stat %s = %v, %v: want a file whose mode lets others read it", file, fi, err)
	}
	if out, err := asNobody("cat", file); err == nil {
		t.Errorf("user nobody read %s through the host view: %q", file, out)
	}
	if out, err := asNobody("ls", host); err == nil {
		t.Errorf("user nobody listed the host view: %q", out)
	}

	// With AllowOther, modes apply as on any filesystem.
	open := mountView(t, s, ViewOptions{Host: true, AllowOther: true})
	openDir(t, filepath.Dir(open))
	if out, err := asNobody("cat", filepath.Join(open, "a", "inputs", "brief.md")); err != nil || string(out) != "confidential brief" {
		t.Errorf("with AllowOther, nobody reads %q, %v; want the brief", out, err)
	}
}

// An agent sets attribute after attribute on one file: the store keeps at
// most 64 KiB of them per file (ENOSPC beyond, as ext4 says) and counts
// them against the session's byte quota (EDQUOT).
func TestHostileXattrFlood(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "a")
	av := mountView(t, s, ViewOptions{Session: "a"})
	f := filepath.Join(av, "a", "outputs", "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	val := []byte(strings.Repeat("x", 4<<10))
	var set int
	var last error
	for i := 0; i < 100; i++ {
		if last = unix.Setxattr(f, fmt.Sprintf("user.flood%03d", i), val, 0); last != nil {
			break
		}
		set++
	}
	if !errors.Is(last, syscall.ENOSPC) {
		t.Errorf("after %d attributes of 4 KiB, setxattr = %v, want ENOSPC", set, last)
	}
	if held := int64(set) * int64(len(val)+len("user.flood000")); held > maxXattrTotal {
		t.Errorf("%d attributes set: %d bytes on one file, the bound is %d", set, held, maxXattrTotal)
	}
	if err := unix.Setxattr(f, "user.big", make([]byte, maxXattrSize+1), 0); !errors.Is(err, syscall.E2BIG) && !errors.Is(err, syscall.ERANGE) {
		t.Errorf("setxattr of a value over 64 KiB = %v, want E2BIG", err)
	}
	info := sessionInfo(t, s, "a")
	if info.Bytes < int64(set)*int64(len(val)) {
		t.Errorf("session uses %d bytes with %d attributes of %d bytes: attributes are not counted", info.Bytes, set, len(val))
	}

	// Under a byte quota, attributes count like file data.
	if err := s.SetQuota("a", Quota{Bytes: info.Bytes + 6<<10}); err != nil {
		t.Fatal(err)
	}
	g := filepath.Join(av, "a", "outputs", "g")
	if err := os.WriteFile(g, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(g, "user.a", val, 0); err != nil {
		t.Fatalf("setxattr within the quota = %v", err)
	}
	if err := unix.Setxattr(g, "user.b", val, 0); !errors.Is(err, syscall.EDQUOT) {
		t.Errorf("setxattr over the byte quota = %v, want EDQUOT", err)
	}
	// Removing attributes gives the room back.
	if err := unix.Removexattr(g, "user.a"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(g, "user.b", val, 0); err != nil {
		t.Errorf("setxattr after removing one = %v", err)
	}
	// The count survives a restart (replayed from the journal).
	want := sessionInfo(t, s, "a").Bytes
	dir := s.dir
	for _, v := range s.views {
		v.Unmount()
	}
	s.Close()
	s2 := openStore(t, dir)
	defer s2.Close()
	if got := sessionInfo(t, s2, "a").Bytes; got != want {
		t.Errorf("after a restart the session uses %d bytes, before %d", got, want)
	}
}

func sessionInfo(t *testing.T, s *Store, id string) SessionInfo {
	t.Helper()
	for _, i := range s.Sessions() {
		if i.ID == id {
			return i
		}
	}
	t.Fatalf("no session %q", id)
	return SessionInfo{}
}

// TestInodeMemory measures what one empty file costs the daemon's memory
// when an agent makes it through its view (store tree, journal buffers,
// the view's kernel node table), and holds it under a bound: the default
// file quota (100000 per session) times this is what one session can make
// the daemon hold. Run it with -v to see the figure.
func TestInodeMemory(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "a")
	av := mountView(t, s, ViewOptions{Session: "a"})
	const n = 20000
	dir := filepath.Join(av, "a", "outputs")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before, rssBefore := heap(), rss()
	for i := 0; i < n; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("empty-%06d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	// Make the kernel look every file up, as ls -l would, so the view's
	// node table holds them all.
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != n {
		t.Fatalf("ReadDir = %d entries, %v", len(ents), err)
	}
	for _, e := range ents {
		e.Info()
	}
	per := float64(int64(heap())-int64(before)) / n
	perRSS := float64(rss()-rssBefore) / n
	t.Logf("one empty file costs %.0f bytes of daemon heap, %.0f of resident memory (%d files); the default quota of %d files bounds a session to %.0f MiB of heap, %.0f MiB resident",
		per, perRSS, n, 100000, per*100000/(1<<20), perRSS*100000/(1<<20))
	if per > 4096 {
		t.Errorf("one empty file costs %.0f bytes of heap, want under 4 KiB", per)
	}
}

// Owners in the old range of the jail's host ids move to the new one,
// through restarts, and nothing else changes.
func TestShiftOwners(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "st")
	s := openStore(t, dir)
	if err := s.CreateSession("a", Owner{UID: 101000, GID: 101000}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteFile("a", "outputs/root", strings.NewReader("x"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	n, err := s.ShiftOwners(100000, 1<<30, 65536)
	if err != nil || n != 4 { // the session directory, inputs, outputs, .home
		t.Fatalf("ShiftOwners = %d, %v; want 4 inodes", n, err)
	}
	if n, _ := s.ShiftOwners(100000, 1<<30, 65536); n != 0 {
		t.Errorf("ShiftOwners again = %d, want 0", n)
	}
	s.Close()
	s = openStore(t, dir)
	defer s.Close()
	sess := s.sessions["a"]
	if _, home := sess.t.lookup(rootIno, HomeDir); home == nil || home.uid != 1<<30+1000 || home.gid != 1<<30+1000 {
		t.Errorf(".home after a restart: %+v, want owned by %d", home, 1<<30+1000)
	}
	outputs, _ := sess.t.lookup(rootIno, OutputsDir)
	if _, f := sess.t.lookup(outputs, "root"); f == nil || f.uid != 0 {
		t.Errorf("root's file: %+v, want it left to root", f)
	}
}
