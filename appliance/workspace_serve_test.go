package appliance

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"hearth/fs"
	"hearth/fs/remote"
)

// TestWorkspaceServedToNodes: a daemon with workspace.listen serves a
// session's view that another node mounts with sshfs; what either side
// writes the other reads, and a snapshot on the serving node holds what
// the node wrote.
func TestWorkspaceServedToNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	if _, err := exec.LookPath("sshfs"); err != nil {
		t.Skip("sshfs: not found (Debian package sshfs)")
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "node.key")
	if _, err := remote.GenerateKey(key); err != nil {
		t.Fatal(err)
	}
	cfg := Config{StateDir: filepath.Join(dir, "state"), Workspace: WorkspaceConfig{Mount: filepath.Join(dir, "agents"),
		Listen: "127.0.0.1:0", NodeKeys: key + ".pub"}}
	d, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	c := NewClient(cfg.SocketPath())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.CreateSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(filepath.Join(cfg.StateDir, "workspace-serve", remote.HostKeyFile+".pub"))
	if err != nil {
		t.Fatal(err)
	}
	known := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(known, []byte(knownLine(d.WorkspaceAddr(), pub)), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := remote.MountView(ctx, remote.Node{Addr: d.WorkspaceAddr(), Session: "s1", KeyFile: key, KnownHosts: known}, filepath.Join(dir, "node"))
	if err != nil {
		t.Fatalf("MountView: %v", err)
	}
	defer m.Unmount()
	if err := os.WriteFile(filepath.Join(m.Dir(), "s1", "outputs", "from-node"), []byte("node"), 0o644); err != nil {
		t.Fatalf("write through the node's mount: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(cfg.Workspace.Mount, "s1", "outputs", "from-node")); err != nil || string(got) != "node" {
		t.Errorf("host view reads from-node = %q, %v", got, err)
	}
	snap, err := c.Snapshot(ctx, "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.Dir(), "s1", "outputs", "from-node"), []byte("later"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(ctx, "s1", snap); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := os.ReadFile(filepath.Join(m.Dir(), "s1", "outputs", "from-node"))
		if err == nil && string(got) == "node" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node reads from-node after restore = %q, %v; want node", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// knownLine is a known_hosts line trusting the authorized_keys-format
// public key pub for host:port addr.
func knownLine(addr string, pub []byte) string {
	host, port, _ := net.SplitHostPort(addr)
	return "[" + host + "]:" + port + " " + string(pub)
}

// TestServeWorkspaceAlone: hearth workspace serve holds the store without
// a daemon; what a node writes is in the store once it stops.
func TestServeWorkspaceAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("serving views mounts FUSE, which needs root")
	}
	if _, err := exec.LookPath("sshfs"); err != nil {
		t.Skip("sshfs: not found (Debian package sshfs)")
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "node.key")
	if _, err := remote.GenerateKey(key); err != nil {
		t.Fatal(err)
	}
	cfg := Config{StateDir: filepath.Join(dir, "state"), Workspace: WorkspaceConfig{Mount: filepath.Join(dir, "agents"),
		Listen: "127.0.0.1:0", NodeKeys: key + ".pub"}}
	store, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateSession("s1", fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serveCtx, stop := context.WithCancel(ctx)
	addrs, done := make(chan string, 1), make(chan error, 1)
	go func() { done <- ServeWorkspace(serveCtx, cfg, nil, func(a string) { addrs <- a }) }()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("ServeWorkspace = %v", err)
	}
	pub, err := os.ReadFile(filepath.Join(cfg.StateDir, "workspace-serve", remote.HostKeyFile+".pub"))
	if err != nil {
		t.Fatal(err)
	}
	known := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(known, []byte(knownLine(addr, pub)), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := remote.MountView(ctx, remote.Node{Addr: addr, Session: "s1", KeyFile: key, KnownHosts: known}, filepath.Join(dir, "node"))
	if err != nil {
		t.Fatalf("MountView: %v", err)
	}
	if err := os.WriteFile(filepath.Join(m.Dir(), "s1", "outputs", "f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.Unmount()
	stop()
	if err := <-done; err != nil {
		t.Fatalf("ServeWorkspace after stop = %v", err)
	}
	store, err = fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if got, err := store.ReadFile("s1", "", "outputs/f", 0); err != nil || string(got) != "kept" {
		t.Errorf("store has s1/outputs/f = %q, %v after serve stopped; want kept", got, err)
	}
}

// TestServeWorkspaceRefusedBesideDaemon: the store is never opened by a
// daemon and by hearth workspace serve at once.
func TestServeWorkspaceRefusedBesideDaemon(t *testing.T) {
	d, _ := startDaemon(t)
	cfg := d.cfg
	key := filepath.Join(t.TempDir(), "node.key")
	if _, err := remote.GenerateKey(key); err != nil {
		t.Fatal(err)
	}
	cfg.Workspace.Listen, cfg.Workspace.NodeKeys = "127.0.0.1:0", key+".pub"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ServeWorkspace(ctx, cfg, nil, nil); err == nil {
		t.Fatalf("ServeWorkspace beside a running daemon succeeded")
	}
}
