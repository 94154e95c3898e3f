package fs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Views check permissions themselves (perm.go). These tests hold them to
// the kernel: the same operations, by the same users, on the same owners
// and modes, must fail or succeed alike in a machine's view and in a
// plain directory of the host's filesystem, where the kernel decides.

// The ids of the machine whose view is tested: store ids permStore+i are
// host ids permHost+i in its view.
const (
	permStore = 200000
	permHost  = 300000
)

var permShift = IDShift{From: permStore, To: permHost, Size: 65536}

// permUser is one caller: host ids, and whether it is root in a user
// namespace of its own that maps 0 to permHost (the machine's root).
type permUser struct {
	name     string
	uid, gid uint32
	groups   []uint32
	userns   bool
}

var permUsers = []permUser{
	// The privileged run first, so their lookups are cached when the
	// others walk the same paths: a cached entry must not let them by.
	{name: "host-root", uid: 0, gid: 0},
	{name: "machine-root", uid: permHost, gid: permHost, userns: true},
	{name: "owner", uid: permHost + 1000, gid: permHost + 1000},
	{name: "member", uid: permHost + 1001, gid: permHost + 1001, groups: []uint32{permHost + 2000}},
	{name: "other", uid: permHost + 1002, gid: permHost + 1002},
	{name: "outsider", uid: 65534, gid: 65534},
}

// permOwner is who owns a scenario's directory and files, in host ids.
type permOwner struct{ uid, gid uint32 }

var (
	ownerAgent       = permOwner{permHost + 1000, permHost + 2000}
	ownerMachineRoot = permOwner{permHost, permHost}
	ownerHostRoot    = permOwner{0, 0}
)

type permScenario struct {
	dirOwner, fileOwner permOwner
	dirMode, fileMode   uint32
}

func permScenarios() []permScenario {
	var out []permScenario
	for _, dm := range []uint32{0o755, 0o700, 0o711, 0o730, 0o1777, 0o555, 0o770} {
		for _, fm := range []uint32{0o644, 0o600, 0o640, 0o604, 0o444, 0o666, 0o000, 0o4755, 0o2755, 0o755} {
			out = append(out, permScenario{ownerAgent, ownerAgent, dm, fm})
		}
	}
	for _, o := range []permOwner{ownerMachineRoot, ownerHostRoot} {
		for _, dm := range []uint32{0o755, 0o555, 0o1777} {
			for _, fm := range []uint32{0o444, 0o644, 0o600} {
				out = append(out, permScenario{o, o, dm, fm})
				out = append(out, permScenario{o, ownerAgent, dm, fm})
			}
		}
	}
	return out
}

// permOps are the operations tried, each on objects of its own in every
// scenario directory: "f" is the op's file, "sub" a directory in the
// scenario directory, "open" a directory everyone may write.
var permOps = []string{
	"read", "write", "otrunc", "trunc", "stat", "exec", "create", "mkdir", "mknod", "symlink",
	"unlink", "rmdir", "rename", "rename-out", "rename-dir-out", "link", "link-out",
	"chmod", "chmod-setgid", "chown-self", "chown-other", "chgrp", "utime-now", "utime-set",
	"setxattr", "getxattr", "removexattr", "readdir", "access-r", "access-w", "access-x", "chdir",
}

// buildPerm lays out every scenario under root, as root, with owners
// given by own (host ids to the ids stored where root is).
func buildPerm(t *testing.T, root string, own func(uint32) uint32, exe []byte) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	chown := func(p string, o permOwner) { must(os.Lchown(p, int(own(o.uid)), int(own(o.gid)))) }
	open := filepath.Join(root, "open")
	must(os.Mkdir(open, 0o777))
	must(os.Chmod(open, 0o777))
	for i, sc := range permScenarios() {
		dir := filepath.Join(root, fmt.Sprintf("s%03d", i))
		must(os.Mkdir(dir, 0o755))
		for _, op := range permOps {
			f := filepath.Join(dir, op)
			data := []byte("data\n")
			if op == "exec" {
				data = exe
			}
			must(os.WriteFile(f, data, 0o600))
			must(unix.Setxattr(f, "user.t", []byte("v"), 0))
			chown(f, sc.fileOwner)
			must(os.Chmod(f, os.FileMode(sc.fileMode&0o777)))
			must(unix.Chmod(f, sc.fileMode)) // with the set-id bits, after chown
			sub := filepath.Join(dir, "sub-"+op)
			must(os.Mkdir(sub, 0o755))
			chown(sub, sc.fileOwner)
			must(unix.Chmod(sub, sc.fileMode|0o100))
		}
		chown(dir, sc.dirOwner)
		must(unix.Chmod(dir, sc.dirMode))
	}
}

