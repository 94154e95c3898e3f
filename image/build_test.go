package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dustin/go-humanize"
)

// requireBuildTools skips unless real images can be built here.
func requireBuildTools(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("building images needs root (debootstrap, chroot, mount): run go test as root")
	}
	for _, cmd := range []string{"debootstrap", "mkfs.ext4", "e2fsck", "chroot", "mount"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("%s is not installed: scripts/test.sh installs it (apt-get install %s)", cmd, hostPackage(cmd))
		}
	}
	if _, err := MirrorFor("/etc/apt", "bookworm"); err != nil {
		t.Skipf("the host's apt sources have no Debian bookworm mirror for debootstrap: %v", err)
	}
}

// badnpm fails at npm install: the package does not exist.
const badnpm = `name = "badnpm"
parent = "node"
npm = ["@hearth-no-such-scope/no-such-package"]
`

// checked's check passes only as agent, with the throwaway HOME, and
// leaves a file there that the build must not keep; badcheck's fails.
const (
	checked = `
name = "checked"
parent = "base"
check = ["test \"$(id -un)\" = agent && test \"$HOME\" = /tmp/hearth-check && test \"$PWD\" = \"$HOME\" && test \"$LANG\" = C.UTF-8 && touch left-behind"]
`
	badcheck = `
name = "badcheck"
parent = "base"
check = ["true", "echo the CLI is missing >&2; exit 3"]
`
)

