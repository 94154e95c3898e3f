package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/appliance"
	"hearth/appliance/appliancetest"
)

// sandboxDaemon starts a real daemon that runs sandboxes of the tiny test
// image, and returns the --config flag for the CLI.
func sandboxDaemon(t *testing.T) (configFlag string, cfg appliance.Config) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root (namespaces, mounts, cgroups, FUSE)")
	}
	dir := t.TempDir()
	cfg = appliance.DefaultConfig()
	cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	cfg.Sandbox.Agent = appliancetest.Agent(t)
	os.MkdirAll(cfg.StateDir, 0o700)
	appliancetest.AddTinyImage(t, filepath.Join(cfg.StateDir, "images"))
	config := filepath.Join(dir, "hearth.toml")
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[sandbox]\nagent = %q\ndefault_image = \"tiny\"\nmemory = \"512M\"\nmax_upload = \"1MiB\"\n",
		cfg.StateDir, cfg.Workspace.Mount, cfg.Sandbox.Agent)
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := appliance.LoadConfig(config)
	if err != nil || cfg.Sandbox.MaxUpload != 1<<20 || cfg.Sandbox.Memory != 512<<20 || cfg.Sandbox.DefaultImage != "tiny" {
		t.Fatalf("LoadConfig = %+v, %v", cfg.Sandbox, err)
	}
	d, err := appliance.Start(cfg, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		c := appliance.NewClient(cfg.SocketPath())
		list, _ := c.Sandboxes(context.Background())
		for _, s := range list {
			c.DestroySandbox(context.Background(), s.Id)
		}
		d.Close()
	})
	return "--config=" + config, cfg
}

// hearthIn runs the CLI with stdin.
func hearthIn(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

type step struct {
	args              []string
	stdin             string
	wantCode          int
	wantOut, wantErr  string
	exactOut, noStdin bool
}

func runSteps(t *testing.T, steps []step) {
	t.Helper()
	for _, st := range steps {
		out, errOut, code := hearthIn(t, st.stdin, st.args...)
		okOut := strings.Contains(out, st.wantOut)
		if st.exactOut {
			okOut = out == st.wantOut
		}
		if code != st.wantCode || !okOut || !strings.Contains(errOut, st.wantErr) {
			t.Fatalf("hearth %s = %d, stdout %q, stderr %q; want %d, stdout %q, stderr containing %q",
				strings.Join(st.args, " "), code, out, errOut, st.wantCode, st.wantOut, st.wantErr)
		}
	}
}

func TestSandboxCommands(t *testing.T) {
	c, cfg := sandboxDaemon(t)
	local := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(local, []byte("local notes\n"), 0o640)
	back := filepath.Join(t.TempDir(), "back.txt")
	big := filepath.Join(t.TempDir(), "big.bin")
	os.WriteFile(big, make([]byte, 2<<20), 0o644)
	runSteps(t, []step{
		{args: []string{"sandboxes", "ls", c}, wantOut: "no sandboxes"},
		{args: []string{"sandboxes", "create", "--session", "s1", "--env", "FOO=bar", "--idle-timeout", "0", "box1", c}, wantOut: "box1\n", exactOut: true},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "sh", "-c", "echo out; echo err >&2; exit 3"}, wantCode: 3, wantOut: "out\n", exactOut: true, wantErr: "err\n"},
		{args: []string{"sandboxes", "exec", c, "box1", "--env", "A=1", "--cwd", "/tmp", "sh", "-c", "echo $A $FOO; pwd"}, wantOut: "1 bar\n/tmp\n", exactOut: true},
		{args: []string{"sandboxes", "exec", "box1", "--user", "root", c, "--", "id", "-u"}, wantOut: "0\n", exactOut: true},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "tr", "a-z", "A-Z"}, stdin: "shout", wantOut: "SHOUT", exactOut: true},
		{args: []string{"sandboxes", "exec", "box1", "-n", c, "--", "cat"}, stdin: "ignored", wantOut: "", exactOut: true},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "sh", "-c", "kill -9 $$"}, wantCode: 137},
		{args: []string{"sandboxes", "exec", "box1", "--timeout", "100ms", c, "--", "sleep", "5"}, wantCode: 137, wantErr: "timed out"},
		{args: []string{"sandboxes", "exec", "box1", c}, wantCode: exitUsage, wantErr: "name the command"},
		{args: []string{"sandboxes", "cp", local, "box1:/tmp/", c}, wantErr: "copied 12 B to box1:/tmp/notes.txt"},
		{args: []string{"sandboxes", "cp", "box1:/tmp/notes.txt", back, c}},
		{args: []string{"sandboxes", "cp", "-", "box1:/workspace/agents/s1/inputs/in.txt", c}, stdin: "piped"},
		{args: []string{"sandboxes", "cp", "box1:/workspace/agents/s1/inputs/in.txt", "-", c}, wantOut: "piped", exactOut: true},
		{args: []string{"sandboxes", "cp", big, "box1:/tmp/big", c}, wantCode: exitError, wantErr: "max_upload"},
		{args: []string{"sandboxes", "cp", "box1:/tmp/nope", back, c}, wantCode: exitNotFound},
		{args: []string{"sandboxes", "cp", local, back, c}, wantCode: exitUsage},
		{args: []string{"sandboxes", "create", c}, wantOut: "sbx-"},
		{args: []string{"sandboxes", "create", "--memory", "lots", c}, wantCode: exitUsage, wantErr: "not a size"},
		{args: []string{"sandboxes", "create", "--image", "node", c}, wantCode: exitNotFound, wantErr: "hearth images build node"},
		{args: []string{"sandboxes", "ls", c}, wantOut: "box1"},
		{args: []string{"sandboxes", "pause", "box1", c}, wantOut: "paused sandbox box1"},
		{args: []string{"sandboxes", "ls", c}, wantOut: "paused"},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "true"}, wantCode: exitError, wantErr: "hearth sandboxes resume box1"},
		{args: []string{"sandboxes", "resume", "box1", c}, wantOut: "resumed sandbox box1"},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "cat", "/workspace/agents/s1/inputs/in.txt"}, wantOut: "piped", exactOut: true},
		{args: []string{"sandboxes", "destroy", "box1", c}, wantOut: "destroyed sandbox box1"},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "true"}, wantCode: exitNotFound, wantErr: "hearth sandboxes ls"},
		{args: []string{"sandboxes", "pause", "Bad/Id", c}, wantCode: exitError},
		{args: []string{"sandboxes", "frobnicate", c}, wantCode: exitUsage},
	})
	if got, err := os.ReadFile(back); err != nil || string(got) != "local notes\n" {
		t.Errorf("round trip through the sandbox: %q, %v", got, err)
	}
	if fi, err := os.Stat(back); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("downloaded file mode = %v, %v; want 0640 as uploaded", fi.Mode(), err)
	}
	if got, _ := os.ReadFile(filepath.Join(cfg.Workspace.Mount, "s1", "inputs", "in.txt")); string(got) != "piped" {
		t.Errorf("host view of the session = %q", got)
	}
	out, _, code := hearthIn(t, "", "sandboxes", "ls", "--json", c)
	var list []appliance.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || !strings.HasPrefix(list[0].Id, "sbx-") || list[0].Memory != 512<<20 {
		t.Fatalf("sandboxes ls --json = %d %q, want the one sandbox left, with the config's memory", code, out)
	}
	out, _, _ = hearthIn(t, "", "sandboxes", "ls", c)
	for _, col := range []string{"ID", "IMAGE", "SESSION", "STATUS", "CPUS", "MEMORY", "CREATED", "tiny", "running", "512 MiB"} {
		if !strings.Contains(out, col) {
			t.Errorf("sandboxes ls = %q, want %q in it", out, col)
		}
	}
}

