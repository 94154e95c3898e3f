package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// build is one image being built in a temporary directory.
type build struct {
	b      *Builder
	r      *Recipe
	parent Image
	tmp    string
	rootfs string
	log    *os.File
	man    Manifest
}

type step struct {
	name string
	fn   func(context.Context) error
}

func (b *Builder) newBuild(r *Recipe, hash string, parent Image, tmp string) (*build, error) {
	log, err := os.Create(filepath.Join(tmp, "build.log"))
	if err != nil {
		return nil, err
	}
	// A saved image has no recipe in the catalog: it keeps its parent's.
	man := Manifest{
		Name: r.Name, Hash: hash, Parent: r.Parent, ParentHash: parent.Hash,
		Suite: parent.Suite, Mirror: parent.Mirror, User: parent.User, Env: parent.Env, CLI: parent.CLI,
	}
	if chain, err := b.recipes.chain(r.Name); err == nil {
		man.User, man.Env, man.CLI = effectiveUser(chain), effectiveEnv(chain), effectiveCLI(chain)
		if r.Parent == "" {
			man.Suite = r.Suite
		}
	}
	return &build{b: b, r: r, parent: parent, tmp: tmp, rootfs: filepath.Join(tmp, "rootfs"), log: log, man: man}, nil
}

// effectiveCLI is the CLI of the nearest recipe in chain that names one.
func effectiveCLI(chain []*Recipe) string {
	cli := ""
	for _, r := range chain {
		if r.CLI != "" {
			cli = r.CLI
		}
	}
	return cli
}

func effectiveUser(chain []*Recipe) *User {
	var u *User
	for _, r := range chain {
		if r.User != nil {
			u = r.User
		}
	}
	return u
}

func effectiveEnv(chain []*Recipe) map[string]string {
	env := map[string]string{}
	for _, r := range chain {
		for k, v := range r.Env {
			env[k] = v
		}
	}
	return env
}

func (bd *build) steps() []step {
	r := bd.r
	var s []step
	if r.Parent == "" {
		s = append(s, step{"debootstrap " + r.Suite, bd.debootstrap})
	} else {
		s = append(s, step{"copy " + r.Parent + " rootfs", bd.copyParent})
	}
	if len(r.Apt) > 0 {
		s = append(s, step{"apt install " + strings.Join(r.Apt, " "), bd.aptInstall})
	}
	for _, c := range r.Run {
		s = append(s, step{"run " + c, func(ctx context.Context) error { return bd.run1(ctx, c) }})
	}
	if len(r.Npm) > 0 {
		s = append(s, step{"npm install -g " + strings.Join(r.Npm, " "), bd.npmInstall})
	}
	if len(r.Files) > 0 {
		s = append(s, step{"copy files", bd.copyFiles})
	}
	if len(r.Env) > 0 {
		s = append(s, step{"write /etc/environment", bd.writeEnv})
	}
	if r.User != nil {
		s = append(s, step{"create user " + r.User.Name, bd.createUser})
	}
	for _, c := range r.Check {
		s = append(s, step{"check " + c, func(ctx context.Context) error { return bd.check(ctx, c) }})
	}
	return append(s, step{"record manifest", bd.record}, step{"mkfs.ext4", bd.mkfs})
}

func (bd *build) run(ctx context.Context, steps []step) error {
	start := time.Now()
	for _, st := range steps {
		if err := bd.step(ctx, st); err != nil {
			return err
		}
	}
	bd.man.BuildSeconds = time.Since(start).Seconds()
	bd.man.Built = time.Now().UTC()
	data, err := json.MarshalIndent(bd.man, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bd.tmp, "manifest.json"), append(data, '\n'), 0o644)
}

func (bd *build) step(ctx context.Context, st step) error {
	p := bd.b.progress
	fmt.Fprintf(p, "image %s: %s ...\n", bd.r.Name, st.name)
	fmt.Fprintf(bd.log, "==> %s\n", st.name)
	start := time.Now()
	err := st.fn(ctx)
	if cerr := ctx.Err(); cerr != nil && err != nil {
		err = fmt.Errorf("%w: %v", cerr, err) // killed because of ctx
	} else if cerr != nil {
		err = cerr
	}
	took := time.Since(start).Round(100 * time.Millisecond)
	if err != nil {
		fmt.Fprintf(p, "image %s: %s failed after %s\n", bd.r.Name, st.name, took)
		return &StepError{Image: bd.r.Name, Step: st.name, Err: err}
	}
	fmt.Fprintf(p, "image %s: %s done in %s\n", bd.r.Name, st.name, took)
	return nil
}

