package jail

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"hearth/vmm"
	"hearth/vmm/guest"
)

// claudeMachine boots a machine of the real claude-code image (Debian
// with node, python3, git and apt).
func claudeMachine(t *testing.T, id string) vmm.Machine {
	t.Helper()
	d := newDriver(t)
	for _, tool := range []string{"debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("building the claude-code image needs %s (scripts/test.sh installs it)", tool)
		}
	}
	img := buildImage(t, "claude-code")
	ctx := context.Background()
	m, err := d.Create(ctx, vmm.Spec{ID: id, RootFS: img.Rootfs(), UID: 1000, GID: 1000, Memory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(context.Background()) })
	return m
}

// run execs argv in m as uid and returns its output and exit code.
func run(t *testing.T, m vmm.Machine, uid uint32, argv ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	st, err := m.Guest().Exec(ctx, guest.ExecRequest{Argv: argv, UID: &uid, GID: &uid}, nil, &out, &out)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", argv, m.ID(), err)
	}
	if st.Error != "" {
		t.Fatalf("exec %q in %s: %s", argv, m.ID(), st.Error)
	}
	return out.String(), st.Code
}

// TestSeccompRealWorkloads: the allow-list leaves what agents and a
// Debian userland do working, as the agent user and as root.
func TestSeccompRealWorkloads(t *testing.T) {
	m := claudeMachine(t, "workloads")
	httpRoundTrip := `const h=require("http");const s=h.createServer((q,r)=>r.end("pong")).listen(0,"127.0.0.1",()=>{h.get("http://127.0.0.1:"+s.address().port,r=>{r.on("data",d=>{console.log(String(d));s.close()})})})`
	workers := `const {Worker}=require("worker_threads");new Worker("require('worker_threads').parentPort.postMessage(6*7)",{eval:true}).on("message",m=>console.log(m))`
	node := `const os=require("os");os.networkInterfaces();require("child_process").execSync("true");require("fs").writeFileSync("/tmp/n","x");require("crypto").randomBytes(8);console.log("node ok")`
	python := `import socket, subprocess, threading, multiprocessing, ssl, sqlite3, os
socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
socket.if_nameindex()
socket.getaddrinfo("127.0.0.1", 80)  # numeric: the image has no /etc/hosts
assert subprocess.run(["true"]).returncode == 0
with multiprocessing.Pool(2) as p: assert p.map(abs, [-1, -2]) == [1, 2]
t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
sqlite3.connect(":memory:").execute("select 1")
print("python ok")`
	tests := []struct {
		name string
		argv []string
		want string
	}{
		{"claude", []string{"claude", "--version"}, "(Claude Code)"},
		{"node", []string{"node", "-e", node}, "node ok"},
		{"node http on loopback", []string{"node", "-e", httpRoundTrip}, "pong"},
		{"node worker threads", []string{"node", "-e", workers}, "42"},
		{"python", []string{"python3", "-c", python}, "python ok"},
		{"git", []string{"sh", "-c", "cd /tmp && rm -rf r && git init -q r && cd r && echo a > a && git add a && git -c user.name=a -c user.email=a@b commit -qm one && git log --oneline | wc -l"}, "1"},
		{"apt-get version", []string{"apt-get", "--version"}, "apt "},
		{"apt-get simulated install", []string{"apt-get", "-s", "install", "git"}, "git is already the newest version"},
		{"dpkg", []string{"dpkg", "-s", "python3"}, "Status: install ok installed"},
	}
	for _, tc := range tests {
		for _, uid := range []uint32{1000, 0} {
			t.Run(fmt.Sprintf("%s as %d", tc.name, uid), func(t *testing.T) {
				out, code := run(t, m, uid, tc.argv...)
				if code != 0 || !strings.Contains(out, tc.want) {
					t.Errorf("%q as uid %d = %q (exit %d), want %q in it", tc.argv, uid, out, code, tc.want)
				}
			})
		}
	}
}