// testCatalog is the built-in recipes, those in testdata/recipes, badnpm,
// checked and badcheck.
func testCatalog(t *testing.T) *Catalog {
	t.Helper()
	rs, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"badpkg.toml", "extra.toml"} {
		r, err := Load(filepath.Join("testdata/recipes", f))
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	for name, text := range map[string]string{"badnpm.toml": badnpm, "checked.toml": checked, "badcheck.toml": badcheck} {
		r, err := Parse(name, []byte(text), nil)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	c, err := NewCatalog(rs...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testCache returns an empty cache directory and, on cleanup, fails the
// test if a mount was left under it, detaching it first so the directory
// can be removed safely.
func testCache(t *testing.T) string {
	dir := t.TempDir()
	t.Cleanup(func() {
		mps, err := mountsUnder(dir)
		if err != nil {
			t.Error(err)
		}
		if len(mps) > 0 {
			t.Errorf("mounts left under the cache: %v", mps)
			if err := unmountAll(dir); err != nil {
				t.Error(err)
			}
		}
	})
	return dir
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func timedBuild(t *testing.T, b *Builder, name string) (Image, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := b.Build(ctx, name)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Build(%s) = %v", name, err)
	}
	t.Logf("Build(%s) took %s: rootfs %s, ext4 %s, %d Debian packages", name, took.Round(100*time.Millisecond),
		humanize.IBytes(uint64(img.Size)), humanize.IBytes(uint64(img.Ext4Size)), len(img.Debian))
	return img, took
}

func inChroot(t *testing.T, root string, args ...string) string {
	t.Helper()
	out, err := exec.Command("chroot", append([]string{root}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("chroot %s %s = %v: %s", root, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestBuild builds real images; base is shared by the subtests, so they
// run in order.
func TestBuild(t *testing.T) {
	requireBuildTools(t)
	cache := testCache(t)
	b, err := NewBuilder(cache, testCatalog(t), logWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := timedBuild(t, b, "base")

	t.Run("base packages", func(t *testing.T) { checkPackages(t, base, "git", "curl", "python3", "ca-certificates") })
	t.Run("base user", func(t *testing.T) { checkUser(t, base, "agent", 1000) })
	t.Run("base ext4", func(t *testing.T) { checkExt4(t, base) })
	t.Run("cache hit", func(t *testing.T) { checkCacheHit(t, b, base) })
	t.Run("failing step", func(t *testing.T) { checkFailingStep(t, b, cache) })
	t.Run("files env user", func(t *testing.T) { checkExtra(t, b) })
	t.Run("node", func(t *testing.T) { checkNode(t, b) })
	t.Run("failing npm step", func(t *testing.T) { checkFailingNpm(t, b, cache) })
	t.Run("checks", func(t *testing.T) { checkChecks(t, b, cache) })
	t.Run("list inspect remove", func(t *testing.T) { checkListRemove(t, b) })
	t.Run("save", func(t *testing.T) { checkSave(t, b, base) })
}

func checkPackages(t *testing.T, img Image, want ...string) {
	var names []string
	for _, p := range img.Debian {
		if p.Version == "" {
			t.Errorf("package %s has no version", p.Name)
		}
		names = append(names, p.Name)
	}
	for _, w := range want {
		if !slices.Contains(names, w) {
			t.Errorf("manifest of %s lacks Debian package %s (has %d packages)", img.Name, w, len(names))
		}
	}
	if img.Size <= 0 || img.Ext4Size <= img.Size || img.Hash == "" || img.Built.IsZero() || img.Mirror == "" {
		t.Errorf("manifest = size %d, ext4 %d, hash %q, built %v, mirror %q: want all set, ext4 larger", img.Size, img.Ext4Size, img.Hash, img.Built, img.Mirror)
	}
}

func checkUser(t *testing.T, img Image, name string, uid int) {
	got, ok, err := passwdUID(filepath.Join(img.Rootfs(), "etc/passwd"), name)
	if err != nil || !ok || got != uid {
		t.Errorf("user %s in %s/etc/passwd = uid %d, found %v, %v; want uid %d", name, img.Rootfs(), got, ok, err, uid)
	}
	if _, err := os.Stat(filepath.Join(img.Rootfs(), "home", name)); err != nil {
		t.Errorf("home of %s: %v", name, err)
	}
}

func checkExt4(t *testing.T, img Image) {
	out, err := exec.Command("e2fsck", "-fn", img.Ext4()).CombinedOutput()
	if err != nil {
		t.Errorf("e2fsck -fn %s = %v: %s", img.Ext4(), err, out)
	}
}

func checkCacheHit(t *testing.T, b *Builder, base Image) {
	again, took := timedBuild(t, b, "base")
	if again.Dir != base.Dir || !again.Built.Equal(base.Built) {
		t.Errorf("second Build(base) = %s built %v, want the cached %s built %v", again.Dir, again.Built, base.Dir, base.Built)
	}
	if took > 5*time.Second {
		t.Errorf("second Build(base) took %s, want a cache hit", took)
	}
}

func checkFailingStep(t *testing.T, b *Builder, cache string) {
	before := cacheEntries(t, cache)
	_, err := b.Build(context.Background(), "badpkg")
	var se *StepError
	if !errors.As(err, &se) || se.Image != "badpkg" || se.Step != "apt install hearth-no-such-package" {
		t.Fatalf("Build(badpkg) = %v, want a StepError for step %q", err, "apt install hearth-no-such-package")
	}
	msg := err.Error()
	t.Logf("Build(badpkg) = %v", err)
	if !strings.HasPrefix(msg, `build image badpkg: step "apt install hearth-no-such-package": exit status 100: `) ||
		!strings.Contains(msg, "Unable to locate package hearth-no-such-package") {
		t.Errorf("Build(badpkg) error = %q, want the step, exit status and apt's complaint", msg)
	}
	if after := cacheEntries(t, cache); !slices.Equal(after, before) {
		t.Errorf("cache after failed build = %v, want %v as before", after, before)
	}
}

// checkChecks: a recipe's checks run as its user with a HOME the image
// does not keep, and a failing one fails the build with its output.
func checkChecks(t *testing.T, b *Builder, cache string) {
	img, _ := timedBuild(t, b, "checked")
	if _, err := os.Lstat(filepath.Join(img.Rootfs(), checkHome)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lstat %s in the image = %v, want it removed after the check", checkHome, err)
	}
	const step = "check echo the CLI is missing >&2; exit 3"
	before := cacheEntries(t, cache)
	_, err := b.Build(context.Background(), "badcheck")
	var se *StepError
	if !errors.As(err, &se) || se.Image != "badcheck" || se.Step != step {
		t.Fatalf("Build(badcheck) = %v, want a StepError for step %q", err, step)
	}
	t.Logf("Build(badcheck) = %v", err)
	if msg := err.Error(); !strings.Contains(msg, "as agent: exit status 3: the CLI is missing") {
		t.Errorf("Build(badcheck) error = %q, want the user, exit status and the command's output", msg)
	}
	if after := cacheEntries(t, cache); !slices.Equal(after, before) {
		t.Errorf("cache after failed build = %v, want %v as before", after, before)
	}
}

func cacheEntries(t *testing.T, cache string) []string {
	ents, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func checkExtra(t *testing.T, b *Builder) {
	img, _ := timedBuild(t, b, "extra")
	if got := inChroot(t, img.Rootfs(), "hello"); got != "hello from the image" {
		t.Errorf("chroot hello = %q, want %q", got, "hello from the image")
	}
	st, err := os.Stat(filepath.Join(img.Rootfs(), "etc/hearth/hello.sh"))
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("stat /etc/hearth/hello.sh = %v, %v, want mode 0644", st, err)
	}
	env, err := os.ReadFile(filepath.Join(img.Rootfs(), "etc/environment"))
	if err != nil || !strings.Contains(string(env), "GREETING=hello from hearth\n") || !strings.Contains(string(env), "LANG=C.UTF-8\n") {
		t.Errorf("/etc/environment = %q, %v, want GREETING and base's LANG", env, err)
	}
	checkUser(t, img, "agent", 1000)
	checkUser(t, img, "second", 1001)
	if img.User == nil || img.User.Name != "second" || img.Parent != "base" || img.ParentHash == "" {
		t.Errorf("manifest user %+v, parent %q %q, want second and base", img.User, img.Parent, img.ParentHash)
	}
}

func checkNode(t *testing.T, b *Builder) {
	img, _ := timedBuild(t, b, "node")
	checkPackages(t, img, "nodejs", "npm", "git")
	if got := inChroot(t, img.Rootfs(), "node", "--version"); !strings.HasPrefix(got, "v") {
		t.Errorf("chroot node --version = %q, want a version", got)
	}
	checkUser(t, img, "agent", 1000)
	checkExt4(t, img)
}

// checkFailingNpm needs node built: it checks that npm's own complaint,
// not a pointer to a log file deleted with the build, ends the error.
func checkFailingNpm(t *testing.T, b *Builder, cache string) {
	const step = "npm install -g @hearth-no-such-scope/no-such-package"
	before := cacheEntries(t, cache)
	_, err := b.Build(context.Background(), "badnpm")
	var se *StepError
	if !errors.As(err, &se) || se.Image != "badnpm" || se.Step != step {
		t.Fatalf("Build(badnpm) = %v, want a StepError for step %q", err, step)
	}
	msg := err.Error()
	t.Logf("Build(badnpm) = %v", err)
	if !strings.HasPrefix(msg, `build image badnpm: step "`+step+`": exit status 1: `) ||
		!strings.Contains(msg, "404 Not Found") || !strings.Contains(msg, "is not in this registry") ||
		strings.Contains(msg, "complete log") {
		t.Errorf("Build(badnpm) error = %q, want the step, exit status and npm's 404", msg)
	}
	if after := cacheEntries(t, cache); !slices.Equal(after, before) {
		t.Errorf("cache after failed build = %v, want %v as before", after, before)
	}
}

func checkListRemove(t *testing.T, b *Builder) {
	imgs, err := b.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, img := range imgs {
		names = append(names, img.Name)
	}
	// The images the subtests before this one built, in name order.
	if got := strings.Join(names, " "); got != "base checked extra node" {
		t.Errorf("List() names = %q, want %q", got, "base checked extra node")
	}
	m, err := b.Inspect("extra")
	if err != nil || m.Name != "extra" {
		t.Errorf("Inspect(extra) = %+v, %v", m, err)
	}
	if err := b.Remove("extra"); err != nil {
		t.Fatalf("Remove(extra) = %v", err)
	}
	if _, err := b.Inspect("extra"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Inspect(extra) after Remove = %v, want ErrNotFound", err)
	}
	if err := b.Remove("extra"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove(extra) = %v, want ErrNotFound", err)
	}
}

// TestBuildCancelled stops a build during debootstrap: the error says so
// and neither a directory nor a mount is left behind.
func TestBuildCancelled(t *testing.T) {
	requireBuildTools(t)
	cache := testCache(t)
	b, err := NewBuilder(cache, testCatalog(t), logWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = b.Build(ctx, "base")
	var se *StepError
	if !errors.As(err, &se) || se.Step != "debootstrap bookworm" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Build(base) with a 3s deadline = %v, want a deadline error in step debootstrap bookworm", err)
	}
	if got := cacheEntries(t, cache); !slices.Equal(got, []string{".lock"}) {
		t.Errorf("cache after cancelled build = %v, want only .lock", got)
	}
}

// checkSave saves a changed copy of base as a new image, the way a
// machine's exported root is saved.
func checkSave(t *testing.T, b *Builder, base Image) {
	ctx := context.Background()
	fill := func(rootfs string) error {
		if out, err := exec.Command("cp", "-a", base.Rootfs(), rootfs).CombinedOutput(); err != nil {
			return fmt.Errorf("cp: %v: %s", err, out)
		}
		return os.WriteFile(filepath.Join(rootfs, "home/agent/configured"), []byte("yes"), 0o644)
	}
	img, err := b.Save(ctx, "mine", base, "machine sbx-1", fill)
	if err != nil {
		t.Fatalf("Save(mine) = %v", err)
	}
	got, err := b.Get("mine")
	if err != nil || got.Dir != img.Dir {
		t.Fatalf("Get(mine) = %+v, %v; want the saved image", got, err)
	}
	if got.SavedFrom != "machine sbx-1" || got.Parent != "base" || got.User == nil || got.User.Name != "agent" ||
		len(got.Debian) == 0 || got.Ext4Size == 0 {
		t.Errorf("saved manifest = %+v; want it from sbx-1, a child of base with its user, packages and an ext4", got.Manifest)
	}
	if data, err := os.ReadFile(filepath.Join(got.Rootfs(), "home/agent/configured")); err != nil || string(data) != "yes" {
		t.Errorf("saved root lacks the change: %q, %v", data, err)
	}
	before, _ := b.List()
	if _, err := b.Save(ctx, "base", base, "x", fill); err == nil {
		t.Errorf("Save(base), a recipe's name, = nil; want an error")
	}
	if _, err := b.Save(ctx, "Bad/Name", base, "x", fill); err == nil {
		t.Errorf("Save(Bad/Name) = nil; want an error")
	}
	boom := errors.New("boom")
	_, err = b.Save(ctx, "broken", base, "machine sbx-2", func(string) error { return boom })
	var se *StepError
	if !errors.As(err, &se) || !errors.Is(err, boom) || !strings.Contains(se.Step, "sbx-2") {
		t.Errorf("Save with a failing copy = %v; want a StepError naming the copy", err)
	}
	if after, _ := b.List(); len(after) != len(before) {
		t.Errorf("images after failed saves: %d, want %d", len(after), len(before))
	}
	if err := b.Remove("mine"); err != nil {
		t.Errorf("Remove(mine) = %v", err)
	}
}