// host runs a command on the host.
func (bd *build) host(ctx context.Context, name string, args ...string) error {
	if _, err := exec.LookPath(name); err != nil {
		return fmt.Errorf("%s is not installed on the host: apt-get install %s", name, hostPackage(name))
	}
	// debootstrap mounts proc and sys in the new root; keep those private.
	cmd := privateMounts(command(ctx, name, args...))
	return runLogged(cmd, bd.log, strings.Join(cmd.Args, " "))
}

func hostPackage(cmd string) string {
	switch cmd {
	case "mkfs.ext4":
		return "e2fsprogs"
	case "cp":
		return "coreutils"
	}
	return cmd
}

// chroot runs args inside the root directory with stdin and stdout given
// (nil: none, and the log).
func (bd *build) chroot(ctx context.Context, stdin io.Reader, stdout io.Writer, args ...string) error {
	cmd := chrootCmd(ctx, bd.rootfs, args...)
	cmd.Stdin = stdin
	cmd.Stdout = stdout
	return runLogged(cmd, bd.log, "chroot: "+strings.Join(args, " "))
}

// sh runs a shell script inside the root directory; args are $1, $2, ...
func (bd *build) sh(ctx context.Context, stdin io.Reader, script string, args ...string) error {
	return bd.chroot(ctx, stdin, nil, append([]string{"/bin/sh", "-c", script, "sh"}, args...)...)
}

// writeInside writes a file at an absolute path in the image. Doing it in
// the chroot resolves the image's symlinks inside the image, never on the
// host, and replaces a symlink at dst rather than following it.
func (bd *build) writeInside(ctx context.Context, dst string, mode fs.FileMode, data []byte) error {
	const script = `set -e; mkdir -p "$(dirname "$1")"; rm -f "$1"; cat > "$1"; chmod "$2" "$1"`
	return bd.sh(ctx, bytes.NewReader(data), script, dst, fmt.Sprintf("%04o", mode))
}

func (bd *build) debootstrap(ctx context.Context) error {
	mirror := bd.b.Mirror
	if mirror == "" {
		m, err := MirrorFor(bd.b.AptDir, bd.r.Suite)
		if err != nil {
			return err
		}
		mirror = m
	}
	bd.man.Mirror = mirror
	return bd.host(ctx, "debootstrap", "--variant=minbase", bd.r.Suite, bd.rootfs, mirror)
}

func (bd *build) copyParent(ctx context.Context) error {
	return bd.host(ctx, "cp", "-a", "--reflink=auto", bd.parent.Rootfs(), bd.rootfs)
}

// useHostDNS gives the image the host's resolver for network steps.
func (bd *build) useHostDNS(ctx context.Context) error {
	data, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return fmt.Errorf("host resolver: %w", err)
	}
	return bd.writeInside(ctx, "/etc/resolv.conf", 0o644, data)
}

func (bd *build) aptInstall(ctx context.Context) error {
	if err := bd.useHostDNS(ctx); err != nil {
		return err
	}
	// Keep package scripts from starting services in the build chroot.
	if err := bd.writeInside(ctx, "/usr/sbin/policy-rc.d", 0o755, []byte("#!/bin/sh\nexit 101\n")); err != nil {
		return err
	}
	err := bd.apt(ctx)
	if rerr := bd.sh(ctx, nil, `rm -f /usr/sbin/policy-rc.d`); err == nil {
		err = rerr
	}
	return err
}

func (bd *build) apt(ctx context.Context) error {
	if err := bd.chroot(ctx, nil, nil, "apt-get", "update", "-q"); err != nil {
		return err
	}
	install := append([]string{"apt-get", "install", "-y", "-q", "--no-install-recommends"}, bd.r.Apt...)
	if err := bd.chroot(ctx, nil, nil, install...); err != nil {
		return err
	}
	return bd.sh(ctx, nil, `set -e; apt-get clean; rm -rf /var/lib/apt/lists/* /var/log/apt/* /tmp/*`)
}

func (bd *build) npmInstall(ctx context.Context) error {
	if _, err := os.Lstat(filepath.Join(bd.rootfs, "usr/bin/npm")); err != nil {
		return errors.New("the image has no /usr/bin/npm: add npm to apt in this recipe or use a parent that has it (node)")
	}
	if err := bd.useHostDNS(ctx); err != nil {
		return err
	}
	env, err := bd.useHostCAs(ctx)
	if err != nil {
		return err
	}
	// --foreground-scripts puts install scripts' output in the build log:
	// some report a failure only there and still exit 0. No npm log
	// file: it would be deleted with the failed build, yet npm's error
	// would end by pointing at it.
	npm := append(append([]string{"env"}, env...), "npm", "--no-fund", "--no-audit", "--logs-max=0")
	if !bd.r.NpmLocalScripts {
		err = bd.chroot(ctx, nil, nil, append(append(npm, "install", "-g", "--foreground-scripts"), bd.r.Npm...)...)
	} else {
		err = bd.npmLocalScripts(ctx, npm)
	}
	if rerr := bd.sh(ctx, nil, `set -e; npm cache clean --force; rm -rf /root/.npm /tmp/* /tmp/.[!.]*`); err == nil {
		err = rerr
	}
	return err
}

