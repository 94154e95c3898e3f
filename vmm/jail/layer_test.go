package jail

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireLayer skips tests that cannot make limited layers here.
func requireLayer(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("layer tests need root (loop devices and mounts)")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("layer tests need mkfs.ext4 (Debian package e2fsprogs)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("layer tests need /dev/loop-control (the loop driver)")
	}
}

// newTestLayer makes a layer in a fresh machine dir, removed at cleanup.
func newTestLayer(t testing.TB, limit int64) *layer {
	t.Helper()
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "machine")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := newLayer(dir, limit, filepath.Join(tmp, "templates"))
	if err != nil {
		t.Fatalf("newLayer(%q, %d) = %v", dir, limit, err)
	}
	t.Cleanup(func() {
		if err := l.Remove(); err != nil {
			t.Errorf("Remove() = %v", err)
		}
	})
	return l
}

// overlayMount is a machine's root as the guest agent mounts it.
type overlayMount struct {
	t   testing.TB
	dir string
}

func mountOverlay(t testing.TB, lower string, l *layer) *overlayMount {
	t.Helper()
	m := &overlayMount{t: t, dir: t.TempDir()}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,%s", lower, l.Upper(), l.Work(), overlayXattrs)
	if err := unix.Mount("overlay", m.dir, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay %s: %v", opts, err)
	}
	t.Cleanup(func() { unix.Unmount(m.dir, unix.MNT_DETACH) })
	return m
}

func (m *overlayMount) unmount() {
	m.t.Helper()
	if err := unix.Unmount(m.dir, 0); err != nil {
		m.t.Fatalf("unmount overlay: %v", err)
	}
}

// testLower makes a small image root.
func testLower(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "lower")
	for path, data := range map[string]string{
		"keep.txt": "keep", "del.txt": "delete me", "dir/a": "a", "dir/b": "b", "sub/x": "x",
	} {
		mustWrite(t, filepath.Join(root, path), data)
	}
	return root
}

func mustWrite(t testing.TB, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// changeRoot makes, in a mounted overlay root, every kind of change
// overlayfs records in its upper directory.
func changeRoot(t testing.TB, root string) {
	t.Helper()
	p := func(name string) string { return filepath.Join(root, name) }
	mustWrite(t, p("keep.txt"), "changed")        // copy-up
	mustWrite(t, p("new.txt"), "new")             // new file
	must(t, os.Link(p("new.txt"), p("link.txt"))) // hard link
	must(t, os.Symlink("new.txt", p("sym")))      // symlink
	must(t, os.Remove(p("del.txt")))              // whiteout
	must(t, os.RemoveAll(p("dir")))               // whiteout of a directory ...
	mustWrite(t, p("dir/c"), "c")                 // ... made again: opaque
	must(t, os.Rename(p("sub/x"), p("sub/y")))    // copy-up and whiteout
	mustWrite(t, p("owned.txt"), "agent's")       // owner and mode
	must(t, os.Chown(p("owned.txt"), 1000, 1000)) //
	must(t, os.Chmod(p("owned.txt"), 0o640))      //
	must(t, unix.Lsetxattr(p("new.txt"), "user.note", []byte("hi"), 0))
	must(t, os.Mkdir(p("private"), 0o700))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(t, os.Chtimes(p("owned.txt"), old, old))
}

// checkUpperMarks checks that an upper directory (or a copy of one)
// holds the whiteouts and opaque directory changeRoot makes.
func checkUpperMarks(t testing.TB, upper string) {
	t.Helper()
	for _, name := range []string{"del.txt", "sub/x"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, name), &st); err != nil {
			t.Errorf("whiteout %s: %v", name, err)
		} else if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("%s: mode %o rdev %d, want a whiteout (character device 0/0)", name, st.Mode, st.Rdev)
		}
	}
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(filepath.Join(upper, "dir"), "user.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("Lgetxattr(dir, user.overlay.opaque) = %q, %v, want \"y\"", buf[:max(n, 0)], err)
	}
}

