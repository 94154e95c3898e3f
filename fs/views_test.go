package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// eventually calls fn until it returns nil or timeout passes, and then
// fails the test with fn's last error.
func eventually(t testing.TB, timeout time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// twoViews makes sessions a and b, mounts a host view and a view of a, and
// puts b/outputs/f (and b/.home/secret) in place through the host view.
func twoViews(t *testing.T) (s *Store, host, av string) {
	t.Helper()
	requireFUSE(t)
	s = testStore(t)
	mustSession(t, s, "a")
	mustSession(t, s, "b")
	host = mountView(t, s, ViewOptions{Host: true})
	av = mountView(t, s, ViewOptions{Session: "a"})
	for p, data := range map[string]string{
		"b/outputs/f":     "b's file",
		"b/.home/secret":  "b's secret",
		"a/.home/mine":    "a's own",
		"b/inputs/in.txt": "input",
	} {
		if err := os.WriteFile(filepath.Join(host, p), []byte(data), 0o644); err != nil {
			t.Fatalf("WriteFile(%q) through the host view = %v", p, err)
		}
	}
	if err := os.Mkdir(filepath.Join(host, "b/outputs/d"), 0o755); err != nil {
		t.Fatal(err)
	}
	return s, host, av
}

func TestViewOwnSessionWritable(t *testing.T) {
	s, host, av := twoViews(t)
	p := filepath.Join(av, "a/outputs/report.md")
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatalf("WriteFile(%q) = %v, want nil", p, err)
	}
	if err := os.MkdirAll(filepath.Join(av, "a/outputs/x/y"), 0o755); err != nil {
		t.Fatalf("MkdirAll in own session = %v", err)
	}
	if err := os.Rename(p, filepath.Join(av, "a/outputs/x/y/r.md")); err != nil {
		t.Fatalf("Rename in own session = %v", err)
	}
	if err := os.Chmod(filepath.Join(av, "a/outputs/x/y/r.md"), 0o600); err != nil {
		t.Fatalf("Chmod in own session = %v", err)
	}
	got, err := s.ReadFile("a", "", "outputs/x/y/r.md", 0)
	if err != nil || string(got) != "hello" {
		t.Fatalf("ReadFile(%q) = %q, %v, want %q", "outputs/x/y/r.md", got, err, "hello")
	}
	got, err = os.ReadFile(filepath.Join(host, "a/outputs/x/y/r.md"))
	if err != nil || string(got) != "hello" {
		t.Fatalf("host ReadFile = %q, %v, want %q", got, err, "hello")
	}
	if err := os.Remove(filepath.Join(av, "a/outputs/x/y/r.md")); err != nil {
		t.Fatalf("Remove in own session = %v", err)
	}
}

