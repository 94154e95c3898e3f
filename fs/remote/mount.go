package remote

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"golang.org/x/sys/unix"

	"hearth/fs"
)

// Node is how a node reaches one session's view on the serving node.
type Node struct {
	Addr       string // the serving node's host:port
	Session    string // whose view: writable for it, read-only for others
	KeyFile    string // this node's private key (OpenSSH format)
	KnownHosts string // a known_hosts file holding the serving node's host key
	// IDs shift owners as for a local view of a machine that runs in its
	// own range of host ids (fs.ViewOptions.IDs); the zero value shifts
	// nothing.
	IDs fs.IDShift
	// ReadOnly mounts the view read-only whatever the view allows.
	ReadOnly bool
}

func (n Node) user() string { return viewUser{session: n.Session, ids: n.IDs}.String() }

// ErrNoSSHFS means the sshfs client is not installed.
var ErrNoSSHFS = errors.New("sshfs not found: install the sshfs package")

// WriteKnownHosts writes a known_hosts file that trusts key for addr.
func WriteKnownHosts(path, addr string, key ssh.PublicKey) error {
	line := knownhosts.Line([]string{knownhosts.Normalize(addr)}, key) + "\n"
	return writeNew(path, []byte(line), 0o644)
}

// Timings of a mount. The serving node is declared gone after
// aliveInterval*aliveCount without an answer; then sshfs reconnects on
// the next request (-o reconnect) or that request fails with EIO.
const (
	aliveInterval = 5
	aliveCount    = 3
	// cacheSeconds is how long sshfs trusts a directory entry or
	// attributes it has seen: a change another node made shows up within
	// it, as the local view's own one-second cache.
	cacheSeconds = 1
	mountWait    = 30 * time.Second
	unmountWait  = 10 * time.Second
)

// sshfsArgs are the arguments that mount n at dir in the foreground.
func (n Node) sshfsArgs(dir string) ([]string, error) {
	if err := fs.ValidateID("session", n.Session); err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(n.Addr)
	if err != nil {
		return nil, fmt.Errorf("workspace address %q: %w (want host:port)", n.Addr, err)
	}
	if strings.ContainsAny(host, ":") {
		host = "[" + host + "]"
	}
	opts := []string{
		"reconnect",
		fmt.Sprintf("ServerAliveInterval=%d,ServerAliveCountMax=%d", aliveInterval, aliveCount),
		"IdentityFile=" + n.KeyFile, "IdentitiesOnly=yes", "BatchMode=yes",
		"UserKnownHostsFile=" + n.KnownHosts, "GlobalKnownHostsFile=/dev/null", "StrictHostKeyChecking=yes",
		fmt.Sprintf("dcache_timeout=%d", cacheSeconds),
		// Symlinks mean what they mean in a local view; the serving node
		// never follows one out of the view (os.Root).
		"no_contain_symlinks",
		"allow_other", "default_permissions",
		// AES-GCM (AES-NI on every x86 host) reads twice as fast here as
		// ssh's default, chacha20-poly1305; both ends are known.
		"Ciphers=aes128-gcm@openssh.com",
	}
	if n.ReadOnly {
		opts = append(opts, "ro")
	}
	for _, o := range opts {
		if strings.ContainsAny(o, "\n") {
			return nil, fmt.Errorf("sshfs option %q: bad character", o)
		}
	}
	return []string{"-f", "-F", "/dev/null", "-p", port, "-o", strings.Join(opts, ","),
		n.user() + "@" + host + ":/", dir}, nil
}

// Mount is one sshfs mount of a session's view.
type Mount struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // sshfs's exit, valid after done
	log  *bytes.Buffer

	once sync.Once
	mu   sync.Mutex // guards log while sshfs runs
}

// MountView mounts n's view at dir with sshfs and returns once it is
// mounted, or with sshfs's own words if it could not.
func MountView(ctx context.Context, n Node, dir string) (*Mount, error) {
	bin, err := exec.LookPath("sshfs")
	if err != nil {
		return nil, ErrNoSSHFS
	}
	args, err := n.sshfsArgs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("mount workspace at %s: %w", dir, err)
	}
	m := &Mount{dir: dir, done: make(chan struct{}), log: &bytes.Buffer{}}
	m.cmd = exec.Command(bin, args...)
	m.cmd.Stdout, m.cmd.Stderr = lockedWriter{m}, lockedWriter{m}
	m.cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("mount workspace at %s: %w", dir, err)
	}
	go func() { m.err = m.cmd.Wait(); close(m.done) }()
	if err := m.waitMounted(ctx); err != nil {
		m.Unmount()
		return nil, err
	}
	if err := m.probe(ctx); err != nil {
		m.Unmount()
		return nil, err
	}
	return m, nil
}

