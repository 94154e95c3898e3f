package jail

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/vmm"
)

// forkSpec is the spec of the forks' source in these tests.
func forkSpec(id, root string, disk int64) vmm.Spec {
	return vmm.Spec{ID: id, RootFS: root, UID: 1000, GID: 1000, Memory: 256 << 20, Pids: 256, Disk: disk}
}

func createT(t *testing.T, d *Driver, spec vmm.Spec) vmm.Machine {
	t.Helper()
	m, err := d.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create(%s) = %v", spec.ID, err)
	}
	t.Cleanup(func() { m.Destroy(context.Background()) })
	return m
}

func sh(t *testing.T, m vmm.Machine, script string) string {
	t.Helper()
	out, code := run(t, m, 0, "sh", "-c", script)
	if code != 0 {
		t.Fatalf("sh -c %q in %s: exit %d: %s", script, m.ID(), code, out)
	}
	return strings.TrimSpace(out)
}

// TestForkLayer: a capture of a running machine's layer seeds new
// machines with its files; afterwards each side's writes are its own,
// and the source ran on (and a paused one stays paused).
func TestForkLayer(t *testing.T) {
	d := newDriver(t)
	root := busyboxRoot(t)
	for _, tc := range []struct {
		name string
		disk int64
	}{{"unlimited", 0}, {"limited", 64 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			src := createT(t, d, forkSpec("fsrc-"+tc.name, root, tc.disk))
			sh(t, src, "mkdir -p /data && echo one > /data/a && head -c 1048576 /dev/urandom > /data/big && md5sum /data/big > /data/big.md5 && rm /bin/true")
			dst := filepath.Join(t.TempDir(), "layer")
			if _, err := src.(vmm.Forker).CaptureLayer(ctx, dst); err != nil {
				t.Fatal(err)
			}
			if src.(*machine).paused.Load() {
				t.Fatal("source paused after CaptureLayer, want running")
			}
			sh(t, src, "echo src > /data/s")
			var forks []vmm.Machine
			for i, id := range []string{"fk1-" + tc.name, "fk2-" + tc.name} {
				spec := forkSpec(id, root, tc.disk)
				spec.Layer, spec.TakeLayer = dst, i == 1
				forks = append(forks, createT(t, d, spec))
				sh(t, forks[i], "echo "+id+" > /data/own")
			}
			for _, f := range forks {
				if got := sh(t, f, "cat /data/a; md5sum -c /data/big.md5 >/dev/null && echo ok; test -e /bin/true || echo deleted; test -e /data/s || echo no-s"); got != "one\nok\ndeleted\nno-s" {
					t.Errorf("fork %s sees %q, want the source's files at capture", f.ID(), got)
				}
				if got := sh(t, f, "cat /data/own"); got != f.ID() {
					t.Errorf("fork %s: /data/own = %q, want its own write", f.ID(), got)
				}
			}
			if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("capture still there after the last fork took it: %v", err)
			}
			if got := sh(t, src, "test -e /data/own || echo none; cat /data/s"); got != "none\nsrc" {
				t.Errorf("source after forks sees %q, want no fork's write and its own", got)
			}
			must(t, src.Pause(ctx))
			if _, err := src.(vmm.Forker).CaptureLayer(ctx, dst+"2"); err != nil {
				t.Fatal(err)
			}
			if !src.(*machine).paused.Load() {
				t.Error("paused source running after CaptureLayer, want paused")
			}
			must(t, src.Resume(ctx))
		})
	}
}

// TestHostileForkLayer: what a machine leaves in its layer (symlinks
// out, hard links, fifos) is copied as what it is, never followed on the
// host; a capture that does not fit the fork's limit, or is missing, is
// refused and leaves nothing behind.
func TestHostileForkLayer(t *testing.T) {
	d := newDriver(t)
	root := busyboxRoot(t)
	ctx := context.Background()
	secret := filepath.Join(t.TempDir(), "host-secret")
	must(t, os.WriteFile(secret, []byte("host only"), 0o600))
	src := createT(t, d, forkSpec("hsrc", root, 0))
	sh(t, src, "mkdir -p /data && ln -s "+secret+" /data/out && ln -s ../../../../../.. /data/up && echo x > /data/h1 && ln /data/h1 /data/h2 && mkfifo /data/fifo")
	dst := filepath.Join(t.TempDir(), "layer")
	if _, err := src.(vmm.Forker).CaptureLayer(ctx, dst); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "data", "out")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("captured /data/out = %v, %v: want a symlink, not the host file it names", fi, err)
	}
	spec := forkSpec("hfork", root, 0)
	spec.Layer = dst
	f := createT(t, d, spec)
	if got := sh(t, f, "readlink /data/out; cat /data/out 2>&1 || true; test -p /data/fifo && echo fifo; ls -i /data/h1 /data/h2 | awk '{print $1}' | uniq | wc -l"); strings.Contains(got, "host only") || !strings.HasSuffix(got, "fifo\n1") {
		t.Errorf("fork sees %q: want the symlink unresolved on the host, the fifo and one inode for the hard links", got)
	}
	// A limited layer's image, larger than a smaller limit.
	big := createT(t, d, forkSpec("hbig", root, 64<<20))
	img := filepath.Join(t.TempDir(), "img")
	if _, err := big.(vmm.Forker).CaptureLayer(ctx, img); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, layer string
		disk        int64
	}{{"tree-into-limited", dst, 64 << 20}, {"missing", dst + "-none", 0}, {"file-into-unlimited", secret, 0},
		{"image-over-limit", img, 32 << 20}, {"image-into-unlimited", img, 0}} {
		spec := forkSpec("hbad-"+strings.ReplaceAll(tc.name, "-", ""), root, tc.disk)
		spec.Layer = tc.layer
		if m, err := d.Create(ctx, spec); err == nil {
			m.Destroy(ctx)
			t.Errorf("%s: Create with Layer %s = nil error, want refused", tc.name, tc.layer)
		}
		if _, err := os.Stat(d.machineDir(spec.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: machine dir left behind: %v", tc.name, err)
		}
	}
	if b, _ := os.ReadFile(secret); string(b) != "host only" {
		t.Errorf("host file now %q", b)
	}
}