func TestViewForeignSessionReadOnly(t *testing.T) {
	_, host, av := twoViews(t)
	b := filepath.Join(av, "b")
	tests := []struct {
		name string
		op   func() error
		want []syscall.Errno // any of these
	}{
		{"overwrite", func() error { return os.WriteFile(filepath.Join(b, "outputs/f"), []byte("x"), 0o644) }, []syscall.Errno{syscall.EROFS}},
		{"open-rdwr", func() error {
			f, err := os.OpenFile(filepath.Join(b, "outputs/f"), os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			return err
		}, []syscall.Errno{syscall.EROFS}},
		{"append", func() error {
			f, err := os.OpenFile(filepath.Join(b, "outputs/f"), os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				f.Close()
			}
			return err
		}, []syscall.Errno{syscall.EROFS}},
		{"create", func() error { return os.WriteFile(filepath.Join(b, "outputs/new"), []byte("x"), 0o644) }, []syscall.Errno{syscall.EROFS}},
		{"create-in-session-dir", func() error { return os.WriteFile(filepath.Join(b, "new"), []byte("x"), 0o644) }, []syscall.Errno{syscall.EROFS}},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(b, "outputs/newdir"), 0o755) }, []syscall.Errno{syscall.EROFS}},
		{"mkfifo", func() error { return syscall.Mkfifo(filepath.Join(b, "outputs/fifo"), 0o644) }, []syscall.Errno{syscall.EROFS}},
		{"symlink", func() error { return os.Symlink("f", filepath.Join(b, "outputs/ln")) }, []syscall.Errno{syscall.EROFS}},
		{"link", func() error { return os.Link(filepath.Join(b, "outputs/f"), filepath.Join(b, "outputs/hard")) }, []syscall.Errno{syscall.EROFS}},
		{"remove", func() error { return os.Remove(filepath.Join(b, "outputs/f")) }, []syscall.Errno{syscall.EROFS}},
		{"rmdir", func() error { return os.Remove(filepath.Join(b, "outputs/d")) }, []syscall.Errno{syscall.EROFS}},
		{"rename-inside", func() error { return os.Rename(filepath.Join(b, "outputs/f"), filepath.Join(b, "outputs/g")) }, []syscall.Errno{syscall.EROFS}},
		{"rename-out-of-b", func() error { return os.Rename(filepath.Join(b, "outputs/f"), filepath.Join(av, "a/outputs/stolen")) }, []syscall.Errno{syscall.EROFS, syscall.EXDEV}},
		{"rename-into-b", func() error {
			if err := os.WriteFile(filepath.Join(av, "a/outputs/mine"), []byte("m"), 0o644); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			return os.Rename(filepath.Join(av, "a/outputs/mine"), filepath.Join(b, "outputs/mine"))
		}, []syscall.Errno{syscall.EROFS, syscall.EXDEV}},
		{"chmod", func() error { return os.Chmod(filepath.Join(b, "outputs/f"), 0o777) }, []syscall.Errno{syscall.EROFS}},
		{"chmod-dir", func() error { return os.Chmod(filepath.Join(b, "outputs"), 0o777) }, []syscall.Errno{syscall.EROFS}},
		{"chown", func() error { return os.Chown(filepath.Join(b, "outputs/f"), 1234, 1234) }, []syscall.Errno{syscall.EROFS}},
		{"truncate", func() error { return os.Truncate(filepath.Join(b, "outputs/f"), 0) }, []syscall.Errno{syscall.EROFS}},
		{"chtimes", func() error {
			return os.Chtimes(filepath.Join(b, "outputs/f"), time.Unix(1, 0), time.Unix(1, 0))
		}, []syscall.Errno{syscall.EROFS}},
		{"setxattr", func() error { return unix.Setxattr(filepath.Join(b, "outputs/f"), "user.x", []byte("1"), 0) }, []syscall.Errno{syscall.EROFS}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			ok := false
			for _, e := range tc.want {
				ok = ok || errors.Is(err, e)
			}
			if !ok {
				t.Errorf("%s in b from a's view = %v, want %v", tc.name, err, tc.want)
			}
		})
	}
	// Nothing in b changed.
	got, err := os.ReadFile(filepath.Join(host, "b/outputs/f"))
	if err != nil || string(got) != "b's file" {
		t.Errorf("b/outputs/f after the refused changes = %q, %v, want %q", got, err, "b's file")
	}
	ents, err := os.ReadDir(filepath.Join(host, "b/outputs"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"d", "f"}; !slices.Equal(names, want) {
		t.Errorf("b/outputs holds %q, want %q", names, want)
	}
	fi, err := os.Stat(filepath.Join(host, "b/outputs/f"))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("mode of b/outputs/f = %v, %v, want 0644", fi.Mode(), err)
	}
}

