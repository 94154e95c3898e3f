package appliance

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/vmm"
)

// TestSandboxCheckpoints: a checkpoint brings back the files of the
// moment it was taken, outside the workspace; restoring restarts every
// process, and the sandbox runs afterwards.
func TestSandboxCheckpoints(t *testing.T) {
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "cp", Session: "s1", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	run(t, c, "cp", "echo v1 > /home/agent/state")
	start := time.Now()
	cp, err := c.Checkpoint(ctx, "cp", "one")
	if err != nil || cp.Name != "one" || cp.Size <= 0 || time.Since(cp.Taken) > time.Minute {
		t.Fatalf("Checkpoint(one) = %+v, %v", cp, err)
	}
	t.Logf("checkpoint of a small layer: %v through the API, %d bytes", time.Since(start), cp.Size)
	gen, err := c.Checkpoint(ctx, "cp", "")
	if err != nil || !strings.HasPrefix(gen.Name, "cp-") {
		t.Fatalf("Checkpoint with no name = %+v, %v; want a generated cp-... name", gen, err)
	}

	// Change files, start a job and a long exec: a restore ends them.
	var out bytes.Buffer
	if _, err := c.Exec(ctx, "cp", ExecRequest{Argv: []string{"sh", "-c", "echo v2 > /home/agent/state; echo new > /tmp/new; rm /etc/group"}, User: "root"}, &out, &out); err != nil {
		t.Fatalf("change files: %v %s", err, out.String())
	}
	if _, err := c.StartJob(ctx, "cp", JobRequest{Argv: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	type ended struct {
		st  ExitStatus
		err error
	}
	execDone := make(chan ended, 1)
	go func() {
		st, err := c.Exec(ctx, "cp", ExecRequest{Argv: []string{"sleep", "100"}}, nil, nil)
		execDone <- ended{st, err}
	}()
	time.Sleep(200 * time.Millisecond)
	start = time.Now()
	sb, err := c.RestoreCheckpoint(ctx, "cp", "one")
	if err != nil || sb.Status != "running" {
		t.Fatalf("RestoreCheckpoint(one) = %+v, %v", sb, err)
	}
	t.Logf("restore: %v", time.Since(start))
	select {
	case e := <-execDone:
		if e.err == nil && e.st.Code == 0 {
			t.Errorf("an exec running during the restore ended well: %+v", e.st)
		}
		t.Logf("an exec running during the restore ended with %+v, %v", e.st, e.err)
	case <-time.After(10 * time.Second):
		t.Errorf("an exec running during the restore did not end")
	}
	if got, _ := run(t, c, "cp", "cat /home/agent/state; ls /tmp; cat /etc/group"); got != "v1\nroot:x:0:\nagent:x:1000:\n" {
		t.Errorf("after the restore: %q, want v1, no /tmp/new, /etc/group back", got)
	}
	if jobs, err := c.Jobs(ctx, "cp"); err != nil || len(jobs) != 0 {
		t.Errorf("jobs after the restore = %+v, %v; want none (the agent restarted)", jobs, err)
	}
	if got, st := run(t, c, "cp", "echo still > /workspace/agents/s1/outputs/w && cat /workspace/agents/s1/outputs/w"); got != "still\n" || st.Code != 0 {
		t.Errorf("the workspace after the restore: %q, %+v", got, st)
	}

	// A paused sandbox can be checkpointed and stays paused; restored, it runs.
	if _, err := c.PauseSandbox(ctx, "cp"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Checkpoint(ctx, "cp", "paused"); err != nil {
		t.Errorf("Checkpoint of a paused sandbox: %v", err)
	}
	if sb, _ := c.Sandbox(ctx, "cp"); sb.Status != "paused" {
		t.Errorf("after a checkpoint of a paused sandbox: %s, want paused", sb.Status)
	}
	if sb, err := c.RestoreCheckpoint(ctx, "cp", "paused"); err != nil || sb.Status != "running" {
		t.Errorf("RestoreCheckpoint of a paused sandbox = %s, %v; want running", sb.Status, err)
	}
	if got, _ := run(t, c, "cp", "cat /home/agent/state"); got != "v1\n" {
		t.Errorf("after restoring paused: %q", got)
	}

	// The jail dates a checkpoint by its layer's last change, not by
	// when it was taken, so only the names are checked.
	list, err := c.Checkpoints(ctx, "cp")
	var names []string
	for _, cp := range list {
		names = append(names, cp.Name)
	}
	slices.Sort(names)
	if want := []string{gen.Name, "one", "paused"}; err != nil || !slices.Equal(names, want) {
		t.Errorf("Checkpoints = %v, %v; want %v", names, err, want)
	}
	if err := c.DeleteCheckpoint(ctx, "cp", "one"); err != nil {
		t.Errorf("DeleteCheckpoint(one) = %v", err)
	}
	if list, _ := c.Checkpoints(ctx, "cp"); len(list) != 2 {
		t.Errorf("after a delete: %+v", list)
	}

	runErrorCases(t, []errorCase{
		{"duplicate", func() error { _, err := c.Checkpoint(ctx, "cp", "paused"); return err }, "conflict", 409, "checkpoint-rm cp paused"},
		{"bad name", func() error { _, err := c.Checkpoint(ctx, "cp", "Bad_Name"); return err }, "bad_request", 400, "lowercase"},
		{"bad name on restore", func() error { _, err := c.RestoreCheckpoint(ctx, "cp", "x.y"); return err }, "bad_request", 400, ""},
		{"restore unknown", func() error { _, err := c.RestoreCheckpoint(ctx, "cp", "one"); return err }, "not_found", 404, "hearth sandboxes checkpoints cp"},
		{"delete unknown", func() error { return c.DeleteCheckpoint(ctx, "cp", "one") }, "not_found", 404, ""},
		{"unknown sandbox", func() error { _, err := c.Checkpoint(ctx, "nope", "x"); return err }, "not_found", 404, ""},
		{"list of unknown sandbox", func() error { _, err := c.Checkpoints(ctx, "nope"); return err }, "not_found", 404, ""},
	})
}

// TestSandboxMachineOps: one machine operation at a time; during a
// restore commands wait outside; a tier without the ability says so.
func TestSandboxMachineOps(t *testing.T) {
	cfg := sandboxConfig(t)
	d, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "ops", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	_, end, err := d.sbx.beginOp("ops", opRestore)
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"exec":       func() error { _, err := c.Exec(ctx, "ops", ExecRequest{Argv: []string{"true"}}, nil, nil); return err },
		"checkpoint": func() error { _, err := c.Checkpoint(ctx, "ops", "x"); return err },
		"pause":      func() error { _, err := c.PauseSandbox(ctx, "ops"); return err },
		"destroy":    func() error { return c.DestroySandbox(ctx, "ops") },
		"job":        func() error { _, err := c.StartJob(ctx, "ops", JobRequest{Argv: []string{"true"}}); return err },
	} {
		err := call()
		wantCode(t, err, "conflict", 409)
		if !strings.Contains(err.Error(), "busy with a restore") {
			t.Errorf("%s during a restore: %v, want it to say the sandbox is busy", name, err)
		}
	}
	end()
	if out, _ := run(t, c, "ops", "echo ok"); out != "ok\n" {
		t.Errorf("exec after the operation = %q", out)
	}
	// An exec would resume a sandbox paused for being idle: not while a
	// checkpoint copies it.
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "dozy", IdleTimeout: "300ms"}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "dozy", "paused", true)
	if _, end, err = d.sbx.beginOp("dozy", opCheckpoint); err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "dozy", ExecRequest{Argv: []string{"true"}}, nil, nil)
	wantCode(t, err, "conflict", 409)
	end()
	if out, _ := run(t, c, "dozy", "echo awake"); out != "awake\n" {
		t.Errorf("exec after the checkpoint = %q", out)
	}

	// The same machine with its optional abilities hidden.
	s, _ := d.sbx.get("ops")
	s.mu.Lock()
	real := s.m
	s.m = struct{ vmm.Machine }{real}
	s.mu.Unlock()
	defer func() { s.mu.Lock(); s.m = real; s.mu.Unlock() }()
	_, err = c.Checkpoint(ctx, "ops", "x")
	wantCode(t, err, "unsupported", 501)
	if !strings.Contains(err.Error(), "jail tier") {
		t.Errorf("checkpoint on a machine that cannot: %v, want it to name the tier", err)
	}
	_, err = c.SaveSandbox(ctx, "ops", "ops-image", nil)
	wantCode(t, err, "unsupported", 501)
	if sb, err := c.Sandbox(ctx, "ops"); err != nil || sb.Usage != nil {
		t.Errorf("Sandbox = %+v, %v; want no usage from a machine that cannot report it", sb.Usage, err)
	}
}

