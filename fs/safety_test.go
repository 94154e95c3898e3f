package fs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// stateFiles lists what the state directory holds besides data blobs,
// journals and checkpoints, which change with every write.
func stateFiles(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case rel == "blobs" && d.IsDir():
			return filepath.SkipDir
		case strings.HasPrefix(rel, "journal.") || rel == "checkpoint":
			return nil
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// symlinkFixture makes sessions s and b and plants symbolic links in
// s/outputs (through the host view) that point out of the session.
func symlinkFixture(t *testing.T) (st *Store, host, outside string) {
	t.Helper()
	requireFUSE(t)
	st = testStore(t)
	mustSession(t, st, "s")
	mustSession(t, st, "b")
	host = mountView(t, st, ViewOptions{Host: true})
	outside = filepath.Join(t.TempDir(), "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("outside secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	put(t, st, "b", "outputs/f", "b's file")
	links := map[string]string{
		"up":       "../../",
		"passwd":   "/etc/passwd",
		"other":    "../../b/outputs",
		"otherabs": filepath.Join(host, "b/outputs"),
		"out":      outside,
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(host, "s/outputs", name)); err != nil {
			t.Fatalf("Symlink(%q, %q) = %v", target, name, err)
		}
	}
	if err := os.Mkdir(filepath.Join(host, "s/outputs/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(host, "s/outputs/sub/deeplink")); err != nil {
		t.Fatal(err)
	}
	return st, host, outside
}

func TestSymlinksGoAPI(t *testing.T) {
	s, _, outside := symlinkFixture(t)
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	reads := []string{
		"outputs/up/b/outputs/f",
		"outputs/up/s/outputs/sub",
		"outputs/passwd",
		"outputs/other/f",
		"outputs/otherabs/f",
		"outputs/out/secret",
		"outputs/sub/deeplink/secret",
	}
	for _, p := range reads {
		if got, err := s.ReadFile("s", "", p, 0); !errors.Is(err, ErrSymlinkInPath) {
			t.Errorf("ReadFile(%q) = %q, %v, want ErrSymlinkInPath", p, got, err)
		}
	}
	writes := []string{
		"outputs/up/x",
		"outputs/up/b/outputs/x",
		"outputs/other/x",
		"outputs/otherabs/x",
		"outputs/out/x",
		"outputs/out/secret",
		"outputs/sub/deeplink/x",
		"outputs/passwd/x",
	}
	for _, p := range writes {
		if _, err := s.WriteFile("s", p, strings.NewReader("evil"), 0, Owner{}); !errors.Is(err, ErrSymlinkInPath) {
			t.Errorf("WriteFile(%q) = %v, want ErrSymlinkInPath", p, err)
		}
	}
	for _, p := range []string{"outputs/out/newdir", "outputs/other/newdir", "outputs/up/newdir", "outputs/sub/deeplink/a/b"} {
		if err := s.MkdirAll("s", p, Owner{}); err == nil {
			t.Errorf("MkdirAll(%q) = nil, want an error", p)
		}
	}
	// Writing at the link itself must not follow it: it fails or replaces
	// the link.
	for _, p := range []string{"outputs/passwd", "outputs/out"} {
		s.WriteFile("s", p, strings.NewReader("evil"), 0, Owner{})
	}
	if got, err := os.ReadFile("/etc/passwd"); err != nil || !bytes.Equal(got, passwd) {
		t.Errorf("/etc/passwd changed: %v", err)
	}
	if got := dirNames(t, outside); !slices.Equal(got, []string{"secret"}) {
		t.Errorf("outside directory holds %q after the refused writes, want [secret]", got)
	}
	if got, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(got) != "outside secret" {
		t.Errorf("outside secret = %q, %v", got, err)
	}
	wantFile(t, s, "b", "", "outputs/f", "b's file")
	for _, p := range []string{"outputs/x", "outputs/newdir"} {
		if _, err := s.ReadFile("b", "", p, 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("ReadFile(b, %q) = %v, want ErrNotFound", p, err)
		}
	}
	// The same paths in a snapshot are refused the same way.
	mustSnapshot(t, s, "s", "snap")
	for _, p := range reads {
		if got, err := s.ReadFile("s", "snap", p, 0); !errors.Is(err, ErrSymlinkInPath) {
			t.Errorf("ReadFile(snap, %q) = %q, %v, want ErrSymlinkInPath", p, got, err)
		}
	}
}

func TestSymlinksThroughMount(t *testing.T) {
	s, host, outside := symlinkFixture(t)
	sv := mountView(t, s, ViewOptions{Session: "s"})
	before := stateFiles(t, s.dir)

	// A link resolves in the caller's namespace, as POSIX says.
	if err := os.WriteFile(filepath.Join(sv, "s/outputs/out/x"), []byte("through the link"), 0o644); err != nil {
		t.Fatalf("write through the link to the outside: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(outside, "x")); err != nil || string(got) != "through the link" {
		t.Errorf("outside/x = %q, %v, want %q", got, err, "through the link")
	}
	if got, err := os.ReadFile(filepath.Join(sv, "s/outputs/sub/deeplink/secret")); err != nil || string(got) != "outside secret" {
		t.Errorf("read through deeplink = %q, %v", got, err)
	}
	// "../../" leads to the mount root, where b is read-only to s. (The
	// absolute link otherabs names the host view, which is writable.)
	if got, err := os.ReadFile(filepath.Join(sv, "s/outputs/up/b/outputs/f")); err != nil || string(got) != "b's file" {
		t.Errorf("read b through up = %q, %v, want %q", got, err, "b's file")
	}
	for _, p := range []string{"s/outputs/up/b/outputs/x", "s/outputs/other/x"} {
		if err := os.WriteFile(filepath.Join(sv, p), []byte("evil"), 0o644); !errors.Is(err, syscall.EROFS) {
			t.Errorf("WriteFile(%q) in s's view = %v, want EROFS", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(host, "b/outputs/x")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("b/outputs/x after refused writes: %v, want ENOENT", err)
	}
	after := stateFiles(t, s.dir)
	if !slices.Equal(before, after) {
		t.Errorf("state directory besides blobs and journals changed: before %q, after %q", before, after)
	}
	// Nothing named like the written file appears in the store.
	filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "x" {
			t.Errorf("the store holds %s", p)
		}
		return nil
	})
	if got := dirNames(t, outside); !slices.Equal(got, []string{"secret", "x"}) {
		t.Errorf("outside holds %q, want [secret x]", got)
	}
}

func TestBadNamesGoAPI(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	long := strings.Repeat("n", MaxNameLen+1)
	deep := strings.Repeat("d/", MaxPathLen/2) + "f" // 4097 bytes
	bad := []string{
		"",
		"/",
		".",
		"..",
		"../x",
		"outputs/../../x",
		"outputs/..",
		"outputs/a\x00b",
		"\x00",
		"outputs/" + long,
		long,
		deep,
	}
	for _, p := range bad {
		if _, err := s.WriteFile("s", p, strings.NewReader("x"), 0, Owner{}); !errors.Is(err, ErrBadName) {
			t.Errorf("WriteFile(%.60q) = %v, want ErrBadName", p, err)
		}
		if err := s.MkdirAll("s", p, Owner{}); !errors.Is(err, ErrBadName) {
			t.Errorf("MkdirAll(%.60q) = %v, want ErrBadName", p, err)
		}
		if _, err := s.ReadFile("s", "", p, 0); !errors.Is(err, ErrBadName) {
			t.Errorf("ReadFile(%.60q) = %v, want ErrBadName", p, err)
		}
	}
	if si := s.Sessions()[0]; si.Files != 4 {
		t.Errorf("session holds %d inodes after refused writes, want 4", si.Files)
	}
	// The limits themselves are fine.
	okName := "outputs/" + strings.Repeat("n", MaxNameLen)
	put(t, s, "s", okName, "max name")
	wantFile(t, s, "s", "", okName, "max name")
	okPath := "outputs/" + strings.Repeat("d/", (MaxPathLen-len("outputs/")-1)/2)
	okPath = okPath[:len(okPath)-1]
	if err := s.MkdirAll("s", okPath, Owner{}); err != nil {
		t.Errorf("MkdirAll of a %d-byte path = %v", len(okPath), err)
	}
}

func TestBadNamesThroughMount(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	o := filepath.Join(mnt, "s/outputs")
	if err := os.WriteFile(filepath.Join(o, "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("n", MaxNameLen+1)
	tests := []struct {
		name string
		op   func() error
	}{
		{"create", func() error { return os.WriteFile(filepath.Join(o, long), nil, 0o644) }},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(o, long), 0o755) }},
		{"symlink", func() error { return os.Symlink("f", filepath.Join(o, long)) }},
		{"mkfifo", func() error { return syscall.Mkfifo(filepath.Join(o, long), 0o644) }},
		{"rename", func() error { return os.Rename(filepath.Join(o, "f"), filepath.Join(o, long)) }},
		{"link", func() error { return os.Link(filepath.Join(o, "f"), filepath.Join(o, long)) }},
		{"stat", func() error { _, err := os.Stat(filepath.Join(o, long)); return err }},
	}
	for _, tc := range tests {
		if err := tc.op(); !errors.Is(err, syscall.ENAMETOOLONG) {
			t.Errorf("%s of a %d-byte name through the mount = %v, want ENAMETOOLONG", tc.name, len(long), err)
		}
	}
	if got := dirNames(t, o); !slices.Equal(got, []string{"f"}) {
		t.Errorf("outputs holds %q after refused names, want [f]", got)
	}
	// A name of the limit works.
	okName := strings.Repeat("n", MaxNameLen)
	if err := os.WriteFile(filepath.Join(o, okName), []byte("ok"), 0o644); err != nil {
		t.Errorf("create of a %d-byte name = %v", len(okName), err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(o, &st); err != nil || st.Namelen != MaxNameLen {
		t.Errorf("Statfs Namelen = %d, %v, want %d", st.Namelen, err, MaxNameLen)
	}
}

func TestQuotaInodes(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	const limit = 10
	if err := s.SetQuota("s", Quota{Inodes: limit}); err != nil {
		t.Fatal(err)
	}
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	o := filepath.Join(mnt, "s/outputs")
	base := s.Sessions()[0].Files // the session directory and its three
	made := 0
	var err error
	for i := range 20 {
		if err = os.WriteFile(filepath.Join(o, fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
			break
		}
		made++
	}
	if !errors.Is(err, syscall.EDQUOT) {
		t.Errorf("create past the inode quota = %v, want EDQUOT", err)
	}
	if want := limit - int(base); made != want {
		t.Errorf("made %d files under an inode quota of %d (base %d), want %d", made, limit, base, want)
	}
	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"mkdir", func() error { return os.Mkdir(filepath.Join(o, "d"), 0o755) }},
		{"symlink", func() error { return os.Symlink("f0", filepath.Join(o, "ln")) }},
		{"mkfifo", func() error { return syscall.Mkfifo(filepath.Join(o, "fifo"), 0o644) }},
		{"api-write", func() error {
			_, err := s.WriteFile("s", "outputs/api", strings.NewReader("x"), 0, Owner{})
			if errors.Is(err, ErrQuota) {
				return syscall.EDQUOT
			}
			return err
		}},
		{"api-mkdir", func() error {
			err := s.MkdirAll("s", "outputs/apidir", Owner{})
			if errors.Is(err, ErrQuota) {
				return syscall.EDQUOT
			}
			return err
		}},
	} {
		if err := tc.op(); !errors.Is(err, syscall.EDQUOT) {
			t.Errorf("%s past the inode quota = %v, want EDQUOT / ErrQuota", tc.name, err)
		}
	}
	if f := s.Sessions()[0].Files; f != limit {
		t.Errorf("session Files = %d, want %d", f, limit)
	}
	// A hard link makes no inode; a rewrite of an existing file is fine.
	if err := os.Link(filepath.Join(o, "f0"), filepath.Join(o, "hard")); err != nil {
		t.Errorf("Link under a full inode quota = %v", err)
	}
	if err := os.WriteFile(filepath.Join(o, "f1"), []byte("rewritten"), 0o644); err != nil {
		t.Errorf("rewrite under a full inode quota = %v", err)
	}
	put(t, s, "s", "outputs/f2", "rewritten by the API")
	// Freeing one makes room for one.
	if err := os.Remove(filepath.Join(o, "f3")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o, "again"), []byte("x"), 0o644); err != nil {
		t.Errorf("create after a remove = %v", err)
	}
	if err := os.WriteFile(filepath.Join(o, "again2"), []byte("x"), 0o644); !errors.Is(err, syscall.EDQUOT) {
		t.Errorf("create past the quota again = %v, want EDQUOT", err)
	}
}

func TestQuotaBytes(t *testing.T) {
	const quota = 1 << 20
	twoMiB := bytes.Repeat([]byte("q"), 2<<20)
	tests := []struct {
		name string
		op   func(p string) error
	}{
		{"write", func(p string) error { return os.WriteFile(p, twoMiB, 0o644) }},
		{"write-chunks", func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			for off := 0; off < len(twoMiB); off += 64 << 10 {
				if _, err := f.Write(twoMiB[off : off+64<<10]); err != nil {
					return err
				}
			}
			return nil
		}},
		{"append", func(p string) error {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				return err
			}
			defer f.Close()
			for off := 0; off < len(twoMiB); off += 256 << 10 {
				if _, err := f.Write(twoMiB[off : off+256<<10]); err != nil {
					return err
				}
			}
			return nil
		}},
		{"sparse-pwrite", func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("x"), 2<<20)
			return err
		}},
		{"truncate-up", func(p string) error {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
			return os.Truncate(p, 2<<20)
		}},
		{"fallocate", func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return unix.Fallocate(int(f.Fd()), 0, 0, 2<<20)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			mustSession(t, s, "s")
			if err := s.SetQuota("s", Quota{Bytes: quota}); err != nil {
				t.Fatal(err)
			}
			mnt := mountView(t, s, ViewOptions{Session: "s"})
			err := tc.op(filepath.Join(mnt, "s/outputs/big"))
			if !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("%s of 2 MiB under a 1 MiB quota = %v, want EDQUOT or ENOSPC", tc.name, err)
			}
			time.Sleep(50 * time.Millisecond) // let the release settle sizes
			if b := s.Sessions()[0].Bytes; b > quota {
				t.Errorf("session Bytes = %d, want <= %d", b, quota)
			}
			if got, err := s.ReadFile("s", "", "outputs/big", 0); err == nil && len(got) > quota {
				t.Errorf("outputs/big holds %d bytes, want <= %d", len(got), quota)
			}
		})
	}
}

