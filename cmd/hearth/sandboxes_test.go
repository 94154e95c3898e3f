package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"hearth/appliance"
	"hearth/appliance/appliancetest"
	"hearth/client"
)

// sandboxDaemon starts a real daemon that runs sandboxes of the tiny test
// image, and returns the --config flag for the CLI. extra is appended to
// its config file.
func sandboxDaemon(t *testing.T, extra ...string) (configFlag string, cfg appliance.Config) {
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
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[sandbox]\nagent = %q\ntier = \"jail\"\ndefault_image = \"tiny\"\nmemory = \"512M\"\nmax_upload = \"1MiB\"\n",
		cfg.StateDir, cfg.Workspace.Mount, cfg.Sandbox.Agent) + strings.Join(extra, "")
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := appliance.LoadConfig(config)
	if err != nil || cfg.Sandbox.MaxUpload != 1<<20 || cfg.Sandbox.Memory != 512<<20 || cfg.Sandbox.DefaultImage != "tiny" {
		t.Fatalf("LoadConfig = %+v, %v", cfg.Sandbox, err)
	}
	d, err := appliance.Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		c := client.New(cfg.SocketPath())
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
	args             []string
	stdin            string
	wantCode         int
	wantOut, wantErr string
	exactOut         bool
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
		{args: []string{"sandboxes", "create", "--session", "s1", "--env", "FOO=bar", "--idle-timeout", "0", "--workspace-files", "50", "--workspace-bytes", "2M", "box1", c}, wantOut: "box1\n", exactOut: true},
		{args: []string{"workspace", "ls", c}, wantOut: "50 (8%)     0 B   2.0 MiB (0%)"},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "sh", "-c", "dd if=/dev/zero of=/workspace/agents/s1/outputs/big bs=64k count=48"}, wantCode: 1, wantErr: "quota"},
		{args: []string{"sandboxes", "exec", "box1", c, "--", "rm", "/workspace/agents/s1/outputs/big"}},
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
	var list []client.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || !strings.HasPrefix(list[0].Id, "sbx-") || list[0].Memory != 512<<20 {
		t.Fatalf("sandboxes ls --json = %d %q, want the one sandbox left, with the config's memory", code, out)
	}
	if u := list[0].Usage; u == nil || u.Memory <= 0 || u.MemoryLimit != 512<<20 || u.Disk < 0 || u.DiskLimit <= 9<<30 || u.DiskLimit > appliance.DefaultDisk {
		t.Errorf("sandboxes ls --json: usage %+v, want memory used of 512 MiB and disk used of the default 10 GiB", u)
	}
	out, _, _ = hearthIn(t, "", "sandboxes", "ls", c)
	for _, col := range []string{"ID", "IMAGE", "SESSION", "STATUS", "CPUS", "CPU-TIME", "MEM", "DISK", "CREATED", "tiny", "running", "/512 MiB"} {
		if !strings.Contains(out, col) {
			t.Errorf("sandboxes ls = %q, want %q in it", out, col)
		}
	}
}