// TestSandboxSave: a sandbox saved as an image boots new sandboxes that
// see what it changed, owned as it was; saving again makes a version
// that new sandboxes get.
func TestSandboxSave(t *testing.T) {
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "src", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	setup := "echo configured > /etc/motd && rm /bin/vi && mkdir -p /opt/tool && echo v1 > /opt/tool/version"
	if st, err := c.Exec(ctx, "src", ExecRequest{Argv: []string{"sh", "-c", setup}, User: "root"}, &out, &out); err != nil || st.Code != 0 {
		t.Fatalf("setup: %+v, %v: %s", st, err, out.String())
	}
	run(t, c, "src", "echo mine > /home/agent/notes")
	var progress bytes.Buffer
	start := time.Now()
	img, err := c.SaveSandbox(ctx, "src", "configured", &progress)
	if err != nil {
		t.Fatalf("SaveSandbox = %v; progress:\n%s", err, progress.String())
	}
	t.Logf("save of the tiny image with a small change: %v; progress:\n%s", time.Since(start), progress.String())
	if img.Name != "configured" || img.Parent != "tiny" || img.SavedFrom != "sandbox src" || !img.Current || img.User != "agent" || img.Size == 0 {
		t.Errorf("saved image %+v", img)
	}
	if !strings.Contains(progress.String(), "saving sandbox src") || !strings.Contains(progress.String(), "copy the root of sandbox src") {
		t.Errorf("progress %q, want the save's steps", progress.String())
	}
	if sb, err := c.Sandbox(ctx, "src"); err != nil || sb.Status != "running" {
		t.Errorf("the saved sandbox: %+v, %v; want it running", sb, err)
	}

	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "dst", Image: "configured", IdleTimeout: "0"}); err != nil {
		t.Fatalf("create from the saved image: %v", err)
	}
	got, _ := run(t, c, "dst", "cat /etc/motd /opt/tool/version /home/agent/notes; stat -c %u /home/agent/notes; id -un; test -e /bin/vi || echo no-vi")
	if got != "configured\nv1\nmine\n1000\nagent\nno-vi\n" {
		t.Errorf("in a sandbox of the saved image: %q", got)
	}
	m, err := c.InspectImage(ctx, "configured")
	if err != nil || m.Parent != "tiny" || m.SavedFrom != "sandbox src" || m.User.Name != "agent" || m.Env["LANG"] != "C.UTF-8" {
		t.Errorf("InspectImage(configured) = %+v, %v", m, err)
	}

	// A second save is a new version, which new sandboxes get.
	if st, err := c.Exec(ctx, "dst", ExecRequest{Argv: []string{"sh", "-c", "echo v2 > /opt/tool/version"}, User: "root"}, nil, nil); err != nil || st.Code != 0 {
		t.Fatalf("change the saved sandbox: %+v, %v", st, err)
	}
	if _, err := c.SaveSandbox(ctx, "dst", "configured", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "dst2", Image: "configured", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := run(t, c, "dst2", "cat /opt/tool/version /etc/motd"); got != "v2\nconfigured\n" {
		t.Errorf("a sandbox of the second save sees %q", got)
	}
	list, _ := c.Images(ctx)
	var versions, current int
	for _, img := range list.Images {
		if img.Name == "configured" {
			versions++
			if img.Current {
				current++
			}
		}
	}
	if versions != 2 || current != 1 {
		t.Errorf("images named configured: %d, %d current; want 2 versions, the newest current", versions, current)
	}

	runErrorCases(t, []errorCase{
		{"recipe name", func() error { _, err := c.SaveSandbox(ctx, "src", "base", nil); return err }, "conflict", 409, "recipe"},
		{"bad name", func() error { _, err := c.SaveSandbox(ctx, "src", "Bad Name", nil); return err }, "bad_request", 400, "image name"},
		{"unknown sandbox", func() error { _, err := c.SaveSandbox(ctx, "nope", "x", nil); return err }, "not_found", 404, ""},
		{"remove while in use", func() error { return c.RemoveImage(ctx, "configured") }, "conflict", 409, "dst"},
	})
}

