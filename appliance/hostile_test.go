package appliance

import (
	"context"
	"errors"
	"fmt"
	"hearth/agents"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"hearth/fs"
)

// An agent replaces its outputs directory with a symbolic link to another
// session's private .home: the execution record must not list that
// session's files as its outputs.
func TestHostileOutputsSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting the host view needs root (FUSE)")
	}
	dir := t.TempDir()
	store, err := fs.Open(fs.Options{Dir: filepath.Join(dir, "ws")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	host := filepath.Join(dir, "agents")
	v, err := store.Mount(host, fs.ViewOptions{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Unmount() })
	for _, s := range []string{"victim", "attacker"} {
		if err := store.CreateSession(s, fs.Owner{UID: 1000, GID: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.WriteFile("victim", ".home/private-notes.txt", strings.NewReader("secret"), 0, fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.WriteFile("attacker", "inputs/brief.md", strings.NewReader("x"), 0, fs.Owner{}); err != nil {
		t.Fatal(err)
	}
	// The attack, as the agent would do it through its own view: the
	// target is the path the host view shows the victim's home at.
	if err := os.Remove(filepath.Join(host, "attacker", "outputs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(host, "victim", ".home"), filepath.Join(host, "attacker", "outputs")); err != nil {
		t.Fatal(err)
	}
	ws := agentWorkspace{store: store, host: host}
	for _, pattern := range []string{"outputs/*", "outputs/*.txt", "*/*"} {
		got, err := ws.Glob("attacker", pattern)
		if err != nil {
			t.Fatalf("Glob(%q): %v", pattern, err)
		}
		for _, p := range got {
			if strings.Contains(p, "private-notes") {
				t.Errorf("Glob(%q) = %q: lists the victim's private file through the attacker's symlink", pattern, got)
			}
		}
		if pattern == "*/*" && (len(got) != 1 || got[0] != "inputs/brief.md") {
			t.Errorf("Glob(%q) = %q, want [inputs/brief.md]", pattern, got)
		}
	}
}

// A state directory made 0755 before the first start (as scripts/demo.sh
// does) must not let another local user read the events database.
func TestHostileStateFileModes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	dir := openTempDir(t)
	cfg := Config{StateDir: filepath.Join(dir, "state"), Workspace: WorkspaceConfig{Mount: filepath.Join(dir, "agents")}}
	if err := os.Mkdir(cfg.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A file left readable by an older daemon.
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "api.token"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := stateModeProblems(cfg.StateDir); len(p) != 2 {
		t.Errorf("doctor before the start: %q, want the directory and api.token", p)
	}
	d, err := Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	mode := func(p string) os.FileMode {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	if m := mode(cfg.StateDir); m != 0o700 {
		t.Errorf("state dir mode %04o after start, want 0700", m)
	}
	ents, _ := os.ReadDir(cfg.StateDir)
	for _, e := range ents {
		p := filepath.Join(cfg.StateDir, e.Name())
		if fi, _ := os.Lstat(p); !fi.IsDir() && fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %04o after start, want no bits for group and others", e.Name(), fi.Mode().Perm())
		}
	}
	if m := mode(filepath.Join(cfg.StateDir, "hearth.db")); m != 0o600 {
		t.Errorf("hearth.db mode %04o, want 0600", m)
	}
	if p := stateModeProblems(cfg.StateDir); len(p) != 0 {
		t.Errorf("doctor after the start: %q", p)
	}
	if out, err := asNobody("cat", filepath.Join(cfg.StateDir, "hearth.db")); err == nil {
		t.Errorf("another user read hearth.db: %q", out)
	}
}

// asNobody runs a command as the unprivileged user nobody (65534).
func asNobody(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd.CombinedOutput()
}

// openTempDir is a temporary directory other users may enter (t.TempDir
// and its parent are 0700), so that what keeps them out is the code under
// test.
func openTempDir(t *testing.T) string {
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// An agent writes more than its session's quota: the config's defaults
// apply to every session an agent works in, its definition may change
// them, and writes past them fail with EDQUOT.
func TestHostileWorkspaceQuota(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting views needs root (FUSE)")
	}
	def := DefaultConfig().Workspace
	if def.SessionBytes <= 0 || def.SessionFiles <= 0 || DefaultConfig().Sandbox.Disk <= 0 {
		t.Errorf("default config %+v, disk %d: want a byte, a file and a disk limit", def, DefaultConfig().Sandbox.Disk)
	}
	dir := t.TempDir()
	store, err := fs.Open(fs.Options{Dir: filepath.Join(dir, "ws")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Workspace.SessionBytes, cfg.Workspace.SessionFiles = 1<<20, 20
	ws := newAgentWorkspace(cfg, store, nil)

	mount := func(session string, q agents.Quota) string {
		if err := ws.EnsureSession(session, 1000, 1000, q); err != nil {
			t.Fatalf("EnsureSession(%s) = %v", session, err)
		}
		view, unmount, err := ws.MountView(session, "m-"+session)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unmount() })
		return filepath.Join(view, session, "outputs")
	}
	out := mount("flood", agents.Quota{})
	err = os.WriteFile(filepath.Join(out, "big"), make([]byte, 2<<20), 0o644)
	if !errors.Is(err, syscall.EDQUOT) {
		t.Errorf("writing 2 MiB under a 1 MiB default quota = %v, want EDQUOT", err)
	}
	var made int
	for ; made < 100; made++ {
		if err = os.WriteFile(filepath.Join(out, fmt.Sprintf("f%d", made)), nil, 0o644); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.EDQUOT) || made >= 20 {
		t.Errorf("after %d empty files under a quota of 20: %v, want EDQUOT", made, err)
	}

	// An agent whose definition asks for more gets it.
	out = mount("roomy", agents.Quota{Bytes: 4 << 20, Files: 200})
	if err := os.WriteFile(filepath.Join(out, "big"), make([]byte, 2<<20), 0o644); err != nil {
		t.Errorf("writing 2 MiB under the definition's 4 MiB = %v", err)
	}
	for _, info := range store.Sessions() {
		if info.ID == "roomy" && (info.Quota.Bytes != 4<<20 || info.Quota.Inodes != 200) {
			t.Errorf("session roomy quota %+v, want the definition's", info.Quota)
		}
	}
}

// A sandbox's session gets the quota its create request asks for, and
// its usage reports it.
func TestHostileSandboxWorkspaceQuota(t *testing.T) {
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "q", Session: "q", WorkspaceFiles: 10, IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	out, st := run(t, c, "q", "i=0; while [ $i -lt 30 ]; do i=$((i+1)); touch /workspace/agents/q/outputs/f$i 2>&1 || { echo stopped at $i; exit 3; }; done")
	if st.Code != 3 || !strings.Contains(out, "quota") {
		t.Errorf("touching 30 files under a quota of 10: exit %d, %q; want a quota error", st.Code, out)
	}
	sb, err := c.Sandbox(ctx, "q")
	if err != nil || sb.Usage == nil {
		t.Fatalf("Sandbox(q) = %+v, %v", sb, err)
	}
	if u := sb.Usage; u.WorkspaceFilesLimit != 10 || u.WorkspaceFiles != 10 || u.WorkspaceBytesLimit != int64(cfg.Workspace.SessionBytes) {
		t.Errorf("usage %+v: want 10 of 10 files and the config's byte quota", *u)
	}
}

// A workspace from before per-machine ranges has its agents' files under
// host ids 100000 and up, which the first /etc/subuid user may own: the
// daemon moves them to the jail's range once.
func TestUpgradeMovesWorkspaceIDs(t *testing.T) {
	cfg := agentConfig(t)
	old, err := fs.Open(fs.Options{Dir: filepath.Join(cfg.StateDir, "workspace")})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.CreateSession("s", fs.Owner{UID: 101000, GID: 101000}); err != nil {
		t.Fatal(err)
	}
	old.Close()
	d, err := Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	want := d.driver.Capabilities().HostIDOffset + 1000
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(cfg.Workspace.Mount, "s", ".home"), &st); err != nil || st.Uid != want || st.Gid != want {
		t.Errorf("the old session's .home after the start: uid %d gid %d (%v), want %d", st.Uid, st.Gid, err, want)
	}
	if b, err := os.ReadFile(filepath.Join(cfg.StateDir, "workspace-ids")); err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(want-1000) {
		t.Errorf("workspace-ids = %q, %v", b, err)
	}
}
