package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/appliance"
	"hearth/fs"
)

// daemon starts a real daemon on temporary directories and returns the
// config file the CLI should use.
func daemon(t *testing.T) (config string, cfg appliance.Config) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	dir := t.TempDir()
	cfg = appliance.Config{StateDir: filepath.Join(dir, "state"), Workspace: appliance.WorkspaceConfig{Mount: filepath.Join(dir, "agents")}}
	config = filepath.Join(dir, "hearth.toml")
	body := "state_dir = \"" + cfg.StateDir + "\"\n[workspace]\nmount = \"" + cfg.Workspace.Mount + "\"\n"
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(cfg.StateDir, 0o700)
	d, err := appliance.Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return config, cfg
}

func hearth(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func TestWorkspaceCommands(t *testing.T) {
	config, cfg := daemon(t)
	c := "--config=" + config
	steps := []struct {
		args     []string
		wantCode int
		wantOut  string
	}{
		{[]string{"workspace", "ls", c}, 0, "no sessions yet"},
		{[]string{"workspace", "create", "session-a1", c}, 0, "created session session-a1"},
		{[]string{"workspace", "snapshot", "session-a1", "v1", c}, 0, "snapshot v1 of session session-a1 taken in"},
		{[]string{"workspace", "snapshots", "session-a1", c}, 0, "v1"},
		{[]string{"workspace", "branch", "session-a1", "v1", "session-b1", c}, 0, "session session-b1 starts from snapshot v1"},
		{[]string{"workspace", "restore", "session-a1", "v1", c}, 0, "restored session session-a1 to snapshot v1"},
		{[]string{"workspace", "snapshot", "--all", "everything", c}, 0, "snapshot everything of the whole workspace"},
		{[]string{"workspace", "snapshots", "--json", c}, 0, "everything"},
		{[]string{"workspace", "snapshot-rm", "--all", "everything", c}, 0, "deleted snapshot everything of the whole workspace"},
		{[]string{"workspace", "snapshot-rm", "--all", "everything", c}, exitNotFound, ""},
		{[]string{"workspace", "snapshot-rm", "session-a1", "v1", c}, 0, "deleted snapshot v1 of session session-a1"},
		{[]string{"workspace", "snapshots", "session-a1", c}, 0, "no snapshots of session session-a1"},
		{[]string{"workspace", "snapshot-rm", "session-a1", c}, exitUsage, ""},
		{[]string{"workspace", "restore", "session-a1", "nope", c}, exitNotFound, ""},
		{[]string{"workspace", "create", "../x", c}, exitError, ""},
		{[]string{"workspace", "frobnicate", c}, exitUsage, ""},
		{[]string{"nonsense"}, exitUsage, ""},
	}
	for _, st := range steps {
		out, errOut, code := hearth(t, st.args...)
		if code != st.wantCode || !strings.Contains(out, st.wantOut) {
			t.Fatalf("hearth %s = %d, %q (stderr %q); want %d and output containing %q", strings.Join(st.args, " "), code, out, errOut, st.wantCode, st.wantOut)
		}
		if code != 0 && !strings.HasPrefix(errOut, "hearth: ") {
			t.Errorf("hearth %s: stderr %q, want an error saying what went wrong", strings.Join(st.args, " "), errOut)
		}
	}
	out, _, code := hearth(t, "workspace", "ls", "--json", c)
	var list []fs.SessionInfo
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 {
		t.Fatalf("workspace ls --json = %d %q, want two sessions as JSON", code, out)
	}
	if _, err := os.Stat(filepath.Join(cfg.Workspace.Mount, "session-b1", "outputs")); err != nil {
		t.Errorf("branched session not visible in the mount: %v", err)
	}
}

func TestDaemonDownExitCode(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "hearth.toml")
	os.WriteFile(config, []byte("state_dir = \""+dir+"/state\"\n[workspace]\nmount = \""+dir+"/agents\"\n"), 0o644)
	_, errOut, code := hearth(t, "workspace", "ls", "--config", config)
	if code != exitDown || !strings.Contains(errOut, "hearth up") {
		t.Fatalf("workspace ls with no daemon = %d %q, want %d and a hint to run hearth up", code, errOut, exitDown)
	}
}

func TestBadConfigExitCode(t *testing.T) {
	config := filepath.Join(t.TempDir(), "hearth.toml")
	os.WriteFile(config, []byte("stat_dir = \"/x\"\n"), 0o644)
	_, errOut, code := hearth(t, "workspace", "ls", "--config", config)
	if code != exitError || !strings.Contains(errOut, "unknown key stat_dir") {
		t.Fatalf("workspace ls with a bad config = %d %q, want an error naming the key", code, errOut)
	}
}