// TestSandboxUsage: a sandbox reports what its machine uses, in get and
// in list; disk is known only for a layer with a limit.
func TestSandboxUsage(t *testing.T) {
	cfg := sandboxConfig(t)
	cfg.Sandbox.Disk = 0 // "free" has no disk limit
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "limited", Memory: 256 << 20, Disk: 64 << 20, IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "free", IdleTimeout: "0"}); err != nil {
		t.Fatal(err)
	}
	run(t, c, "limited", "dd if=/dev/zero of=/home/agent/blob bs=1M count=8 2>/dev/null; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
	sb, err := c.Sandbox(ctx, "limited")
	if err != nil || sb.Usage == nil {
		t.Fatalf("Sandbox(limited) = %+v, %v; want usage", sb, err)
	}
	u := *sb.Usage
	cpu, err := time.ParseDuration(u.CpuTime)
	if err != nil || cpu <= 0 || u.Memory <= 0 || u.MemoryLimit != 256<<20 || u.Processes < 1 ||
		u.Disk < 8<<20 || u.DiskLimit <= 32<<20 || u.DiskLimit > 64<<20 {
		t.Errorf("usage of limited = %+v (cpu %v, %v); want cpu > 0, memory under a 256 MiB limit, 8 MiB+ of a 64 MiB disk", u, cpu, err)
	}
	list, err := c.Sandboxes(ctx)
	if err != nil || len(list) != 2 || list[1].Usage == nil {
		t.Fatalf("Sandboxes = %+v, %v", list, err)
	}
	if u := list[1].Usage; u.Disk != -1 || u.DiskLimit != 0 || u.Memory <= 0 {
		t.Errorf("usage of free = %+v, want disk -1 (unknown) and no disk limit", u)
	}
}