// tree describes every file under root: type and mode, owner, mtime,
// size, content, link target, link count and xattrs.
func tree(t testing.TB, root string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode=%o owner=%d:%d mtime=%d rdev=%d xattrs=%v", st.Mode, st.Uid, st.Gid,
			st.Mtim.Nano(), st.Rdev, xattrs(t, path))
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" nlink=%d data=%q", st.Nlink, b)
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			desc += " target=" + target
		}
		rel, _ := filepath.Rel(root, path)
		files[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return files
}

func xattrs(t testing.TB, path string) []string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		t.Fatalf("Llistxattr(%q) = %v", path, err)
	}
	var attrs []string
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		val := make([]byte, 4096)
		m, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			t.Fatalf("Lgetxattr(%q, %q) = %v", path, name, err)
		}
		attrs = append(attrs, name+"="+string(val[:m]))
	}
	slices.Sort(attrs)
	return attrs
}

func diffTrees(t testing.TB, what string, got, want map[string]string) {
	t.Helper()
	for name, w := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("%s: %s missing, want %s", what, name, w)
		} else if g != w {
			t.Errorf("%s: %s is\n\t%s\nwant\n\t%s", what, name, g, w)
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: unexpected %s: %s", what, name, g)
		}
	}
}

// mountsUnder returns the mount points in this process's namespace at
// or below dir.
func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var found []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 &&
			(fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			found = append(found, fields[4])
		}
	}
	return found
}

// loopsBackedBy returns the loop devices bound to file.
func loopsBackedBy(t testing.TB, file string) []string {
	t.Helper()
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var found []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == file {
			found = append(found, p)
		}
	}
	return found
}

// fill writes to a new file in dir until max bytes or an error, and
// returns how many bytes were written.
func fill(dir string, max int64) (int64, error) {
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i) // not zeros, in case anything is clever about them
	}
	var written int64
	for written < max {
		n, err := f.Write(chunk)
		written += int64(n)
		if err != nil {
			return written, err
		}
	}
	return written, f.Sync()
}

func TestLayerLimit(t *testing.T) {
	requireLayer(t)
	// Not smaller: ext4's journal is at least 4 MiB, 1/8 of 32 MiB.
	const limit = 64 << 20
	l := newTestLayer(t, limit)
	n, err := fill(l.Upper(), 2*limit)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("writing %d bytes to a %d-byte layer: %v, want ENOSPC", n, limit, err)
	}
	if n < limit*8/10 || n > limit {
		t.Errorf("wrote %d bytes (%.2f of the limit) before ENOSPC, want 0.8 to 1.0", n, float64(n)/limit)
	}
	t.Logf("wrote %d bytes (%.3f of the %d-byte limit) before ENOSPC", n, float64(n)/limit, limit)
	used, max, err := l.Usage()
	if err != nil || max > limit || used < n || used > max {
		t.Errorf("Usage() = %d, %d, %v; want %d <= used <= max <= %d", used, max, err, n, limit)
	}
	if st, err := os.Stat(l.img); err != nil || st.Size() != limit {
		t.Errorf("image size = %v, %v; want %d", st.Size(), err, limit)
	}

	unlimited := newTestLayer(t, 0)
	if n, err := fill(unlimited.Upper(), limit+limit/2); err != nil {
		t.Errorf("unlimited layer took %d bytes, then %v", n, err)
	}
	if used, max, err := unlimited.Usage(); used != -1 || max != 0 || err != nil {
		t.Errorf("unlimited Usage() = %d, %d, %v; want -1, 0, nil", used, max, err)
	}
}

func TestLayerLimitTooSmall(t *testing.T) {
	for _, limit := range []int64{-1, 1, minLayerLimit - 1} {
		if l, err := newLayer(t.TempDir(), limit, t.TempDir()); err == nil {
			l.Remove()
			t.Errorf("newLayer(limit %d) = nil error, want one", limit)
		}
	}
}