func TestViewForeignHomeHidden(t *testing.T) {
	_, _, av := twoViews(t)
	for _, p := range []string{"b/.home", "b/.home/secret"} {
		if _, err := os.Stat(filepath.Join(av, p)); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("Stat(%q) in a's view = %v, want ENOENT", p, err)
		}
	}
	if _, err := os.ReadFile(filepath.Join(av, "b/.home/secret")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("ReadFile(b/.home/secret) in a's view = %v, want ENOENT", err)
	}
	ents, err := os.ReadDir(filepath.Join(av, "b"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"inputs", "outputs"}; !slices.Equal(names, want) {
		t.Errorf("ReadDir(b) in a's view = %q, want %q", names, want)
	}
	// a's own home is there.
	ents, err = os.ReadDir(filepath.Join(av, "a"))
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{".home", "inputs", "outputs"}; !slices.Equal(names, want) {
		t.Errorf("ReadDir(a) in a's view = %q, want %q", names, want)
	}
	if got, err := os.ReadFile(filepath.Join(av, "a/.home/mine")); err != nil || string(got) != "a's own" {
		t.Errorf("ReadFile(a/.home/mine) = %q, %v, want %q", got, err, "a's own")
	}
}

// TestViewForeignHomeViaSymlink: a link in b that points at b's home does
// not reveal it to a.
func TestViewForeignHomeViaSymlink(t *testing.T) {
	_, host, av := twoViews(t)
	if err := os.Symlink("../.home", filepath.Join(host, "b/outputs/h")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(av, "b/outputs/h/secret")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("ReadFile(b/outputs/h/secret) in a's view = %v, want ENOENT", err)
	}
}

// TestViewSeesForeignWrites checks that a's view reads what b writes, and
// sees rewrites promptly, whoever writes them.
func TestViewSeesForeignWrites(t *testing.T) {
	writers := []struct {
		name  string
		write func(t *testing.T, s *Store, host, bv, p string, data []byte) error
	}{
		{"host-view", func(t *testing.T, s *Store, host, bv, p string, data []byte) error {
			return os.WriteFile(filepath.Join(host, "b", p), data, 0o644)
		}},
		{"b-view", func(t *testing.T, s *Store, host, bv, p string, data []byte) error {
			return os.WriteFile(filepath.Join(bv, "b", p), data, 0o644)
		}},
		{"b-view-in-place", func(t *testing.T, s *Store, host, bv, p string, data []byte) error {
			f, err := os.OpenFile(filepath.Join(bv, "b", p), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				return err
			}
			if _, err := f.WriteAt(data, 0); err != nil {
				f.Close()
				return err
			}
			fi, err := f.Stat()
			if err == nil && fi.Size() > int64(len(data)) {
				err = f.Truncate(int64(len(data)))
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			return err
		}},
		{"api", func(t *testing.T, s *Store, host, bv, p string, data []byte) error {
			_, err := s.WriteFile("b", p, bytes.NewReader(data), 0, Owner{})
			return err
		}},
	}
	versions := []string{"version one", "VERSION TWO", "version three is longer", "4"}
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			requireFUSE(t)
			s := testStore(t)
			mustSession(t, s, "a")
			mustSession(t, s, "b")
			host := mountView(t, s, ViewOptions{Host: true})
			av := mountView(t, s, ViewOptions{Session: "a"})
			bv := mountView(t, s, ViewOptions{Session: "b"})
			p := "outputs/shared.txt"
			for i, v := range versions {
				if err := w.write(t, s, host, bv, p, []byte(v)); err != nil {
					t.Fatalf("write %d (%q) = %v", i, v, err)
				}
				eventually(t, 1500*time.Millisecond, func() error {
					got, err := os.ReadFile(filepath.Join(av, "b", p))
					if err != nil || string(got) != v {
						return fmt.Errorf("ReadFile(%q) in a's view = %q, %v, want %q", p, got, err, v)
					}
					return nil
				})
				eventually(t, 1500*time.Millisecond, func() error {
					fi, err := os.Stat(filepath.Join(av, "b", p))
					if err != nil || fi.Size() != int64(len(v)) {
						return fmt.Errorf("Stat(%q) in a's view = %v, %v, want size %d", p, fi, err, len(v))
					}
					return nil
				})
			}
		})
	}
}

