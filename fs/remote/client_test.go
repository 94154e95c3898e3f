package remote

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hearth/fs"
)

// client dials the testbed's control channel as its authorized node.
func (tb *testbed) client(t testing.TB) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, ClientConfig{Addr: tb.addr, KeyFile: tb.key, KnownHosts: tb.known, RetryDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestClientStoreOperations: every operation the runner needs, run on the
// serving node's store through the control channel.
func TestClientStoreOperations(t *testing.T) {
	tb := newTestbed(t, "alpha")
	c := tb.client(t)
	owner := fs.Owner{UID: 3000, GID: 3000}
	if err := c.EnsureSession("newone", owner, fs.Quota{Bytes: 1 << 30, Inodes: 1000}); err != nil {
		t.Fatalf("EnsureSession(new) = %v", err)
	}
	if err := c.EnsureSession("alpha", owner, fs.Quota{Inodes: 500}); err != nil {
		t.Fatalf("EnsureSession(existing) = %v", err)
	}
	for _, si := range tb.store.Sessions() {
		if si.ID == "alpha" && si.Quota != (fs.Quota{Inodes: 500}) {
			t.Errorf("alpha quota = %+v, want 500 inodes", si.Quota)
		}
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16+7) // several data frames
	if err := c.WriteFile("alpha", "inputs/big.bin", bytes.NewReader(big), owner); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	if got, err := tb.store.ReadFile("alpha", "", "inputs/big.bin", 0); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("store has %d bytes (%v), want %d", len(got), err, len(big))
	}
	if err := c.MkdirAll("alpha", "outputs/a/b", owner); err != nil {
		t.Fatalf("MkdirAll = %v", err)
	}
	if err := c.WriteFile("alpha", "outputs/a/b/r.md", strings.NewReader("report"), owner); err != nil {
		t.Fatal(err)
	}
	if err := c.Chmod("alpha", "outputs/a/b/r.md", 0o600); err != nil {
		t.Fatalf("Chmod = %v", err)
	}
	got, err := c.Glob("alpha", "outputs/*/*/*.md")
	if err != nil || len(got) != 1 || got[0] != "outputs/a/b/r.md" {
		t.Fatalf("Glob = %q, %v", got, err)
	}
	if _, err := c.Glob("nosuch", "outputs/*"); !errors.Is(err, fs.ErrNotFound) {
		t.Errorf("Glob(missing session) = %v, want fs.ErrNotFound", err)
	}
	if err := c.Snapshot("alpha", "s1"); err != nil {
		t.Fatalf("Snapshot = %v", err)
	}
	if err := c.Snapshot("alpha", "s1"); !errors.Is(err, fs.ErrExists) {
		t.Errorf("Snapshot again = %v, want fs.ErrExists", err)
	}
	if err := c.RemoveAll("alpha", "outputs/a"); err != nil {
		t.Fatalf("RemoveAll = %v", err)
	}
	if got, _ := c.Glob("alpha", "outputs/*/*/*.md"); len(got) != 0 {
		t.Errorf("after RemoveAll Glob = %q", got)
	}
	if b, err := tb.store.ReadFile("alpha", "s1", "outputs/a/b/r.md", 0); err != nil || string(b) != "report" {
		t.Errorf("snapshot s1 holds %q, %v", b, err)
	}
	list, err := c.Snapshots("alpha")
	if err != nil || len(list) != 1 || list[0].Name != "s1" {
		t.Fatalf("Snapshots = %+v, %v", list, err)
	}
	holds, err := c.SnapshotHolds("alpha")
	if err != nil || len(holds) != 1 || holds[0].Holds != int64(len("report")) {
		t.Fatalf("SnapshotHolds = %+v, %v (want s1 holding the removed report)", holds, err)
	}
	if err := c.DeleteSnapshot("alpha", "s1"); err != nil {
		t.Fatalf("DeleteSnapshot = %v", err)
	}
	if list, _ := c.Snapshots("alpha"); len(list) != 0 {
		t.Errorf("after delete Snapshots = %+v", list)
	}
}

// TestClientOpenSession: a read-only view of a session, from a node.
func TestClientOpenSession(t *testing.T) {
	tb := newTestbed(t, "alpha")
	if err := tb.write("alpha", "outputs/skill.md", "skill"); err != nil {
		t.Fatal(err)
	}
	c := tb.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "open")
	root, err := c.OpenSession(ctx, "alpha", dir)
	if err != nil {
		t.Fatalf("OpenSession = %v", err)
	}
	if b, err := root.ReadFile("outputs/skill.md"); err != nil || string(b) != "skill" {
		t.Errorf("read skill = %q, %v", b, err)
	}
	if err := root.WriteFile("outputs/new.md", []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write through OpenSession = %v, want EROFS", err)
	}
	if got := mountsUnder(t, dir); len(got) != 0 {
		t.Errorf("mounts left in the tree: %q (want detached)", got)
	}
	root.Close()
}

// TestClientReconnects: the serving node restarts between requests; the
// client reconnects, and a request while it is away fails with
// ErrUnreachable once the retries are spent.
func TestClientReconnects(t *testing.T) {
	tb := newTestbed(t, "alpha")
	c := tb.client(t)
	if err := c.MkdirAll("alpha", "outputs/x", fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	tb.srv.Close()
	res := make(chan error, 1)
	go func() { res <- c.WriteFile("alpha", "outputs/x/after.md", strings.NewReader("after"), fs.Owner{}) }()
	time.Sleep(time.Second)
	tb.start(t, tb.addr)
	if err := <-res; err != nil {
		t.Fatalf("WriteFile across a restart = %v", err)
	}
	if got, err := tb.read("alpha", "outputs/x/after.md"); err != nil || got != "after" {
		t.Errorf("store has %q, %v", got, err)
	}
	tb.srv.Close()
	short, err := Dial(context.Background(), ClientConfig{Addr: tb.addr, KeyFile: tb.key, KnownHosts: tb.known})
	if err == nil {
		short.Close()
		t.Fatal("Dial to a stopped node succeeded")
	}
	c.cfg.Retries, c.cfg.RetryDelay = 3, 50*time.Millisecond
	if _, err := c.Glob("alpha", "outputs/*"); !errors.Is(err, ErrUnreachable) {
		t.Errorf("Glob with the node gone = %v, want ErrUnreachable", err)
	}
}

// TestClientWorkspaceID: a node reaching the workspace names it as the
// serving node does, and a restart with the same host key keeps the name.
func TestClientWorkspaceID(t *testing.T) {
	tb := newTestbed(t, "alpha")
	c := tb.client(t)
	want := WorkspaceID(tb.srv.HostKey())
	if got := c.WorkspaceID(); got != want || !strings.HasPrefix(got, "SHA256:") {
		t.Fatalf("client WorkspaceID = %q, want the server's %q", got, want)
	}
	other, err := GenerateKey(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	if WorkspaceID(other.PublicKey()) == want {
		t.Fatal("two host keys give one WorkspaceID")
	}
}