// TestSandboxMachineCommands: checkpoint, restore and save through the
// CLI; a saved image boots a sandbox that sees the change.
func TestSandboxMachineCommands(t *testing.T) {
	c, _ := sandboxDaemon(t)
	sh := func(id, script string) []string {
		return []string{"sandboxes", "exec", id, c, "--", "sh", "-c", script}
	}
	runSteps(t, []step{
		{args: []string{"sandboxes", "create", "--idle-timeout", "0", "--disk", "64M", "box", c}, wantOut: "box\n", exactOut: true},
		{args: sh("box", "echo before > /home/agent/state")},
		{args: []string{"sandboxes", "checkpoints", "box", c}, wantOut: "no checkpoints of sandbox box"},
		{args: []string{"sandboxes", "checkpoint", "box", "clean", c}, wantOut: "checkpoint clean of sandbox box taken in"},
		{args: []string{"sandboxes", "checkpoint", "box", "clean", c}, wantCode: exitError, wantErr: "checkpoint-rm box clean"},
		{args: []string{"sandboxes", "checkpoint", "box", "Not_OK", c}, wantCode: exitError, wantErr: "lowercase"},
		{args: []string{"sandboxes", "checkpoint", "box", c}, wantOut: "checkpoint cp-"},
		{args: sh("box", "echo after > /home/agent/state")},
		{args: []string{"sandboxes", "checkpoints", "box", c}, wantOut: "clean"},
		{args: []string{"sandboxes", "restore", "box", "clean", c}, wantOut: "every process in it was stopped and its agent restarted"},
		{args: sh("box", "cat /home/agent/state"), wantOut: "before\n", exactOut: true},
		{args: []string{"sandboxes", "restore", "box", "nope", c}, wantCode: exitNotFound, wantErr: "hearth sandboxes checkpoints box"},
		{args: []string{"sandboxes", "checkpoint-rm", "box", "clean", c}, wantOut: "deleted checkpoint clean of sandbox box"},
		{args: []string{"sandboxes", "checkpoint-rm", "box", "clean", c}, wantCode: exitNotFound},
		{args: []string{"sandboxes", "restore", "box", c}, wantCode: exitUsage},
		{args: []string{"sandboxes", "save", "box", "tiny-saved", c}, wantOut: "saved from sandbox box", wantErr: "copy the root of sandbox box"},
		{args: []string{"sandboxes", "save", "box", "base", c}, wantCode: exitError, wantErr: "recipe"},
		{args: []string{"sandboxes", "save", "nope", "x", c}, wantCode: exitNotFound},
		{args: []string{"sandboxes", "create", "--image", "tiny-saved", "--idle-timeout", "0", "copy", c}, wantOut: "copy\n", exactOut: true},
		{args: sh("copy", "cat /home/agent/state"), wantOut: "before\n", exactOut: true},
		{args: []string{"images", "ls", c}, wantOut: "tiny-saved"},
	})
	// With a disk limit the layer's use is known: MEM and DISK are used/limit
	// (CREATED is "now" or, on a loaded machine, a few seconds ago).
	out, _, _ := hearthIn(t, "", "sandboxes", "ls", c)
	if !regexp.MustCompile(`\n(box|copy) .* [0-9.]+ [KM]iB/512 MiB +[0-9.]+ [KM]iB/[0-9]+ MiB +(now|[0-9]+ seconds? ago)\n`).MatchString(out) {
		t.Errorf("sandboxes ls = %q, want box's memory and disk as used/limit", out)
	}
	out, _, code := hearthIn(t, "", "sandboxes", "checkpoints", "box", "--json", c)
	var cps []client.Checkpoint
	if code != 0 || json.Unmarshal([]byte(out), &cps) != nil || len(cps) != 1 || !strings.HasPrefix(cps[0].Name, "cp-") {
		t.Errorf("sandboxes checkpoints --json = %d %q, want the one generated checkpoint", code, out)
	}
}

// TestSandboxJobCommands: a job started by one CLI call runs on after
// it; later calls list it, read its output and stop it.
func TestSandboxJobCommands(t *testing.T) {
	c, _ := sandboxDaemon(t)
	runSteps(t, []step{
		{args: []string{"sandboxes", "create", "--idle-timeout", "0", "jobs", c}, wantOut: "jobs\n", exactOut: true},
		{args: []string{"sandboxes", "job", "ls", "jobs", c}, wantOut: "no jobs in sandbox jobs"},
		{args: []string{"sandboxes", "job", "start", "jobs", "--env", "A=1", c, "--", "sh", "-c", "echo hello $A; echo oops >&2"},
			wantOut: "job-1\n", exactOut: true, wantErr: "hearth sandboxes job logs jobs job-1"},
		{args: []string{"sandboxes", "job", "--config", strings.TrimPrefix(c, "--config="), "start", "jobs", "--", "sleep", "100"}, wantOut: "job-2\n", exactOut: true},
		{args: []string{"sandboxes", "job", "start", "jobs", c, "--", "/no/such/cmd"}, wantCode: exitError, wantErr: "/no/such/cmd"},
		{args: []string{"sandboxes", "job", "start", "jobs", c}, wantCode: exitUsage, wantErr: "name the command"},
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _, _ := hearthIn(t, "", "sandboxes", "job", "ls", "jobs", c)
		if strings.Contains(out, "completed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job ls = %q, want job-1 completed", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	runSteps(t, []step{
		{args: []string{"sandboxes", "job", "logs", "jobs", "job-1", c}, wantOut: "hello 1\n", exactOut: true},
		{args: []string{"sandboxes", "job", "logs", "jobs", "job-1", "--stderr", c}, wantOut: "oops\n", exactOut: true},
		{args: []string{"sandboxes", "job", "ls", "jobs", c}, wantOut: "sleep 100"},
		{args: []string{"sandboxes", "job", "stop", "jobs", "job-2", "--grace", "1s", c}, wantOut: "stopped job job-2 in sandbox jobs (terminated)"},
		{args: []string{"sandboxes", "job", "stop", "jobs", "job-1", c}, wantOut: "had already ended: completed (exit 0)"},
		{args: []string{"sandboxes", "job", "logs", "jobs", "job-9", c}, wantCode: exitNotFound, wantErr: "hearth sandboxes job ls jobs"},
		{args: []string{"sandboxes", "job", "frobnicate", c}, wantCode: exitUsage},
	})
	out, _, code := hearthIn(t, "", "sandboxes", "job", "ls", "jobs", "--json", c)
	var jobs []client.Job
	if code != 0 || json.Unmarshal([]byte(out), &jobs) != nil || len(jobs) != 3 || jobs[1].State != "cancelled" {
		t.Errorf("job ls --json = %d %q, want 3 jobs, job-2 cancelled", code, out)
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
	var list client.ImageList
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