// probe lists the mount's root once: sshfs may mount before its first
// connection is made, so only an answer from the server says it worked.
func (m *Mount) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, mountWait)
	defer cancel()
	res := make(chan error, 1)
	go func() { _, err := os.ReadDir(m.dir); res <- err }() // ends at the latest when Unmount aborts it
	select {
	case err := <-res:
		if err != nil {
			// Give sshfs a moment to finish its message.
			select {
			case <-m.done:
			case <-time.After(200 * time.Millisecond):
			}
			return fmt.Errorf("mount workspace at %s: %w: %s", m.dir, err, m.words())
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mount workspace at %s: no answer: %w", m.dir, ctx.Err())
	}
}

// waitMounted polls the mount table until sshfs shows up at dir.
func (m *Mount) waitMounted(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, mountWait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if ok, err := isSSHFSMount(m.dir); err != nil || ok {
			return err
		}
		select {
		case <-m.done:
			return fmt.Errorf("mount workspace at %s: sshfs exited (%v): %s", m.dir, m.err, m.words())
		case <-ctx.Done():
			return fmt.Errorf("mount workspace at %s: %w", m.dir, ctx.Err())
		case <-tick.C:
		}
	}
}

func isSSHFSMount(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts ... - fstype source
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[4] != dir {
			continue
		}
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && fields[i+1] == "fuse.sshfs" {
				return true, nil
			}
		}
	}
	return false, sc.Err()
}

// Dir is where the view is mounted.
func (m *Mount) Dir() string { return m.dir }

// Done is closed when sshfs has exited: the mount is gone.
func (m *Mount) Done() <-chan struct{} { return m.done }

// Unmount unmounts and waits for sshfs to exit; if it will not within a
// bound it is killed and the mount detached. It is idempotent.
func (m *Mount) Unmount() error {
	var err error
	m.once.Do(func() { err = m.unmount() })
	return err
}

// Detach takes the mount out of the file tree at once and lets sshfs
// exit when the last file open in it is closed (an os.Root kept by
// Client.OpenSession); it does not wait.
func (m *Mount) Detach() {
	m.once.Do(func() { unix.Unmount(m.dir, unix.MNT_DETACH) }) // MountView's goroutine reaps sshfs
}

func (m *Mount) unmount() error {
	if err := unix.Unmount(m.dir, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		unix.Unmount(m.dir, unix.MNT_DETACH)
	}
	select {
	case <-m.done:
		return nil
	case <-time.After(unmountWait):
	}
	unix.Kill(-m.cmd.Process.Pid, unix.SIGKILL)
	unix.Unmount(m.dir, unix.MNT_DETACH)
	<-m.done
	return fmt.Errorf("unmount workspace at %s: sshfs did not exit within %s; killed", m.dir, unmountWait)
}

// dial opens an SSH connection as n, for Follow.
func (n Node) dial(ctx context.Context) (*ssh.Client, error) {
	return dialAs(ctx, n, n.user())
}

// dialAs opens an SSH connection to n.Addr with n's key as user.
func dialAs(ctx context.Context, n Node, user string) (*ssh.Client, error) {
	c, _, err := dialKey(ctx, n, user)
	return c, err
}

// dialKey is dialAs, also returning the host key the serving node
// proved it holds (one that n.KnownHosts trusts).
func dialKey(ctx context.Context, n Node, user string) (*ssh.Client, ssh.PublicKey, error) {
	b, err := os.ReadFile(n.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("node key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, nil, fmt.Errorf("node key %s: %w", n.KeyFile, err)
	}
	hk, err := knownhosts.New(n.KnownHosts)
	if err != nil {
		return nil, nil, fmt.Errorf("known hosts: %w", err)
	}
	var proved ssh.PublicKey
	check := func(host string, remote net.Addr, key ssh.PublicKey) error {
		if err := hk(host, remote, key); err != nil {
			return err
		}
		proved = key
		return nil
	}
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: check, Timeout: handshakeTimeout}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", n.Addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dial workspace %s: %w", n.Addr, err)
	}
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewClientConn(c, n.Addr, cfg)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("ssh to workspace %s: %w", n.Addr, err)
	}
	c.SetDeadline(time.Time{})
	return ssh.NewClient(sc, chans, reqs), proved, nil
}

type lockedWriter struct{ m *Mount }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	if w.m.log.Len() > 64<<10 {
		return len(b), nil // enough to say what went wrong
	}
	return w.m.log.Write(b)
}

// words is what sshfs (and ssh) said.
func (m *Mount) words() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.TrimSpace(m.log.String())
}