// TestViewSeesForeignWritesWhileOpen keeps a file of b open for reading in
// a's view while b rewrites it in place.
func TestViewSeesForeignWritesWhileOpen(t *testing.T) {
	_, host, av := twoViews(t)
	p := filepath.Join(av, "b/outputs/f")
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.WriteFile(filepath.Join(host, "b/outputs/f"), []byte("B'S FILE, AGAIN"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 1500*time.Millisecond, func() error {
		got, err := os.ReadFile(p)
		if err != nil || string(got) != "B'S FILE, AGAIN" {
			return fmt.Errorf("ReadFile(b/outputs/f) in a's view = %q, %v, want %q", got, err, "B'S FILE, AGAIN")
		}
		return nil
	})
}

func TestViewForeignModeBits(t *testing.T) {
	_, host, av := twoViews(t)
	if err := os.WriteFile(filepath.Join(host, "a/outputs/own"), []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(host, "b/outputs/f"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(host, "a/outputs/own"), 0o666); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path      string
		wantWrite bool
	}{
		{"b", false},
		{"b/outputs", false},
		{"b/outputs/f", false},
		{"b/outputs/d", false},
		{"b/inputs/in.txt", false},
		{"a", true},
		{"a/outputs", true},
		{"a/outputs/own", true},
	}
	for _, tc := range tests {
		eventually(t, 1500*time.Millisecond, func() error {
			fi, err := os.Lstat(filepath.Join(av, tc.path))
			if err != nil {
				return fmt.Errorf("Lstat(%q) = %v", tc.path, err)
			}
			if w := fi.Mode().Perm()&0o222 != 0; w != tc.wantWrite {
				return fmt.Errorf("mode of %q in a's view = %v, want write bits %v", tc.path, fi.Mode(), tc.wantWrite)
			}
			return nil
		})
	}
	// The host view shows b's real bits.
	fi, err := os.Stat(filepath.Join(host, "b/outputs/f"))
	if err != nil || fi.Mode().Perm() != 0o666 {
		t.Errorf("mode of b/outputs/f in the host view = %v, %v, want 0666", fi.Mode(), err)
	}
}

func TestViewMountRootRefusesChanges(t *testing.T) {
	_, host, av := twoViews(t)
	for _, mnt := range []struct{ name, dir string }{{"host", host}, {"a", av}} {
		tests := []struct {
			name string
			op   func() error
		}{
			{"mkdir", func() error { return os.Mkdir(filepath.Join(mnt.dir, "newsession"), 0o755) }},
			{"create", func() error { return os.WriteFile(filepath.Join(mnt.dir, "file"), nil, 0o644) }},
			{"symlink", func() error { return os.Symlink("a", filepath.Join(mnt.dir, "ln")) }},
			{"rename-session", func() error { return os.Rename(filepath.Join(mnt.dir, "a"), filepath.Join(mnt.dir, "c")) }},
			{"rmdir-session", func() error { return os.Remove(filepath.Join(mnt.dir, "b")) }},
		}
		for _, tc := range tests {
			t.Run(mnt.name+"/"+tc.name, func(t *testing.T) {
				if err := tc.op(); !errors.Is(err, syscall.EPERM) && !(mnt.name == "a" && errors.Is(err, syscall.EROFS)) {
					t.Errorf("%s at the mount root of the %s view = %v, want EPERM", tc.name, mnt.name, err)
				}
			})
		}
	}
	names := dirNames(t, host)
	if want := []string{"a", "b"}; !slices.Equal(names, want) {
		t.Errorf("mount root holds %q, want %q", names, want)
	}
}

func TestViewRenameAcrossSessions(t *testing.T) {
	_, host, _ := twoViews(t)
	tests := []struct{ from, to string }{
		{"b/outputs/f", "a/outputs/f"},
		{"b/outputs/d", "a/outputs/d"},
		{"b/outputs/f", "a/f"},
	}
	for _, tc := range tests {
		err := os.Rename(filepath.Join(host, tc.from), filepath.Join(host, tc.to))
		if !errors.Is(err, syscall.EXDEV) {
			t.Errorf("Rename(%q, %q) in the host view = %v, want EXDEV", tc.from, tc.to, err)
		}
	}
	err := os.Link(filepath.Join(host, "b/outputs/f"), filepath.Join(host, "a/outputs/hard"))
	if !errors.Is(err, syscall.EXDEV) {
		t.Errorf("Link across sessions = %v, want EXDEV", err)
	}
	if _, err := os.Stat(filepath.Join(host, "b/outputs/f")); err != nil {
		t.Errorf("b/outputs/f after a refused rename: %v", err)
	}
}

// TestViewConcurrentWriters has 8 goroutines write their own files and
// append records to one shared file with O_APPEND.
func TestViewConcurrentWriters(t *testing.T) {
	cases := []struct {
		name  string
		quota Quota // a byte quota keeps writes on the FUSE path
		opts  ViewOptions
	}{
		{"host-passthrough", Quota{}, ViewOptions{Host: true}},
		{"session-view", Quota{}, ViewOptions{Session: "w"}},
		{"quota-fuse-path", Quota{Bytes: 1 << 30}, ViewOptions{Session: "w"}},
	}
	const (
		workers = 8
		files   = 20
		appends = 200
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireFUSE(t)
			s := testStore(t)
			mustSession(t, s, "w")
			if err := s.SetQuota("w", tc.quota); err != nil {
				t.Fatal(err)
			}
			mnt := mountView(t, s, tc.opts)
			out := filepath.Join(mnt, "w/outputs")
			shared := filepath.Join(out, "shared.log")
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					af, err := os.OpenFile(shared, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
					if err != nil {
						errs <- err
						return
					}
					defer af.Close()
					for i := range appends {
						rec := fmt.Sprintf("w%d-%04d|\n", w, i) // 9 bytes
						if _, err := af.WriteString(rec); err != nil {
							errs <- fmt.Errorf("append: %w", err)
							return
						}
						if i%(appends/files) == 0 {
							j := i / (appends / files)
							p := filepath.Join(out, fmt.Sprintf("own-%d-%d", w, j))
							data := bytes.Repeat([]byte{byte('a' + w)}, 1000*(j+1))
							if err := os.WriteFile(p, data, 0o644); err != nil {
								errs <- err
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("writer: %v", err)
			}
			const recLen = 9
			check := func(read func(p string) ([]byte, error)) error {
				got, err := read("outputs/shared.log")
				if err != nil {
					return err
				}
				if len(got) != workers*appends*recLen {
					return fmt.Errorf("shared.log has %d bytes, want %d", len(got), workers*appends*recLen)
				}
				seen := map[string]bool{}
				for _, line := range strings.Split(strings.TrimSuffix(string(got), "\n"), "\n") {
					if len(line) != recLen-1 || line[len(line)-1] != '|' {
						return fmt.Errorf("shared.log has a torn record %q", line)
					}
					seen[line] = true
				}
				if len(seen) != workers*appends {
					return fmt.Errorf("shared.log has %d distinct records, want %d", len(seen), workers*appends)
				}
				for w := range workers {
					for j := range files {
						p := fmt.Sprintf("outputs/own-%d-%d", w, j)
						got, err := read(p)
						if err != nil {
							return err
						}
						if want := bytes.Repeat([]byte{byte('a' + w)}, 1000*(j+1)); !bytes.Equal(got, want) {
							return fmt.Errorf("%s has %d bytes, want %d of %q", p, len(got), len(want), rune('a'+w))
						}
					}
				}
				return nil
			}
			if err := check(func(p string) ([]byte, error) { return os.ReadFile(filepath.Join(mnt, "w", p)) }); err != nil {
				t.Errorf("through the mount: %v", err)
			}
			// Handles are released asynchronously after close.
			eventually(t, 2*time.Second, func() error {
				return check(func(p string) ([]byte, error) { return s.ReadFile("w", "", p, 0) })
			})
			eventually(t, 2*time.Second, func() error {
				info := s.Sessions()[0]
				if want := int64(workers*appends*recLen + workers*1000*files*(files+1)/2); info.Bytes != want {
					return fmt.Errorf("session Bytes = %d, want %d", info.Bytes, want)
				}
				return nil
			})
		})
	}
}