// permCall is one op, on the objects of one scenario's directory.
type permCall struct {
	Op, Dir string
}

// runPerm runs every op of every scenario under root as u, in a process
// of its own, and returns each call's errno.
func runPerm(t *testing.T, bin, root string, u permUser) []syscall.Errno {
	t.Helper()
	var calls []permCall
	for i := range permScenarios() {
		for _, op := range permOps {
			calls = append(calls, permCall{op, filepath.Join(root, fmt.Sprintf("s%03d", i))})
		}
	}
	in, _ := json.Marshal(calls)
	cmd := exec.Command(bin, "-test.run=^TestPermChild$")
	cmd.Env = append(os.Environ(), "HEARTH_PERM_CHILD=1", "HEARTH_PERM_OPEN="+filepath.Join(root, "open"), "HEARTH_PERM_USER="+u.name)
	cmd.Stdin = strings.NewReader(string(in))
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if u.userns {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.uid), Size: 65536}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.gid), Size: 65536}}
		// Become the namespace's root (the host's id u.uid): the creator's
		// ids are not mapped in it.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
	} else if u.uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ops as %s: %v: %s", u.name, err, errOutput(err))
	}
	var res []syscall.Errno
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(calls) {
		t.Fatalf("ops as %s answered %q: %v", u.name, out, err)
	}
	return res
}

