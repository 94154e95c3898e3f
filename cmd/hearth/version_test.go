package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"hearth/client"
	"hearth/internal/version"
)

// TestVersionDaemonDown: version and --version print the CLI's own build
// and say the daemon is not running, and exit 0.
func TestVersionDaemonDown(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "hearth.toml")
	os.WriteFile(config, []byte("state_dir = \""+dir+"/state\"\n[workspace]\nmount = \""+dir+"/agents\"\n"), 0o644)
	want := "hearth " + version.Get().String() + "\ndaemon: not running\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, errOut, code := hearthIn(t, "", append(args, "--config", config)...)
		if code != exitOK || out != want || errOut != "" {
			t.Errorf("hearth %s = %d, %q, stderr %q; want 0 and %q", args[0], code, out, errOut, want)
		}
	}
	out, _, code := hearthIn(t, "", "version", "--json", "--config", config)
	var v versions
	if code != exitOK || json.Unmarshal([]byte(out), &v) != nil || v.Client != version.Get() || v.Daemon != nil {
		t.Errorf("hearth version --json = %d, %q; want the client's build and no daemon", code, out)
	}
}

// TestVersionDaemon: with a daemon running, version adds the daemon's
// build and each built image with its agent CLI.
func TestVersionDaemon(t *testing.T) {
	config, _ := sandboxDaemon(t)
	out, errOut, code := hearthIn(t, "", "version", "--json", config)
	var v versions
	if code != exitOK || json.Unmarshal([]byte(out), &v) != nil || v.Daemon == nil {
		t.Fatalf("hearth version --json = %d, %q, %q; want the daemon's versions", code, out, errOut)
	}
	self := version.Get()
	if d := v.Daemon; d.Version != self.Version || d.Commit != self.Commit || d.Go != self.Go {
		t.Errorf("daemon version = %+v, want this build's %+v (the daemon runs in this test binary)", d, self)
	}
	i := slices.IndexFunc(v.Daemon.Images, func(im client.ImageVersion) bool { return im.Name == "tiny" })
	if i < 0 || !v.Daemon.Images[i].Current || len(v.Daemon.Images[i].Clis) != 0 {
		t.Errorf("images = %+v, want tiny, current, with no agent CLI", v.Daemon.Images)
	}
	out, _, code = hearthIn(t, "", "--version", config)
	if code != exitOK || !strings.Contains(out, "daemon: hearth "+self.String()) || !strings.Contains(out, "image tiny: no agent CLI") {
		t.Errorf("hearth --version = %d, %q; want the daemon's line and tiny's", code, out)
	}
}