func TestImageCommands(t *testing.T) {
	c, _ := sandboxDaemon(t)
	runSteps(t, []step{
		{args: []string{"images", "ls", c}, wantOut: "tiny"},
		{args: []string{"images", "inspect", "tiny", c}, wantOut: "agent (uid 1000"},
		{args: []string{"images", "inspect", "node", c}, wantCode: exitNotFound, wantErr: "hearth images build node"},
		{args: []string{"images", "build", "nosuch", c}, wantCode: exitNotFound, wantErr: "recipes are"},
		{args: []string{"sandboxes", "create", "user", c}, wantOut: "user"},
		{args: []string{"images", "rm", "tiny", c}, wantCode: exitError, wantErr: "used by sandbox user"},
		{args: []string{"sandboxes", "destroy", "user", c}},
		{args: []string{"images", "rm", "tiny", c}, wantOut: "removed image tiny"},
		{args: []string{"images", "ls", c}, wantOut: "no images built yet: build one with 'hearth images build base'"},
		{args: []string{"images", c}, wantCode: exitUsage},
	})
	out, _, code := hearthIn(t, "", "images", "ls", "--json", c)
	var list appliance.ImageList
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Recipes) == 0 {
		t.Fatalf("images ls --json = %d %q", code, out)
	}
}

func TestSandboxesDaemonDown(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "hearth.toml")
	os.WriteFile(config, []byte("state_dir = \""+dir+"/state\"\n[workspace]\nmount = \""+dir+"/agents\"\n"), 0o644)
	for _, args := range [][]string{{"sandboxes", "ls"}, {"images", "ls"}, {"sandboxes", "exec", "x", "--", "true"}} {
		_, errOut, code := hearthIn(t, "", append(args, "--config", config)...)
		if code != exitDown || !strings.Contains(errOut, "hearth up") {
			t.Errorf("hearth %s with no daemon = %d %q, want %d and a hint to run hearth up", strings.Join(args, " "), code, errOut, exitDown)
		}
	}
}
