package appliance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/fs"
	"hearth/fs/remote"
)

// workspaceNode is node A of a two-node test: a workspace store served
// with remote.Server on loopback, restartable on the same address.
type workspaceNode struct {
	store    *fs.Store
	srv      *remote.Server
	done     chan error
	dir      string
	addr     string
	nodeKeys string
	key      string // node B's private key
	known    string // node B's known_hosts for A
}

func newWorkspaceNode(t *testing.T) *workspaceNode {
	t.Helper()
	if _, err := exec.LookPath("sshfs"); err != nil {
		t.Skip("sshfs: not found (Debian package sshfs)")
	}
	dir := t.TempDir()
	st, err := fs.Open(fs.Options{Dir: filepath.Join(dir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	n := &workspaceNode{store: st, dir: filepath.Join(dir, "serve"), nodeKeys: filepath.Join(dir, "nodes"),
		key: filepath.Join(dir, "node-b.key"), known: filepath.Join(dir, "known_hosts")}
	if _, err := remote.GenerateKey(n.key); err != nil {
		t.Fatal(err)
	}
	pub, _ := os.ReadFile(n.key + ".pub")
	if err := os.WriteFile(n.nodeKeys, append(pub[:len(pub)-1], " node-b\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start(t, "127.0.0.1:0")
	t.Cleanup(n.stop)
	return n
}

func (n *workspaceNode) start(t *testing.T, addr string) {
	t.Helper()
	srv, err := remote.NewServer(remote.Config{Store: n.store, Dir: n.dir, NodeKeys: n.nodeKeys})
	if err != nil {
		t.Fatal(err)
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
	n.srv, n.addr, n.done = srv, ln.Addr().String(), make(chan error, 1)
	go func() { n.done <- srv.Serve(ln) }()
	if err := remote.WriteKnownHosts(n.known, n.addr, srv.HostKey()); err != nil {
		t.Fatal(err)
	}
}

func (n *workspaceNode) stop() {
	if n.srv != nil {
		n.srv.Close()
		<-n.done
		n.srv = nil
	}
}

func (n *workspaceNode) read(session, p string) (string, error) {
	b, err := n.store.ReadFile(session, "", p, 1<<20)
	return string(b), err
}

// useNode points a daemon's config at the workspace node.
func (n *workspaceNode) useNode(cfg *Config) {
	cfg.Workspace.Remote, cfg.Workspace.RemoteKey, cfg.Workspace.RemoteKnownHosts = n.addr, n.key, n.known
}

// TestRemoteWorkspaceAgents: node B runs agents in jails against the
// workspace node A holds. Its outputs land in A's store; it reads another
// session's outputs (written on A) through /workspace/agents and can
// neither write there nor see that session's .home; call snapshots and a
// rewind go through the control channel; the workspace routes on B name
// A; A restarting mid-task does not end the task.
func TestRemoteWorkspaceAgents(t *testing.T) {
	a := newWorkspaceNode(t)
	if err := a.store.CreateSession("other", fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	for p, content := range map[string]string{"outputs/shared.md": "shared by A", ".home/secret": "other's secret"} {
		if _, err := a.store.WriteFile("other", p, strings.NewReader(content), 0, fs.Owner{}); err != nil {
			t.Fatal(err)
		}
	}
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("cat /workspace/agents/other/outputs/shared.md > outputs/copy.md; "+
			"echo evil > /workspace/agents/other/outputs/evil.md; echo $? > outputs/write-status.txt; "+
			"ls -a /workspace/agents/other > outputs/other-ls.txt; cat /workspace/agents/other/.home/secret > outputs/leak.txt 2>&1; true",
			modeltest.Usage{InputTokens: 100}),
		bashTurn("echo second > outputs/second.txt", modeltest.Usage{InputTokens: 100}),
		textTurn("first-done"),
		bashTurn("echo before > outputs/before.txt; while [ ! -e inputs/go ]; do sleep 0.2; done; echo after > outputs/after.txt", modeltest.Usage{InputTokens: 100}),
		textTurn("second-done"),
	}}, a.useNode)
	ctx := context.Background()
	e := delegateWait(t, env, "read the other session")
	if e.Status != "completed" {
		t.Fatalf("execution on B = %+v", e)
	}
	sess := e.Session
	if n := countEvents(allEvents(t, env.c, e.Id), "file", "outputs/copy.md"); n == 0 {
		t.Error("no file event for outputs/copy.md in B's stream: the workspace node's events did not reach B")
	}
	if got, err := a.read(sess, "outputs/copy.md"); err != nil || got != "shared by A" {
		t.Errorf("A's store has copy.md = %q, %v; want what A wrote", got, err)
	}
	if _, err := a.read("other", "outputs/evil.md"); !errors.Is(err, fs.ErrNotFound) {
		t.Errorf("the agent on B wrote into another session: %v", err)
	}
	if got, _ := a.read(sess, "outputs/write-status.txt"); strings.TrimSpace(got) == "0" {
		t.Error("writing into another session's outputs succeeded on B")
	}
	if got, _ := a.read(sess, "outputs/other-ls.txt"); strings.Contains(got, ".home") || !strings.Contains(got, "outputs") {
		t.Errorf("B's listing of the other session = %q: want outputs, no .home", got)
	}
	if got, _ := a.read(sess, "outputs/leak.txt"); strings.Contains(got, "other's secret") {
		t.Errorf("B read the other session's .home: %q", got)
	}
	if !slicesHasPrefix(t, a, sess, e.Id+".call-") {
		t.Errorf("no call snapshot of %s in A's store", e.Id)
	}

	// B lists and downloads the outputs from A's store.
	outs, err := env.c.Outputs(ctx, e.Id)
	if err != nil || !slices.ContainsFunc(outs, func(o OutputFile) bool { return o.Path == "outputs/copy.md" }) {
		t.Errorf("Outputs on B = %+v, %v; want outputs/copy.md", outs, err)
	}
	var buf bytes.Buffer
	if _, err := env.c.DownloadOutput(ctx, e.Id, "outputs/copy.md", &buf); err != nil || buf.String() != "shared by A" {
		t.Errorf("DownloadOutput on B = %q, %v", buf.String(), err)
	}

	// A rewind on B restores A's store.
	if _, err := env.c.Rewind(ctx, sess, 1, ""); err != nil {
		t.Fatalf("Rewind on B = %v", err)
	}
	if _, err := a.read(sess, "outputs/second.txt"); !errors.Is(err, fs.ErrNotFound) {
		t.Errorf("after the rewind to call 1, A still has second.txt: %v", err)
	}
	if _, err := env.c.UndoRewind(ctx, sess); err != nil {
		t.Fatalf("UndoRewind on B = %v", err)
	}
	if got, err := a.read(sess, "outputs/second.txt"); err != nil || got != "second\n" {
		t.Errorf("after undo A has second.txt = %q, %v", got, err)
	}

	// The workspace routes on B name A.
	_, err = env.c.Snapshots(ctx, sess)
	if err == nil || !strings.Contains(err.Error(), a.addr) {
		t.Errorf("Snapshots on B = %v; want an error naming %s", err, a.addr)
	}

	// A restarts while the next task runs.
	started, err := env.c.Resume(ctx, sess, ResumeRequest{Prompt: "go on"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := a.read(sess, "outputs/before.txt"); return err == nil }, "before.txt in A's store")
	addr := a.addr
	a.stop()
	time.Sleep(time.Second)
	a.start(t, addr)
	if _, err := a.store.WriteFile(sess, "inputs/go", strings.NewReader("go"), 0, fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	if got := waitEnded(t, env, started.Id); got.Status != "completed" {
		t.Fatalf("the task across A's restart = %+v", got)
	}
	if got, err := a.read(sess, "outputs/after.txt"); err != nil || got != "after\n" {
		t.Errorf("after A's restart, A has after.txt = %q, %v", got, err)
	}
}

func slicesHasPrefix(t *testing.T, a *workspaceNode, sess, prefix string) bool {
	t.Helper()
	names, err := a.store.SnapshotNames(sess)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n.Name, prefix) {
			return true
		}
	}
	return false
}

func delegateWait(t *testing.T, env *agentEnv, prompt string) Execution {
	t.Helper()
	started, err := env.c.Delegate(context.Background(), DelegateRequest{Agent: "analyst", Prompt: prompt})
	if err != nil {
		t.Fatal(err)
	}
	e, err := env.c.Execution(context.Background(), waitEnded(t, env, started.Id).ID)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// waitFor polls cond for up to two minutes.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited two minutes for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRemoteWorkspaceConfigErrors: workspace.remote's mistakes are
// refused at the door, each saying what to do; a daemon whose workspace
// node does not answer, or answers with another host key, does not start.
func TestRemoteWorkspaceConfigErrors(t *testing.T) {
	dir := t.TempDir()
	key, known := filepath.Join(dir, "node.key"), filepath.Join(dir, "known_hosts")
	os.WriteFile(key, []byte("x"), 0o600)
	os.WriteFile(known, []byte("x"), 0o600)
	base := DefaultConfig()
	base.StateDir, base.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	for _, c := range []struct {
		name string
		edit func(*WorkspaceConfig)
		want string
	}{
		{"no port", func(w *WorkspaceConfig) { w.Remote = "10.0.0.1" }, "want host:port"},
		{"no key", func(w *WorkspaceConfig) { w.Remote, w.RemoteKnownHosts = "10.0.0.1:7722", known }, "workspace.remote_key"},
		{"relative known hosts", func(w *WorkspaceConfig) { w.Remote, w.RemoteKey, w.RemoteKnownHosts = "10.0.0.1:7722", key, "known" }, "absolute path"},
		{"missing key file", func(w *WorkspaceConfig) {
			w.Remote, w.RemoteKey, w.RemoteKnownHosts = "10.0.0.1:7722", filepath.Join(dir, "nokey"), known
		}, "no such file"},
		{"both listen and remote", func(w *WorkspaceConfig) {
			w.Remote, w.RemoteKey, w.RemoteKnownHosts, w.Listen, w.NodeKeys = "10.0.0.1:7722", key, known, ":7722", key
		}, "remove one"},
		{"keys without remote", func(w *WorkspaceConfig) { w.RemoteKey = key }, "need workspace.remote"},
	} {
		cfg := base
		c.edit(&cfg.Workspace)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want %q", c.name, err, c.want)
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	a := newWorkspaceNode(t)
	other := filepath.Join(dir, "other_known_hosts")
	otherKey, err := remote.GenerateKey(filepath.Join(dir, "impostor.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteKnownHosts(other, a.addr, otherKey.PublicKey()); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*Config){
		"wrong host key": func(cfg *Config) { a.useNode(cfg); cfg.Workspace.RemoteKnownHosts = other },
		"nobody there":   func(cfg *Config) { a.useNode(cfg); cfg.Workspace.Remote = "127.0.0.1:9" },
	} {
		cfg := base
		cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, name, "state"), filepath.Join(dir, name, "agents")
		edit(&cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		d, err := Start(ctx, cfg, nil)
		cancel()
		if err == nil {
			d.Close()
			t.Errorf("%s: the daemon started", name)
			continue
		}
		if !strings.Contains(err.Error(), "workspace.remote") || !strings.Contains(err.Error(), "node_keys") {
			t.Errorf("%s: Start = %v; want it to name workspace.remote and what to check", name, err)
		}
	}
}

// TestRemoteWorkspaceFileEvents: FileEvents on a node whose workspace is
// remote returns once the workspace node follows the store, so a write
// made the moment it returns is reported (a wait for changes that starts
// then misses nothing); with the workspace node gone it fails, saying so,
// instead of reporting nothing.
func TestRemoteWorkspaceFileEvents(t *testing.T) {
	a := newWorkspaceNode(t)
	if err := a.store.CreateSession("s", fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := remote.Dial(ctx, remote.ClientConfig{Addr: a.addr, KeyFile: a.key, KnownHosts: a.known})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := newRemoteWorkspace(Config{StateDir: t.TempDir()}, c, nil)
	for i := range 20 {
		events, stop, err := w.FileEvents("s")
		if err != nil {
			t.Fatal(err)
		}
		p := fmt.Sprintf("outputs/f%d", i)
		if _, err := a.store.WriteFile("s", p, strings.NewReader("x"), 0, fs.Owner{}); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-events:
			if ev.Path != p {
				t.Fatalf("round %d: first event %+v, want one for %s", i, ev, p)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no event for %s, written as FileEvents returned", i, p)
		}
		stop()
	}
	a.stop()
	if _, _, err := w.FileEvents("s"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "workspace node") {
		t.Errorf("FileEvents with the workspace node gone = %v; want ErrUnavailable naming the workspace node", err)
	}
}