// run1 runs one of the recipe's run commands as root, with the host's
// resolver.
func (bd *build) run1(ctx context.Context, command string) error {
	if err := bd.useHostDNS(ctx); err != nil {
		return err
	}
	return bd.sh(ctx, nil, "set -e; "+command)
}

// npmLocalScripts installs the packages with npm install -g and runs
// their install scripts after, with npm rebuild in the global prefix's lib
// as a local install there: scripts then see no npm_config_global, which
// npm exports to the scripts of a -g install and under which a script's
// own "npm install" (code-server's postinstall runs one in lib/vscode)
// installs its directory globally in place of the package itself. npm 7
// and later run these scripts as root (the owner of the prefix);
// npm_config_unsafe_perm tells scripts written for npm 6's rule so, which
// code-server's requires.
func (bd *build) npmLocalScripts(ctx context.Context, npm []string) error {
	npm = append([]string{npm[0], "npm_config_unsafe_perm=true"}, npm[1:]...)
	if err := bd.chroot(ctx, nil, nil, append(append(npm, "install", "-g", "--ignore-scripts"), bd.r.Npm...)...); err != nil {
		return err
	}
	return bd.sh(ctx, nil, `cd /usr/local/lib && exec "$@"`, append(npm, "rebuild", "--no-bin-links", "--foreground-scripts")...)
}

// hostCAs is the host's CA bundle, where Debian keeps it.
const hostCAs = "/etc/ssl/certs/ca-certificates.crt"

// useHostCAs lends the image the host's CA certificates for one step,
// returning the environment that makes Node trust them besides its own:
// a host behind a TLS-inspecting proxy trusts the proxy's CA, which the
// image does not. The file goes to /tmp, which the step empties, so the
// image never trusts the build host's CAs. No bundle on the host: none.
func (bd *build) useHostCAs(ctx context.Context) ([]string, error) {
	data, err := os.ReadFile(hostCAs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("host CA certificates: %w", err)
	}
	const inside = "/tmp/hearth-host-ca.crt"
	if err := bd.writeInside(ctx, inside, 0o644, data); err != nil {
		return nil, err
	}
	return []string{"NODE_EXTRA_CA_CERTS=" + inside}, nil
}

func (bd *build) copyFiles(ctx context.Context) error {
	for _, f := range bd.r.Files {
		data, err := fs.ReadFile(bd.r.src, f.Src)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Src, err)
		}
		mode, _ := parseMode(f.Mode) // checked by Parse
		if err := bd.writeInside(ctx, f.Dst, mode, data); err != nil {
			return fmt.Errorf("%s to %s: %w", f.Src, f.Dst, err)
		}
	}
	return nil
}

// writeEnv writes /etc/environment with every ancestor's env, the nearest
// recipe winning, since the file is replaced rather than appended to.
func (bd *build) writeEnv(ctx context.Context) error {
	var b strings.Builder
	for _, k := range sortedKeys(bd.man.Env) {
		fmt.Fprintf(&b, "%s=%s\n", k, bd.man.Env[k])
	}
	return bd.writeInside(ctx, "/etc/environment", 0o644, []byte(b.String()))
}

func (bd *build) createUser(ctx context.Context) error {
	u := bd.r.User
	uid, ok, err := passwdUID(filepath.Join(bd.rootfs, "etc/passwd"), u.Name)
	switch {
	case err != nil:
		return err
	case ok && uid == u.UID:
		return nil // a parent created it
	case ok:
		return fmt.Errorf("user %s already exists with uid %d, not %d", u.Name, uid, u.UID)
	}
	if err := bd.sh(ctx, nil, `test -x "$1" || { echo "shell $1 is not in the image" >&2; exit 1; }`, u.Shell); err != nil {
		return err
	}
	return bd.chroot(ctx, nil, nil, "useradd", "--create-home", "--user-group",
		"--uid", fmt.Sprint(u.UID), "--shell", u.Shell, u.Name)
}

// checkHome is the check's HOME: a directory the step removes, so what a
// CLI writes on first run (config, caches) does not end up in the image.
const checkHome = "/tmp/hearth-check"