func TestLayerNewTwice(t *testing.T) {
	requireLayer(t)
	for _, first := range []int64{0, 32 << 20} {
		l := newTestLayer(t, first)
		mustWrite(t, filepath.Join(l.Upper(), "data"), "kept")
		for _, second := range []int64{0, 32 << 20} {
			if _, err := newLayer(l.dir, second, t.TempDir()); !errors.Is(err, fs.ErrExist) {
				t.Errorf("newLayer(limit %d) over a layer of limit %d = %v, want ErrExist", second, first, err)
			}
		}
		if b, err := os.ReadFile(filepath.Join(l.Upper(), "data")); string(b) != "kept" {
			t.Errorf("layer of limit %d after a second newLayer: data = %q, %v; want \"kept\"", first, b, err)
		}
	}
}

func TestLayerCheckpointRestore(t *testing.T) {
	requireLayer(t)
	for _, tc := range []struct {
		name  string
		limit int64
	}{{"unlimited", 0}, {"limited", 64 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			lower := testLower(t)
			l := newTestLayer(t, tc.limit)
			m := mountOverlay(t, lower, l)
			changeRoot(t, m.dir)
			want := tree(t, m.dir)
			m.unmount()
			checkUpperMarks(t, l.Upper())

			ckpt := filepath.Join(t.TempDir(), "ckpt")
			if err := l.Checkpoint(ckpt); err != nil {
				t.Fatalf("Checkpoint(%q) = %v", ckpt, err)
			}
			checkUpperMarks(t, ckpt)
			if err := l.Checkpoint(ckpt); !errors.Is(err, fs.ErrExist) {
				t.Errorf("Checkpoint(%q) again = %v, want ErrExist", ckpt, err)
			}

			m = mountOverlay(t, lower, l)
			must(t, os.Remove(filepath.Join(m.dir, "keep.txt")))
			must(t, os.Remove(filepath.Join(m.dir, "dir/c")))
			must(t, os.Chmod(filepath.Join(m.dir, "new.txt"), 0o600))
			mustWrite(t, filepath.Join(m.dir, "extra.txt"), strings.Repeat("x", 1<<20))
			mustWrite(t, filepath.Join(m.dir, "dir/b"), "b again")
			m.unmount()

			if err := l.Restore(ckpt); err != nil {
				t.Fatalf("Restore(%q) = %v", ckpt, err)
			}
			if ents, err := os.ReadDir(l.Work()); err != nil || len(ents) != 0 {
				t.Errorf("work dir after Restore: %v, %v; want empty", ents, err)
			}
			m = mountOverlay(t, lower, l)
			diffTrees(t, "restored root", tree(t, m.dir), want)
			m.unmount()
		})
	}
}

func TestLayerMerge(t *testing.T) {
	requireLayer(t)
	lower := testLower(t)
	l := newTestLayer(t, 64<<20) // the upper on a filesystem of its own, as in use
	m := mountOverlay(t, lower, l)
	changeRoot(t, m.dir)
	want := tree(t, m.dir)
	m.unmount()

	dst := filepath.Join(t.TempDir(), "merged")
	if err := mergeLayers(lower, l.Upper(), dst); err != nil {
		t.Fatalf("mergeLayers(%q, %q, %q) = %v", lower, l.Upper(), dst, err)
	}
	diffTrees(t, "merged root", tree(t, dst), want)

	got := tree(t, dst)
	for _, name := range []string{"del.txt", "dir/a", "dir/b", "sub/x"} {
		if d, ok := got[name]; ok {
			t.Errorf("merged root has %s (%s), want it deleted", name, d)
		}
	}
	for name, prefix := range map[string]string{
		"dir/c":     "mode=100644 owner=0:0",
		"owned.txt": "mode=100640 owner=1000:1000 mtime=981173106000000000",
		"sym":       "mode=120777",
		"sub/y":     "mode=100644",
		"private":   "mode=40700",
	} {
		if !strings.HasPrefix(got[name], prefix) {
			t.Errorf("merged %s = %q, want it to start %q", name, got[name], prefix)
		}
	}
	if !strings.HasSuffix(got["sym"], "target=new.txt") {
		t.Errorf("merged sym = %q, want a link to new.txt", got["sym"])
	}
	if !strings.Contains(got["link.txt"], "nlink=2") {
		t.Errorf("merged link.txt = %q, want nlink=2", got["link.txt"])
	}
	for name, d := range got {
		if strings.Contains(d, "user.overlay.") || strings.HasPrefix(d, "mode=20") {
			t.Errorf("merged %s = %q: overlay metadata left", name, d)
		}
	}
	if mounts := mountsUnder(t, os.TempDir()); slices.ContainsFunc(mounts, func(s string) bool {
		return strings.Contains(s, "hearth-merge-")
	}) {
		t.Errorf("merge mount visible after mergeLayers: %v", mounts)
	}
	if err := mergeLayers(lower, l.Upper(), dst); !errors.Is(err, fs.ErrExist) {
		t.Errorf("mergeLayers into an existing dir = %v, want ErrExist", err)
	}
}