// hostileProbe is a python3 script that makes each attack and prints its
// name and the errno it got (0 if it got through).
const hostileProbe = `import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def sys(name, nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(name, 0 if r >= 0 else ctypes.get_errno())
def sock(name, fam, typ, proto=0):
    try:
        socket.socket(fam, typ, proto).close(); print(name, 0)
    except OSError as e:
        print(name, e.errno)
sock("AF_VSOCK", 40, socket.SOCK_STREAM)
sock("AF_PACKET", 17, socket.SOCK_RAW, 0x0300)
sock("AF_BLUETOOTH", 31, socket.SOCK_RAW, 1)
sock("AF_ALG", 38, socket.SOCK_SEQPACKET)
sock("AF_NETLINK audit", 16, socket.SOCK_RAW, 9)
sock("AF_NETLINK uevent", 16, socket.SOCK_DGRAM, 15)
pid = os.getpid()
sys("kcmp", 312, pid, pid, 0, 0, 0)
pidfd = os.pidfd_open(pid)
sys("pidfd_getfd", 438, pidfd, 0, 0)
sys("process_madvise", 440, pidfd, 0, 0, 20, 0)
sys("mbind", 237, 0, 0, 0, 0, 0, 0)
sys("set_mempolicy", 238, 0, 0, 0)
sys("move_pages", 279, 0, 0, 0, 0, 0, 0)
sys("migrate_pages", 256, 0, 0, 0, 0)
sys("sysfs", 139, 3)
sys("ustat", 136, os.stat("/").st_dev, 0)
os.makedirs("/tmp/m", exist_ok=True)
r = libc.mount(b"none", b"/tmp/m", b"tmpfs", 0, None); print("mount", 0 if r == 0 else ctypes.get_errno())
sys("bpf", 321, 0xffff, 0, 0)
sys("keyctl", 250, 0, -3, 0)
sys("userfaultfd", 323, 0)
sys("io_uring_setup", 425, 1, 0)
sys("unshare CLONE_NEWUSER", 272, 0x10000000)
sys("clone3", 435, 0, 0)
`

// TestHostileSyscallsInMachine makes, from inside a real machine as the
// agent user and as root, the calls and sockets the seccomp filter must
// refuse, and fails if any gets through or is refused otherwise.
func TestHostileSyscallsInMachine(t *testing.T) {
	m := claudeMachine(t, "hostile")
	const (
		eperm        = "1"
		enosys       = "38"
		eafnosupport = "97"
	)
	want := map[string]string{
		"AF_VSOCK": eafnosupport, "AF_PACKET": eafnosupport, "AF_BLUETOOTH": eafnosupport, "AF_ALG": eafnosupport,
		"AF_NETLINK audit": eafnosupport, "AF_NETLINK uevent": eafnosupport,
		"kcmp": eperm, "pidfd_getfd": eperm, "process_madvise": eperm, "mbind": eperm, "set_mempolicy": eperm,
		"move_pages": eperm, "migrate_pages": eperm, "sysfs": eperm, "ustat": eperm, "mount": eperm,
		"bpf": eperm, "keyctl": eperm, "userfaultfd": eperm, "io_uring_setup": eperm,
		"unshare CLONE_NEWUSER": eperm, "clone3": enosys,
	}
	for _, uid := range []uint32{1000, 0} {
		out, code := run(t, m, uid, "python3", "-c", hostileProbe)
		if code != 0 {
			t.Fatalf("probe as uid %d exited %d: %s", uid, code, out)
		}
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if i := strings.LastIndexByte(line, ' '); i > 0 {
				got[line[:i]] = line[i+1:]
			}
		}
		for name, errno := range want {
			if got[name] != errno {
				t.Errorf("as uid %d, %s = errno %q, want %s (0: it got through)", uid, name, got[name], errno)
			}
		}
	}
}
