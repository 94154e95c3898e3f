package packaging

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/image"
)

// The version the test stamps; a Debian version with a ~ and a +, which
// semver would not keep.
const testVersion = "9.9.9~test+1"

// TestDebInstall builds the package with scripts/package.sh, installs it
// with apt into a fresh Debian root (dependencies from the Debian archive)
// and checks it there: the stamped versions, hearth doctor, the unit under
// systemd-analyze verify, the conffile and state directory and their
// modes, the unit enabled; then that remove keeps the config and state and
// purge deletes them.
func TestDebInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("installing a package into a Debian root needs root: run as root")
	}
	for _, tool := range []string{"debootstrap", "dpkg-deb", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s: not found (scripts/test.sh installs it)", tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	commit, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	deb := buildPackage(ctx, t)
	root := freshRoot(ctx, t)
	if err := copyFile(deb, filepath.Join(root, "tmp", "hearth.deb")); err != nil {
		t.Fatal(err)
	}
	if err := copyFile("/etc/resolv.conf", filepath.Join(root, "etc", "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	mustChroot(ctx, t, root, "apt-get", "update", "-qq")
	mustChroot(ctx, t, root, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "/tmp/hearth.deb")

	t.Run("versions", func(t *testing.T) { checkVersions(ctx, t, root, strings.TrimSpace(string(commit))) })
	t.Run("doctor", func(t *testing.T) { checkDoctor(ctx, t, root) })
	t.Run("unit", func(t *testing.T) { checkUnit(ctx, t, root) })
	t.Run("files", func(t *testing.T) { checkFiles(t, root) })
	t.Run("hostile loosened state dir", func(t *testing.T) { checkRetightened(ctx, t, root) })
	t.Run("remove and purge", func(t *testing.T) { checkRemoval(ctx, t, root) })
}

// buildPackage runs scripts/package.sh into a temporary directory.
func buildPackage(ctx context.Context, t *testing.T) string {
	dist := t.TempDir()
	cmd := exec.CommandContext(ctx, "../scripts/package.sh", "--version", testVersion, "--dist", dist)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/package.sh: %v\n%s", err, stderr.Bytes())
	}
	deb := strings.TrimSpace(string(out))
	if want := filepath.Join(dist, "hearth_"+testVersion+"_amd64.deb"); deb != want {
		t.Fatalf("scripts/package.sh printed %q, want %q", deb, want)
	}
	return deb
}

// freshRoot is a private copy of a debootstrapped bookworm root with
// systemd, built once into the test image cache by the image builder
// (with its mirror choice: the host's apt sources).
func freshRoot(ctx context.Context, t *testing.T) string {
	r, err := image.Load("testdata/debian-systemd.toml")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := image.NewCatalog(r)
	if err != nil {
		t.Fatal(err)
	}
	cache := os.Getenv("HEARTH_TEST_IMAGES")
	if cache == "" {
		cache = filepath.Join(os.TempDir(), "hearth-packaging-test-images")
	}
	b, err := image.NewBuilder(cache, cat, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	img, err := b.Build(ctx, r.Name)
	if err != nil {
		t.Fatalf("build the test root: %v", err)
	}
	root := filepath.Join(t.TempDir(), "root")
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", img.Rootfs(), root).CombinedOutput(); err != nil {
		t.Fatalf("copy the test root: %v: %s", err, out)
	}
	return root
}

// chrootScript mounts proc, sys and dev in the root (in the command's own
// mount namespace, so they go when it exits) and runs the command there.
const chrootScript = `set -e; r=$1; shift
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
exec chroot "$r" "$@"`

// inRoot runs args inside root and returns its combined output.
func inRoot(ctx context.Context, root string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", chrootScript, "sh", root}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LC_ALL=C",
		"DEBIAN_FRONTEND=noninteractive"}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustChroot(ctx context.Context, t *testing.T, root string, args ...string) string {
	t.Helper()
	out, err := inRoot(ctx, root, args...)
	if err != nil {
		t.Fatalf("%s in the test root: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// checkVersions: both binaries carry the version and the commit
// scripts/package.sh was given (commit: HEAD when it started).
func checkVersions(ctx context.Context, t *testing.T, root, commit string) {
	stamp := testVersion + " (commit " + commit[:12]
	if out := mustChroot(ctx, t, root, "hearth-guest", "--version"); !strings.HasPrefix(out, "hearth-guest "+stamp) {
		t.Errorf("hearth-guest --version = %q, want it to start with %q", out, "hearth-guest "+stamp)
	}
	out, err := inRoot(ctx, root, "hearth", "version")
	if err != nil && strings.Contains(out, "unknown command") {
		// hearth version comes with the CLI's rework (issue 20, item 2);
		// until then the guest agent's --version above checks the stamp.
		first, _, _ := strings.Cut(out, "\n")
		t.Logf("hearth version: not in this build yet (%s)", first)
		return
	}
	if err != nil || !strings.HasPrefix(out, "hearth "+stamp) {
		t.Errorf("hearth version = %q, %v; want it to start with %q", out, err, "hearth "+stamp)
	}
}

// checkDoctor runs hearth doctor with the packaged config: it finds the
// guest agent beside hearth and reads the state directory's modes.
func checkDoctor(ctx context.Context, t *testing.T, root string) {
	out := mustChroot(ctx, t, root, "hearth", "doctor", "--config", "/etc/hearth/hearth.toml")
	t.Logf("hearth doctor in the installed root:\n%s", out)
	for _, want := range []string{"guest agent  ok  /usr/bin/hearth-guest", "state modes  ok", "\ntier: "} {
		if !strings.Contains(collapseSpaces(out), want) {
			t.Errorf("hearth doctor in the installed root says:\n%s\nwant a line with %q", out, want)
		}
	}
}

// collapseSpaces makes runs of spaces two wide, as tabwriter's padding
// varies with the longest name.
func collapseSpaces(s string) string {
	for strings.Contains(s, "   ") {
		s = strings.ReplaceAll(s, "   ", "  ")
	}
	return s
}

// checkUnit verifies the installed unit with the root's own systemd, and
// that the same check refuses a broken copy (so a silent pass means
// something).
func checkUnit(ctx context.Context, t *testing.T, root string) {
	const unit = "/lib/systemd/system/hearth.service"
	if out, err := inRoot(ctx, root, "systemd-analyze", "verify", unit); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify %s = %v:\n%s", unit, err, out)
	}
	data, err := os.ReadFile(filepath.Join(root, unit))
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(data), "\nKillMode=process\n", "\nKillMode=processes\n", 1)
	if broken == string(data) {
		t.Fatalf("%s has no line KillMode=process", unit)
	}
	if err := os.WriteFile(filepath.Join(root, "tmp", "broken.service"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := inRoot(ctx, root, "systemd-analyze", "verify", "/tmp/broken.service"); err == nil && strings.TrimSpace(out) == "" {
		t.Errorf("systemd-analyze verify passed a unit with KillMode=processes: the check cannot fail")
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/hearth.service")); err != nil {
		t.Errorf("the unit is not enabled after a first install: %v", err)
	}
}

// checkFiles: the conffile is one, root's and world-readable (it holds no
// secrets); the state directory is root's only.
func checkFiles(t *testing.T, root string) {
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{
		{"/etc/hearth/hearth.toml", 0o644},
		{"/var/lib/hearth", os.ModeDir | 0o700},
		{"/usr/bin/hearth", 0o755},
		{"/usr/bin/hearth-guest", 0o755},
	} {
		fi, err := os.Stat(filepath.Join(root, c.path))
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != c.mode || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: mode %v owner %d:%d, want %v root:root", c.path, fi.Mode(), st.Uid, st.Gid, c.mode)
		}
	}
	conffiles, err := os.ReadFile(filepath.Join(root, "var/lib/dpkg/info/hearth.conffiles"))
	if err != nil || !strings.Contains(string(conffiles), "/etc/hearth/hearth.toml") {
		t.Errorf("dpkg's conffiles of hearth = %q, %v; want /etc/hearth/hearth.toml", conffiles, err)
	}
}

// checkRetightened: a state directory another local user was given
// (mode 0777, their own) before an upgrade is root's only again after it,
// before the daemon's own start would fix it.
func checkRetightened(ctx context.Context, t *testing.T, root string) {
	state := filepath.Join(root, "var/lib/hearth")
	if err := os.Chmod(state, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	mustChroot(ctx, t, root, "dpkg", "--install", "/tmp/hearth.deb")
	fi, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("after an upgrade over a loosened state dir: mode %v owner %d:%d, want 0700 root:root", fi.Mode(), st.Uid, st.Gid)
	}
}

// checkRemoval: remove keeps the config and the state; purge deletes
// both, state written by the daemon included.
func checkRemoval(ctx context.Context, t *testing.T, root string) {
	marker := filepath.Join(root, "var/lib/hearth/events.db")
	if err := os.WriteFile(marker, []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustChroot(ctx, t, root, "dpkg", "--remove", "hearth")
	for path, want := range map[string]bool{"/usr/bin/hearth": false, "/etc/hearth/hearth.toml": true, "/var/lib/hearth/events.db": true} {
		if _, err := os.Stat(filepath.Join(root, path)); (err == nil) != want {
			t.Errorf("after dpkg --remove: %s exists = %v, want %v", path, err == nil, want)
		}
	}
	mustChroot(ctx, t, root, "dpkg", "--purge", "hearth")
	for _, path := range []string{"/etc/hearth", "/var/lib/hearth"} {
		if _, err := os.Stat(filepath.Join(root, path)); err == nil {
			t.Errorf("after dpkg --purge: %s is still there", path)
		}
	}
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}