func TestLayerOpen(t *testing.T) {
	requireLayer(t)
	t.Run("limited", func(t *testing.T) {
		l := newTestLayer(t, 32<<20)
		mustWrite(t, filepath.Join(l.Upper(), "data"), "kept")
		check := func(when string) {
			t.Helper()
			o, err := openLayer(l.dir)
			if err != nil {
				t.Fatalf("openLayer(%q) %s = %v", l.dir, when, err)
			}
			if b, err := os.ReadFile(filepath.Join(o.Upper(), "data")); string(b) != "kept" {
				t.Errorf("data after openLayer %s = %q, %v; want \"kept\"", when, b, err)
			}
			if mounts := mountsUnder(t, l.root); len(mounts) != 1 {
				t.Errorf("mounts at %s after openLayer %s = %v, want one", l.root, when, mounts)
			}
		}
		check("while mounted")
		must(t, unix.Unmount(l.root, 0))
		check("after unmount")
	})
	t.Run("unlimited", func(t *testing.T) {
		l := newTestLayer(t, 0)
		mustWrite(t, filepath.Join(l.Upper(), "data"), "kept")
		o, err := openLayer(l.dir)
		if err != nil {
			t.Fatalf("openLayer(%q) = %v", l.dir, err)
		}
		if b, err := os.ReadFile(filepath.Join(o.Upper(), "data")); string(b) != "kept" {
			t.Errorf("data after openLayer = %q, %v; want \"kept\"", b, err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, err := openLayer(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("openLayer(empty dir) = %v, want ErrNotExist", err)
		}
	})
}

func TestLayerRemove(t *testing.T) {
	requireLayer(t)
	for _, tc := range []struct {
		name  string
		limit int64
	}{{"unlimited", 0}, {"limited", 32 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			l := newTestLayer(t, tc.limit)
			mustWrite(t, filepath.Join(l.Upper(), "data"), "gone soon")
			img := filepath.Join(l.dir, layerImage)
			if tc.limit > 0 && len(loopsBackedBy(t, img)) != 1 {
				t.Fatalf("loop devices backed by %s = %v, want one", img, loopsBackedBy(t, img))
			}
			for i := range 2 {
				if err := l.Remove(); err != nil {
					t.Fatalf("Remove() #%d = %v", i+1, err)
				}
			}
			if mounts := mountsUnder(t, l.dir); len(mounts) != 0 {
				t.Errorf("mounts left under %s: %v", l.dir, mounts)
			}
			waitLoopsReleased(t, img)
			if ents, err := os.ReadDir(l.dir); err != nil || len(ents) != 0 {
				t.Errorf("left in %s: %v, %v; want nothing", l.dir, ents, err)
			}
		})
	}
}

// TestLayerRemoveBesideAnotherNamespace removes a layer while another
// mount namespace, made while it was mounted, holds a copy of its mount,
// as an image build's chroot or any `unshare -m` on the host does. The
// unmount here does not reach a private copy, and the copy keeps the
// loop device: Remove must not wait for that (it waited a minute, then
// failed the destroy, in CI). Removing the mount point detaches the
// copies in every namespace, so the device goes then, with the holder
// still running.
func TestLayerRemoveBesideAnotherNamespace(t *testing.T) {
	requireLayer(t)
	l := newTestLayer(t, 32<<20)
	img := filepath.Join(l.dir, layerImage)
	holder := exec.Command("sleep", "120")
	holder.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // Go makes its mounts private
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	if !slices.Contains(mountPointsOf(t, holder.Process.Pid), l.root) {
		t.Fatalf("the holder's namespace has no copy of %s: the test proves nothing", l.root)
	}
	done := make(chan error, 1)
	go func() { done <- l.Remove() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Remove() beside a namespace holding the layer = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Remove() still waiting after 20s for a namespace it does not own")
	}
	if _, err := os.Lstat(img); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("image after Remove: %v, want it gone", err)
	}
	waitLoopsReleased(t, img)
	if slices.Contains(mountPointsOf(t, holder.Process.Pid), l.root) {
		t.Errorf("the holder's namespace still has %s mounted", l.root)
	}
}