// check runs one of the recipe's check commands as the image's default
// user, with the image's environment and a throwaway HOME.
func (bd *build) check(ctx context.Context, command string) error {
	user := "root"
	if bd.man.User != nil {
		user = bd.man.User.Name
	}
	env := []string{"HOME=" + checkHome, "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
	for _, k := range sortedKeys(bd.man.Env) {
		env = append(env, k+"="+bd.man.Env[k])
	}
	const prepare = `set -e; rm -rf "$2"; mkdir -m 0700 "$2"; chown "$1:" "$2"`
	if err := bd.sh(ctx, nil, prepare, user, checkHome); err != nil {
		return err
	}
	args := append(append([]string{"runuser", "-u", user, "--", "env", "-i"}, env...),
		"/bin/sh", "-c", `cd "$HOME" && `+command)
	err := bd.chroot(ctx, nil, nil, args...)
	if rerr := bd.sh(ctx, nil, `rm -rf "$1"`, checkHome); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("%s as %s: %w", command, user, err)
	}
	return nil
}

// passwdUID finds name in a passwd file.
func passwdUID(file, name string) (uid int, ok bool, err error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && f[0] == name {
			_, err := fmt.Sscan(f[2], &uid)
			return uid, err == nil, err
		}
	}
	return 0, false, nil
}

func (bd *build) record(ctx context.Context) error {
	var err error
	if bd.man.Debian, err = bd.debianPackages(ctx); err != nil {
		return err
	}
	if bd.man.Npm, err = bd.npmPackages(ctx); err != nil {
		return err
	}
	bd.man.Size, _, err = diskUsage(bd.rootfs)
	return err
}

// debianPackages lists the installed Debian packages, none if the root
// has no dpkg (a saved root need not be Debian's).
func (bd *build) debianPackages(ctx context.Context) ([]Package, error) {
	if _, err := os.Lstat(filepath.Join(bd.rootfs, "usr/bin/dpkg-query")); err != nil {
		return []Package{}, nil
	}
	var out bytes.Buffer
	err := bd.chroot(ctx, nil, &out, "dpkg-query", "-W", "-f", "${db:Status-Status} ${Package} ${Version}\n")
	if err != nil {
		return nil, err
	}
	pkgs := []Package{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "installed" {
			pkgs = append(pkgs, Package{Name: f[1], Version: f[2]})
		}
	}
	return pkgs, nil
}

// npmPackages lists globally installed npm packages, none if the image
// has no npm.
func (bd *build) npmPackages(ctx context.Context) ([]Package, error) {
	pkgs := []Package{}
	if _, err := os.Lstat(filepath.Join(bd.rootfs, "usr/bin/npm")); err != nil {
		return pkgs, nil
	}
	var out bytes.Buffer
	// npm ls exits non-zero on mere warnings (extraneous packages); the JSON
	// is what counts.
	lsErr := bd.chroot(ctx, nil, &out, "npm", "ls", "-g", "--json", "--depth=0")
	var ls struct {
		Dependencies map[string]struct {
			Version string `json:"version"`
		} `json:"dependencies"`
	}
	if err := json.Unmarshal(out.Bytes(), &ls); err != nil {
		return nil, errors.Join(fmt.Errorf("npm ls: %w", err), lsErr)
	}
	for name, d := range ls.Dependencies {
		pkgs = append(pkgs, Package{Name: name, Version: d.Version})
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	return pkgs, nil
}

const mib = 1 << 20

func (bd *build) mkfs(ctx context.Context) error {
	size, inodes, err := diskUsage(bd.rootfs)
	if err != nil {
		return err
	}
	img := filepath.Join(bd.tmp, "rootfs.ext4")
	// Room for the journal and metadata; -N because the default inode
	// ratio runs out on trees of many small files such as node_modules.
	err = bd.host(ctx, "mkfs.ext4", "-q", "-N", fmt.Sprint(inodes*3/2+16384),
		"-d", bd.rootfs, img, fmt.Sprintf("%dM", ext4SizeMiB(size)))
	if err != nil {
		return err
	}
	st, err := os.Stat(img)
	if err != nil {
		return err
	}
	bd.man.Ext4Size = st.Size()
	return nil
}

// ext4SizeMiB is the rootfs size plus 30% and 64 MiB, in whole MiB.
func ext4SizeMiB(size int64) int64 {
	return (size*13/10 + 64*mib + mib - 1) / mib
}

// diskUsage adds up the root directory's files in whole 4 KiB blocks, each
// hard-linked file once, and counts inodes.
func diskUsage(root string) (size, inodes int64, err error) {
	seen := map[uint64]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 && !d.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		inodes++
		size += blocks(info)
		return nil
	})
	return size, inodes, err
}

func blocks(info fs.FileInfo) int64 {
	const block = 4096
	n := info.Size()
	switch {
	case info.IsDir():
		n = max(n, block)
	case info.Mode()&fs.ModeSymlink != 0 && n < 60:
		return 0 // stored in the inode
	case !info.Mode().IsRegular() && info.Mode()&fs.ModeSymlink == 0:
		return 0
	}
	return (n + block - 1) / block * block
}
