package remote

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hearth/fs"
)

// requireSSHFS skips tests that mount with sshfs when this machine cannot.
func requireSSHFS(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("serving views mounts FUSE as root; run the tests as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("/dev/fuse: not found")
	}
	if _, err := exec.LookPath("sshfs"); err != nil {
		t.Skip("sshfs: not found (Debian package sshfs)")
	}
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("ssh: not found (Debian package openssh-client)")
	}
}

// testbed is a store served over SSH on loopback with one authorized
// node key.
type testbed struct {
	store    *fs.Store
	srv      *Server
	dir      string // server state
	addr     string
	nodeKeys string
	key      string // the authorized node's private key
	known    string
}

func newTestbed(t testing.TB, sessions ...string) *testbed {
	t.Helper()
	requireSSHFS(t)
	tmp := t.TempDir()
	st, err := fs.Open(fs.Options{Dir: filepath.Join(tmp, "store")})
	if err != nil {
		t.Fatalf("fs.Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	for i, s := range sessions {
		if err := st.CreateSession(s, fs.Owner{UID: uint32(2000 + i), GID: uint32(2000 + i)}); err != nil {
			t.Fatalf("CreateSession(%q) = %v", s, err)
		}
	}
	tb := &testbed{store: st, dir: filepath.Join(tmp, "serve"), nodeKeys: filepath.Join(tmp, "nodes"),
		key: filepath.Join(tmp, "node1"), known: filepath.Join(tmp, "known_hosts")}
	if _, err := GenerateKey(tb.key); err != nil {
		t.Fatal(err)
	}
	pub, _ := os.ReadFile(tb.key + ".pub")
	if err := os.WriteFile(tb.nodeKeys, append(pub[:len(pub)-1], " node1\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	tb.start(t, "127.0.0.1:0")
	return tb
}

// start (re)starts the server on addr.
func (tb *testbed) start(t testing.TB, addr string) {
	t.Helper()
	srv, err := NewServer(Config{Store: tb.store, Dir: tb.dir, NodeKeys: tb.nodeKeys})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	var ln net.Listener
	for i := 0; ; i++ { // the old listener's port may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil || i == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	tb.srv, tb.addr = srv, ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	if err := WriteKnownHosts(tb.known, tb.addr, srv.HostKey()); err != nil {
		t.Fatal(err)
	}
}

func (tb *testbed) node(session string) Node {
	return Node{Addr: tb.addr, Session: session, KeyFile: tb.key, KnownHosts: tb.known}
}

// mount mounts session's view over sshfs for the rest of the test.
func (tb *testbed) mount(t testing.TB, session string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt-"+session)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := MountView(ctx, tb.node(session), dir)
	if err != nil {
		t.Fatalf("MountView(%s) = %v", session, err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("Unmount: %v", err)
		}
	})
	return dir
}

func (tb *testbed) write(session, p, content string) error {
	_, err := tb.store.WriteFile(session, p, strings.NewReader(content), 0, fs.Owner{})
	return err
}

func (tb *testbed) read(session, p string) (string, error) {
	b, err := tb.store.ReadFile(session, "", p, 0)
	return string(b), err
}

// mountsUnder lists the mounts at or below dir.
func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}