// waitLoopsReleased fails unless the loop devices bound to file detach
// within a minute: autoclear runs after the unmount returns, and takes
// seconds on a loaded host.
func waitLoopsReleased(t *testing.T, file string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for len(loopsBackedBy(t, file)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if loops := loopsBackedBy(t, file); len(loops) != 0 {
		t.Errorf("loop devices left bound to %s after a minute: %v", file, loops)
	}
}

// mountPointsOf lists the mount points in process pid's namespace.
func mountPointsOf(t *testing.T, pid int) []string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			t.Fatal(err)
		}
		// The child unshares before it execs sleep: until then its
		// mountinfo is ours.
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		self, _ := os.Readlink("/proc/self/ns/mnt")
		if ns != self || time.Now().After(deadline) {
			var out []string
			for _, line := range strings.Split(string(data), "\n") {
				if f := strings.Fields(line); len(f) > 4 {
					out = append(out, f[4])
				}
			}
			return out
		}
	}
}

// BenchmarkNewLayer measures newLayer, unlimited and limited (10 GiB,
// template cached), against making two directories in the same run,
// and reports the medians, the one-off cost of the template (about what
// running mkfs per machine would cost) and of Remove.
func BenchmarkNewLayer(b *testing.B) {
	requireLayer(b)
	for _, bc := range []struct {
		name  string
		limit int64
	}{{"none", 0}, {"limited", 10 << 30}} {
		b.Run(bc.name, func(b *testing.B) {
			tmp := b.TempDir()
			templates := filepath.Join(tmp, "templates")
			var template time.Duration // reported at the end: ResetTimer drops metrics
			if bc.limit > 0 {
				t0 := time.Now()
				if _, err := layerTemplate(templates, bc.limit); err != nil {
					b.Fatal(err)
				}
				template = time.Since(t0)
			}
			var made, removed, base []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dir := filepath.Join(tmp, fmt.Sprint("m", i))
				b.StopTimer()
				must(b, os.Mkdir(dir, 0o700))
				b.StartTimer()
				t0 := time.Now()
				l, err := newLayer(dir, bc.limit, templates)
				if err != nil {
					b.Fatal(err)
				}
				made = append(made, time.Since(t0))
				b.StopTimer()
				t1 := time.Now()
				must(b, l.Remove())
				t2 := time.Now()
				must(b, os.MkdirAll(filepath.Join(dir, "a"), 0o755))
				must(b, os.MkdirAll(filepath.Join(dir, "b"), 0o755))
				removed, base = append(removed, t2.Sub(t1)), append(base, time.Since(t2))
				b.StartTimer()
			}
			if template > 0 {
				b.ReportMetric(ms(template), "ms-template-once")
			}
			b.ReportMetric(ms(median(made)), "ms-median-new-layer")
			b.ReportMetric(ms(median(removed)), "ms-median-remove")
			b.ReportMetric(ms(median(base)), "ms-median-mkdir-two")
			b.ReportMetric(float64(median(made))/float64(median(base)), "x-mkdir-two")
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