func errOutput(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

// TestPermChild is the process runPerm starts; it does nothing otherwise.
func TestPermChild(t *testing.T) {
	if os.Getenv("HEARTH_PERM_CHILD") != "1" {
		t.Skip("runs only as TestPermissionsAsTheKernel's child process")
	}
	var calls []permCall
	if err := json.NewDecoder(os.Stdin).Decode(&calls); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	open := os.Getenv("HEARTH_PERM_OPEN")
	who := os.Getenv("HEARTH_PERM_USER")
	res := make([]syscall.Errno, len(calls))
	for i, c := range calls {
		res[i] = permOp(c.Op, c.Dir, open, fmt.Sprintf("%s-%s-%d", who, c.Op, i))
	}
	json.NewEncoder(os.Stdout).Encode(res)
	os.Exit(0)
}

func errnoOfErr(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// permOp does op on dir's objects; tag makes the names it makes unique.
func permOp(op, dir, open, tag string) syscall.Errno {
	f := filepath.Join(dir, op)
	sub := filepath.Join(dir, "sub-"+op)
	openFile := func(flags int) syscall.Errno {
		fd, err := unix.Open(f, flags|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoOfErr(err)
	}
	var uid = uint32(os.Getuid())
	switch op {
	case "read":
		return openFile(unix.O_RDONLY)
	case "write":
		return openFile(unix.O_WRONLY)
	case "otrunc":
		return openFile(unix.O_WRONLY | unix.O_TRUNC)
	case "trunc":
		return errnoOfErr(unix.Truncate(f, 1))
	case "stat":
		var st unix.Stat_t
		return errnoOfErr(unix.Stat(f, &st))
	case "exec":
		err := exec.Command(f).Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0 // it ran
		}
		return errnoOfErr(err)
	case "create":
		fd, err := unix.Open(filepath.Join(dir, "new-"+tag), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return errnoOfErr(err)
	case "mkdir":
		return errnoOfErr(unix.Mkdir(filepath.Join(dir, "nd-"+tag), 0o755))
	case "mknod":
		return errnoOfErr(unix.Mkfifo(filepath.Join(dir, "fifo-"+tag), 0o644))
	case "symlink":
		return errnoOfErr(unix.Symlink("x", filepath.Join(dir, "sl-"+tag)))
	case "unlink":
		return errnoOfErr(unix.Unlink(f))
	case "rmdir":
		return errnoOfErr(unix.Rmdir(sub))
	case "rename":
		return errnoOfErr(unix.Rename(f, filepath.Join(dir, "renamed-"+tag)))
	case "rename-out":
		return errnoOfErr(unix.Rename(f, filepath.Join(open, "moved-"+tag)))
	case "rename-dir-out":
		return errnoOfErr(unix.Rename(sub, filepath.Join(open, "moveddir-"+tag)))
	case "link":
		return errnoOfErr(unix.Link(f, filepath.Join(dir, "ln-"+tag)))
	case "link-out":
		return errnoOfErr(unix.Link(f, filepath.Join(open, "ln-"+tag)))
	case "chmod":
		return errnoOfErr(unix.Chmod(f, 0o640))
	case "chmod-setgid":
		return errnoOfErr(unix.Chmod(f, 0o2750))
	case "chown-self":
		return errnoOfErr(unix.Chown(f, int(uid), -1))
	case "chown-other":
		return errnoOfErr(unix.Chown(f, 7, -1))
	case "chgrp":
		return errnoOfErr(unix.Chown(f, -1, int(permHost+2000-permHostOffset())))
	case "utime-now":
		return errnoOfErr(unix.UtimesNanoAt(unix.AT_FDCWD, f, nil, 0))
	case "utime-set":
		ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
		return errnoOfErr(unix.UtimesNanoAt(unix.AT_FDCWD, f, ts, 0))
	case "setxattr":
		return errnoOfErr(unix.Setxattr(f, "user.n", []byte("1"), 0))
	case "getxattr":
		_, err := unix.Getxattr(f, "user.t", make([]byte, 16))
		return errnoOfErr(err)
	case "removexattr":
		return errnoOfErr(unix.Removexattr(f, "user.t"))
	case "readdir":
		d, err := os.Open(dir)
		if err == nil {
			_, err = d.Readdirnames(-1)
			d.Close()
		}
		return errnoOfErr(err)
	case "access-r":
		return errnoOfErr(unix.Access(f, unix.R_OK))
	case "access-w":
		return errnoOfErr(unix.Access(f, unix.W_OK))
	case "access-x":
		return errnoOfErr(unix.Access(f, unix.X_OK))
	case "chdir":
		return errnoOfErr(unix.Chdir(sub))
	}
	return syscall.ENOSYS
}

// permHostOffset is how the calling process names host id permHost: 0
// in the machine root's user namespace, permHost outside.
func permHostOffset() uint32 {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err == nil && len(strings.Fields(string(b))) >= 2 && strings.Fields(string(b))[1] != "0" {
		return permHost
	}
	return 0
}

func TestPermissionsAsTheKernel(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "p")
	host := mountView(t, s, ViewOptions{Host: true})
	machine := mountView(t, s, ViewOptions{Session: "p", IDs: permShift})
	native := filepath.Join(t.TempDir(), "native")
	if err := os.Mkdir(native, 0o755); err != nil {
		t.Fatal(err)
	}
	openDir(t, native)
	openDir(t, machine)
	exe, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	// The test binary, where every user may run it.
	bin := filepath.Join(filepath.Dir(native), "fs.test")
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err == nil {
		_, err = io.Copy(out, self)
		out.Close()
	}
	self.Close()
	if err != nil {
		t.Fatal(err)
	}

	buildPerm(t, native, func(id uint32) uint32 { return id }, exe)
	buildPerm(t, filepath.Join(host, "p", "outputs"), permShift.in, exe)
	viewRoot := filepath.Join(machine, "p", "outputs")

	scenarios := permScenarios()
	checked := 0
	for _, u := range permUsers {
		want := runPerm(t, bin, native, u)
		got := runPerm(t, bin, viewRoot, u)
		for i, e := range want {
			sc, op := scenarios[i/len(permOps)], permOps[i%len(permOps)]
			checked++
			if got[i] != e {
				t.Errorf("%s: %s in dir %o (%d:%d) on file %o (%d:%d) = %v through the view, %v natively",
					u.name, op, sc.dirMode, sc.dirOwner.uid, sc.dirOwner.gid, sc.fileMode, sc.fileOwner.uid, sc.fileOwner.gid, errText(got[i]), errText(e))
			}
		}
	}
	t.Logf("%d calls by %d users compared", checked, len(permUsers))
}

func errText(e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	return e.Error()
}

// A directory that stops letting everyone search it stops letting them
// through at once, even where a walker's entries were cached.
func TestHostileSearchRevoked(t *testing.T) {
	requireFUSE(t)
	s := testStore(t)
	mustSession(t, s, "p")
	machine := mountView(t, s, ViewOptions{Session: "p", IDs: permShift})
	openDir(t, machine)
	dir := filepath.Join(machine, "p", "outputs", "private")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := &syscall.Credential{Uid: permHost + 1002, Gid: permHost + 1002}
	cat := func() error {
		cmd := exec.Command("cat", filepath.Join(dir, "secret"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: other}
		return cmd.Run()
	}
	if err := cat(); err != nil {
		t.Fatalf("another user reads a file of a 0755 directory: %v", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for cat() == nil {
		if time.Now().After(deadline) {
			t.Fatal("another user still reads a file of the directory 2 s after it became 0700")
		}
		time.Sleep(time.Millisecond)
	}
}