func TestQuotaBytesGoAPI(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	if err := s.SetQuota("s", Quota{Bytes: 1000}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetQuota("s", Quota{Bytes: -1}); err == nil {
		t.Errorf("SetQuota with a negative limit = nil, want an error")
	}
	if err := s.SetQuota("nosuch", Quota{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetQuota of a missing session = %v, want ErrNotFound", err)
	}
	if _, err := s.WriteFile("s", "outputs/big", bytes.NewReader(make([]byte, 1001)), 0, Owner{}); !errors.Is(err, ErrQuota) {
		t.Errorf("WriteFile of 1001 bytes under a 1000-byte quota = %v, want ErrQuota", err)
	}
	if _, err := s.WriteFile("s", "outputs/limited", bytes.NewReader(make([]byte, 20)), 10, Owner{}); !errors.Is(err, ErrQuota) {
		t.Errorf("WriteFile of 20 bytes with limit 10 = %v, want ErrQuota", err)
	}
	if n, err := s.WriteFile("s", "outputs/a", bytes.NewReader(make([]byte, 600)), 0, Owner{}); err != nil || n != 600 {
		t.Errorf("WriteFile of 600 bytes = %d, %v", n, err)
	}
	if _, err := s.WriteFile("s", "outputs/b", bytes.NewReader(make([]byte, 600)), 0, Owner{}); !errors.Is(err, ErrQuota) {
		t.Errorf("WriteFile of another 600 bytes = %v, want ErrQuota", err)
	}
	if b := s.Sessions()[0].Bytes; b != 600 {
		t.Errorf("session Bytes = %d, want 600", b)
	}
	for _, p := range []string{"outputs/big", "outputs/limited", "outputs/b"} {
		if _, err := s.ReadFile("s", "", p, 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("ReadFile(%q) after a refused write = %v, want ErrNotFound", p, err)
		}
	}
	// No blob is left behind by the refused writes.
	time.Sleep(100 * time.Millisecond)
	if n := len(treeBlobs(t, s, "s", "")); n != 1 {
		t.Errorf("live tree holds %d blobs, want 1", n)
	}
}

// TestQuotaReplaceFile: replacing a file with one of the same size does
// not grow the session, so the quota allows it.
func TestQuotaReplaceFile(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	if err := s.SetQuota("s", Quota{Bytes: 1000}); err != nil {
		t.Fatal(err)
	}
	put(t, s, "s", "outputs/a", strings.Repeat("1", 600))
	_, err := s.WriteFile("s", "outputs/a", strings.NewReader(strings.Repeat("2", 600)), 0, Owner{})
	if err != nil {
		t.Fatalf("WriteFile replacing 600 bytes with 600 under a 1000-byte quota = %v, want nil", err)
	}
	wantFile(t, s, "s", "", "outputs/a", strings.Repeat("2", 600))
}

// TestQuotaSetWhileWriterOpen: a byte quota set while a file is open for
// writing must either be refused or still bound what that handle adds.
func TestQuotaSetWhileWriterOpen(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	f, err := os.Create(filepath.Join(mnt, "s/outputs/big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("start")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetQuota("s", Quota{Bytes: 1 << 20}); err != nil {
		if !errors.Is(err, ErrBusy) {
			t.Errorf("SetQuota with a file open = %v, want nil or ErrBusy", err)
		}
		// Refused while files are open: nothing can bypass it. Once they
		// are closed it works.
		f.Close()
		eventually(t, 2*time.Second, func() error { return s.SetQuota("s", Quota{Bytes: 1 << 20}) })
		return
	}
	_, werr := f.Write(make([]byte, 2<<20))
	f.Close()
	time.Sleep(100 * time.Millisecond)
	b := s.Sessions()[0].Bytes
	if werr == nil || b > 1<<20 {
		t.Errorf("2 MiB written through a handle opened before a 1 MiB quota: write error %v, session Bytes %d, want EDQUOT and <= %d", werr, b, 1<<20)
	}
}

func nextEvent(t testing.TB, sub *Subscription, sess string) Event {
	t.Helper()
	timeout := time.After(3 * time.Second)
	for {
		select {
		case ev, ok := <-sub.C:
			if !ok {
				t.Fatal("subscription closed")
			}
			if ev.Session == sess {
				return ev
			}
		case <-timeout:
			t.Fatal("no event within 3s")
		}
	}
}

func TestEvents(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	sub := s.Events().Subscribe(100)
	defer sub.Close()
	o := filepath.Join(mnt, "s/outputs")

	f, err := os.Create(filepath.Join(o, "e.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := []Event{
		{Session: "s", Path: "outputs/e.txt", Op: OpCreated},
		{Session: "s", Path: "outputs/e.txt", Op: OpWritten},
		{Session: "s", Path: "outputs/e.txt", Op: OpClosed},
	}
	for _, w := range want {
		if ev := nextEvent(t, sub, "s"); ev.Op != w.Op || ev.Path != w.Path || ev.OldPath != w.OldPath || ev.Time.IsZero() {
			t.Fatalf("event = %+v, want %+v", ev, w)
		}
	}
	if err := os.Mkdir(filepath.Join(o, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(o, "e.txt"), filepath.Join(o, "sub/e2.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(o, "sub/e2.txt")); err != nil {
		t.Fatal(err)
	}
	// Opening for reading only says nothing; an API write says written.
	if _, err := os.ReadFile(filepath.Join(mnt, "s/outputs/sub")); err == nil {
		t.Fatal("ReadFile of a directory worked")
	}
	put(t, s, "s", "inputs/api.txt", "api")
	if err := os.Remove(filepath.Join(o, "sub")); err != nil {
		t.Fatal(err)
	}
	want = []Event{
		{Session: "s", Path: "outputs/sub", Op: OpCreated},
		{Session: "s", Path: "outputs/sub/e2.txt", OldPath: "outputs/e.txt", Op: OpRenamed},
		{Session: "s", Path: "outputs/sub/e2.txt", Op: OpRemoved},
		{Session: "s", Path: "inputs/api.txt", Op: OpCreated},
		{Session: "s", Path: "inputs/api.txt", Op: OpWritten},
		{Session: "s", Path: "outputs/sub", Op: OpRemoved},
	}
	for _, w := range want {
		if ev := nextEvent(t, sub, "s"); ev.Op != w.Op || ev.Path != w.Path || ev.OldPath != w.OldPath {
			t.Fatalf("event = %+v, want %+v", ev, w)
		}
	}
	select {
	case ev := <-sub.C:
		t.Errorf("unexpected event %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
	sub.Close()
	sub.Close() // idempotent
	if _, ok := <-sub.C; ok {
		t.Error("C still open after Close")
	}
}

// TestSubscribeSettled: the kernel tells the store a file was closed
// (a release) after close(2) has returned. A subscriber that comes
// between gets no written event for that write: SubscribeSettled
// announces it to the subscribers before it, once (the release adds
// none). A write made durable with fsync before the close is announced
// too; a file open at the call and written after it is announced at its
// close.
func TestSubscribeSettled(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	all := s.Events().Subscribe(1 << 12)
	defer all.Close()
	// untilClosed returns the written events sub has for p by the time
	// all has p's closed event (the release).
	untilClosed := func(sub *Subscription, p string) (written int) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for closed := false; !closed; {
			select {
			case ev := <-all.C:
				if ev.Path == p {
					if ev.Op == OpWritten && sub == all {
						written++
					}
					closed = ev.Op == OpClosed
				}
			case <-timeout:
				t.Fatalf("no closed event for %s within 10s", p)
			}
		}
		for sub != all {
			select {
			case ev := <-sub.C:
				if ev.Path == p && ev.Op == OpWritten {
					written++
				}
			default:
				return written
			}
		}
		return written
	}
	for i := range 200 {
		p := fmt.Sprintf("outputs/f%d", i)
		f, err := os.Create(filepath.Join(mnt, "s", p))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("data"); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		late := s.SubscribeSettled("s", 16)
		// Written again once late subscribed: late hears of this one.
		if n := untilClosed(late, p); n != 0 {
			t.Fatalf("file %d (fsync: %v): a subscriber that came after its close got %d written events, want 0", i, i%2 == 1, n)
		}
		late.Close()
	}
	p := "outputs/again"
	f, err := os.Create(filepath.Join(mnt, "s", p))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("before")
	late := s.SubscribeSettled("s", 16)
	f.WriteString(" and after")
	f.Close()
	if n := untilClosed(late, p); n != 1 {
		t.Errorf("a file open at the call and written after it: %d written events for the late subscriber, want 1", n)
	}
	late.Close()
	p = "outputs/once"
	if err := os.WriteFile(filepath.Join(mnt, "s", p), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	late = s.SubscribeSettled("s", 16)
	defer late.Close()
	if n := untilClosed(all, p); n != 1 {
		t.Errorf("%d written events for one write, settled by a subscriber's arrival and then released, want 1", n)
	}
	p = "outputs/synced"
	if f, err = os.Create(filepath.Join(mnt, "s", p)); err != nil {
		t.Fatal(err)
	}
	f.WriteString("durable")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if n := untilClosed(all, p); n != 1 {
		t.Errorf("%d written events for a file written, synced and closed, want 1", n)
	}
}

func TestEventsSlowSubscriber(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mnt := mountView(t, s, ViewOptions{Session: "s"})
	slow := s.Events().Subscribe(1) // never read until the end
	defer slow.Close()
	fast := s.Events().Subscribe(10000)
	defer fast.Close()
	const n = 1000
	done := make(chan error, 1)
	go func() {
		for i := range n {
			if err := os.WriteFile(filepath.Join(mnt, "s/outputs", fmt.Sprintf("f%04d", i)), []byte("x"), 0o644); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("1000 creations with a stalled subscriber did not finish in 60s")
	}
	// The fast subscriber saw every creation and every close (closes come
	// asynchronously, after the kernel releases the handle).
	created, closed := 0, 0
	timeout := time.After(5 * time.Second)
	for created < n || closed < n {
		select {
		case ev := <-fast.C:
			switch ev.Op {
			case OpCreated:
				created++
			case OpClosed:
				closed++
			}
			if ev.Dropped != 0 {
				t.Fatalf("fast subscriber dropped %d events", ev.Dropped)
			}
		case <-timeout:
			t.Fatalf("fast subscriber got %d created and %d closed events, want %d", created, closed, n)
		}
	}
	// The slow one holds the first event, then learns what it missed.
	first := <-slow.C
	if first.Dropped != 0 || first.Op != OpCreated || first.Path != "outputs/f0000" {
		t.Errorf("first buffered event = %+v, want created outputs/f0000 with Dropped 0", first)
	}
	put(t, s, "s", "outputs/later", "x")
	var later Event
	select {
	case later = <-slow.C:
	case <-time.After(3 * time.Second):
		t.Fatal("no event for the slow subscriber after it read")
	}
	if later.Dropped < n {
		t.Errorf("later event %+v reports Dropped %d, want >= %d", later, later.Dropped, n)
	}
	// It keeps receiving. (The written event of that put found the buffer
	// full again, and so may its closed event, which comes when the
	// kernel releases the file: the next event reports one drop or two.)
	put(t, s, "s", "outputs/later2", "x")
	select {
	case ev := <-slow.C:
		if ev.Path != "outputs/later2" || ev.Dropped < 1 || ev.Dropped > 2 {
			t.Errorf("next event = %+v, want outputs/later2 with Dropped 1 or 2", ev)
		}
	case <-time.After(3 * time.Second):
		t.Error("no further event for the slow subscriber")
	}
}

func TestEventsAfterClose(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "state"))
	sub := s.Events().Subscribe(10)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-sub.C:
		if ok {
			t.Error("event after Close, want C closed")
		}
	case <-time.After(time.Second):
		t.Error("C not closed by Store.Close")
	}
	sub.Close()
	late := s.Events().Subscribe(1)
	if _, ok := <-late.C; ok {
		t.Error("Subscribe after Close: C open, want closed")
	}
	late.Close()
}
