package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/appliance"
	"hearth/appliance/appliancetest"
	"hearth/client"
)

// These tests drive sandboxes through the MCP sandbox tools, as an agent
// loop outside Hearth would, with the SDK's client over streamable HTTP
// on the daemon's socket: a real daemon, jail machines booted from the
// base image (Debian with Python 3).

// startSandboxDaemon starts a daemon whose sandboxes boot the base image.
func startSandboxDaemon(t testing.TB, edit ...func(*appliance.Config)) *appliance.Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root (namespaces, mounts, cgroups, FUSE)")
	}
	dir := t.TempDir()
	cfg := appliance.DefaultConfig()
	cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	cfg.Sandbox.Agent = appliancetest.Agent(t)
	cfg.Sandbox.Tier = appliance.TierJail
	cfg.Sandbox.DefaultImage = "base"
	appliancetest.LinkImages(t, cfg.StateDir, appliancetest.Images(t, "base"))
	for _, e := range edit {
		e(&cfg)
	}
	var logger *slog.Logger
	if tt, ok := t.(*testing.T); ok {
		logger = slog.New(slog.NewTextHandler(testWriter{tt}, nil))
	} else {
		logger = slog.New(slog.DiscardHandler)
	}
	d, err := appliance.Start(context.Background(), cfg, logger)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		c := client.New(d.Socket())
		list, _ := c.Sandboxes(context.Background())
		for _, s := range list {
			c.DestroySandbox(context.Background(), s.Id)
		}
		d.Close()
	})
	return d
}

// connectAs connects to the daemon's /mcp as client name; progress
// notifications go to onProgress.
func connectAs(t *testing.T, d *appliance.Daemon, name string, onProgress func(*mcpsdk.ProgressNotificationParams)) *mcpsdk.ClientSession {
	t.Helper()
	var opts *mcpsdk.ClientOptions
	if onProgress != nil {
		opts = &mcpsdk.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcpsdk.ProgressNotificationClientRequest) {
			onProgress(r.Params)
		}}
	}
	c := mcpsdk.NewClient(&mcpsdk.Implementation{Name: name, Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, &mcpsdk.StreamableClientTransport{Endpoint: "http://hearth/mcp", HTTPClient: unixHTTP(d.Socket())}, nil)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callErr calls a tool that must fail and returns its error text.
func callErr(t *testing.T, cs *mcpsdk.ClientSession, tool string, args any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return err.Error()
	}
	if !res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		t.Fatalf("%s(%v) = %s, want an error", tool, args, b)
	}
	return text(res)
}

type sandboxInfo struct {
	ID, Image, Session, Owner, Status, User string
	AutoPaused                              bool  `json:"auto_paused"`
	MemoryMB                                int64 `json:"memory_mb"`
}

type execResult struct {
	ExitCode    int  `json:"exit_code"`
	TimedOut    bool `json:"timed_out"`
	Stdout      string
	Stderr      string
	StdoutBytes int64 `json:"stdout_bytes"`
	Truncated   bool
}

type fileOut struct {
	Path, Encoding, Content string
	Size                    int64
	Truncated               bool
}

type processOut struct {
	ID, State, Stdout, Stderr string
	ExitCode                  *int `json:"exit_code"`
}

type searchOut struct {
	Matches []struct {
		Path, Text string
		Line       int
	}
	Truncated bool
}

type sandboxListOut struct {
	Owner     string
	Sandboxes []sandboxInfo
}

const buggyScript = `import sys

def mean(xs):
    return sum(xs) / len(x)

values = [float(v) for v in sys.argv[1:]]
print("mean:", mean(values))
`

// traceback finds the failing line and the unknown name in a Python
// NameError (the innermost frame), as a model reading the error would.
var traceback = regexp.MustCompile(`(?s).*File "([^"]+)", line (\d+).*NameError: name '(\w+)' is not defined`)

// TestSandboxTools is an agent loop outside Hearth that uses a sandbox
// as its tool backend: it writes a Python script with a bug, runs it,
// reads the error, fixes the file, runs it again (its output streamed
// as progress) and reads the output; searches and lists the files; runs
// a server in the background, reads its logs and stops it; checkpoints
// and restores; and destroys the sandbox. Another client's sandbox,
// idle, pauses and resumes; each client lists its own.
func TestSandboxTools(t *testing.T) {
	d := startSandboxDaemon(t)
	var mu sync.Mutex
	var streamed strings.Builder
	var lastProgress float64
	loop := connectAs(t, d, "agent-loop", func(p *mcpsdk.ProgressNotificationParams) {
		mu.Lock()
		defer mu.Unlock()
		if p.Progress <= lastProgress {
			t.Errorf("progress %v after %v: it must grow", p.Progress, lastProgress)
		}
		lastProgress = p.Progress
		streamed.WriteString(p.Message)
	})
	other := connectAs(t, d, "other-loop", nil)

	tools, err := loop.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		if strings.HasPrefix(tool.Name, "sandbox_") {
			names = append(names, tool.Name)
		}
	}
	slices.Sort(names)
	want := []string{"sandbox_checkpoint", "sandbox_create", "sandbox_destroy", "sandbox_exec", "sandbox_expose_port", "sandbox_fork", "sandbox_list", "sandbox_list_files",
		"sandbox_process_logs", "sandbox_read_file", "sandbox_restore", "sandbox_search", "sandbox_start_process", "sandbox_stop_process", "sandbox_write_file"}
	if !slices.Equal(names, want) {
		t.Errorf("sandbox tools %v, want %v", names, want)
	}

	var sb sandboxInfo
	call(t, loop, "sandbox_create", map[string]any{"image": "base", "memory_mb": 512, "session": "work"}, &sb)
	t.Logf("created %+v", sb)
	if sb.ID == "" || sb.Status != "running" || sb.Owner != "mcp:agent-loop" || sb.MemoryMB != 512 || sb.Session != "work" || sb.User != "agent" {
		t.Fatalf("sandbox_create = %+v, want it running, 512 MiB, owned by mcp:agent-loop", sb)
	}
	// The other client's sandbox pauses when idle and resumes on a call.
	var idle sandboxInfo
	call(t, other, "sandbox_create", map[string]any{"idle_timeout_seconds": 1}, &idle)
	if idle.Owner != "mcp:other-loop" || idle.Image != "base" {
		t.Errorf("the other client's sandbox = %+v", idle)
	}

	// The agent loop: write, run, read the error, fix, run, read.
	home := "/home/agent"
	script := home + "/stats/mean.py"
	call(t, loop, "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": script, "content": buggyScript}, nil)
	var run execResult
	call(t, loop, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "python3 stats/mean.py 1 2 3 4", "cwd": home}, &run)
	m := traceback.FindStringSubmatch(run.Stderr)
	if run.ExitCode != 1 || m == nil || m[1] != script {
		t.Fatalf("first run = %+v, want exit 1 and a NameError in %s", run, script)
	}
	var src fileOut
	call(t, loop, "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": m[1]}, &src)
	lines := strings.Split(src.Content, "\n")
	var n int
	fmt.Sscan(m[2], &n)
	if src.Content != buggyScript || n < 1 || n > len(lines) {
		t.Fatalf("read back %+v, want the script with line %d", src, n)
	}
	// The fix: the name it did not know is the parameter, xs.
	lines[n-1] = regexp.MustCompile(`\b`+m[3]+`\b`).ReplaceAllString(lines[n-1], "xs")
	call(t, loop, "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": script, "content": strings.Join(lines, "\n"), "mode": "755"}, nil)
	res, err := loop.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: "sandbox_exec",
		Meta:      mcpsdk.Meta{"progressToken": "run-2"},
		Arguments: map[string]any{"sandbox": sb.ID, "argv": []string{"sh", "-c", "python3 stats/mean.py 1 2 3 4 | tee stats/out.txt; echo done >&2"}, "cwd": home}})
	if err != nil || res.IsError {
		t.Fatalf("second run: %v %q", err, text(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &run)
	if run.ExitCode != 0 || run.Stdout != "mean: 2.5\n" || run.Stderr != "done\n" || run.Truncated {
		t.Fatalf("second run = %+v, want mean: 2.5", run)
	}
	// The client hands notifications to its handler on its own
	// goroutine: the last may be handled just after the result.
	var got string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		got = streamed.String()
		mu.Unlock()
		if strings.Contains(got, "stdout: mean: 2.5") && strings.Contains(got, "stderr: done") || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(got, "stdout: mean: 2.5") || !strings.Contains(got, "stderr: done") {
		t.Errorf("progress notifications said %q, want the output as it came", got)
	}
	var out fileOut
	call(t, loop, "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": home + "/stats/out.txt"}, &out)
	if out.Content != "mean: 2.5\n" || out.Encoding != "text" || out.Size != 10 {
		t.Errorf("read the output = %+v", out)
	}
	call(t, loop, "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": script, "max_bytes": 6}, &out)
	if out.Content != "import" || !out.Truncated || out.Size != int64(len(buggyScript)+1) {
		t.Errorf("read 6 bytes = %+v, want them, truncated, with the whole size", out)
	}

	var found searchOut
	call(t, loop, "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": `def \w+\(`, "path": home, "include": "*.py"}, &found)
	if len(found.Matches) != 1 || found.Matches[0].Path != script || found.Matches[0].Line != 3 || found.Matches[0].Text != "def mean(xs):" {
		t.Errorf("sandbox_search = %+v, want def mean at %s:3", found, script)
	}
	call(t, loop, "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": `print\(`, "path": script}, &found)
	if len(found.Matches) != 1 || found.Matches[0].Path != script || found.Matches[0].Line != 7 {
		t.Errorf("sandbox_search(one file) = %+v, want print at %s:7", found, script)
	}
	call(t, loop, "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "MEAN", "ignore_case": true, "path": home + "/stats", "max_results": 2}, &found)
	if len(found.Matches) != 2 || !found.Truncated {
		t.Errorf("sandbox_search(2 of several) = %+v, want 2, truncated", found)
	}
	call(t, loop, "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "nowhere to be found", "path": home}, &found)
	if len(found.Matches) != 0 || found.Truncated {
		t.Errorf("sandbox_search(no match) = %+v", found)
	}
	var listing struct {
		Entries []struct {
			Name, Mode string
			IsDir      bool `json:"is_dir"`
			Size       int64
		}
	}
	call(t, loop, "sandbox_list_files", map[string]any{"sandbox": sb.ID, "path": home + "/stats"}, &listing)
	if len(listing.Entries) != 2 || listing.Entries[0].Name != "mean.py" || listing.Entries[0].Mode != "755" || listing.Entries[1].Name != "out.txt" {
		t.Errorf("sandbox_list_files = %+v, want mean.py (755) and out.txt", listing)
	}

	// A background process: started, its logs read, stopped.
	var proc processOut
	call(t, loop, "sandbox_start_process", map[string]any{"sandbox": sb.ID,
		"command": `python3 -u -c 'import time
i = 0
while True:
    print("tick", i); i += 1; time.sleep(0.1)'`}, &proc)
	if proc.ID == "" || proc.State != "running" {
		t.Fatalf("sandbox_start_process = %+v", proc)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(proc.Stdout, "tick 3\n") && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		call(t, loop, "sandbox_process_logs", map[string]any{"sandbox": sb.ID, "process": proc.ID}, &proc)
	}
	if !strings.HasPrefix(proc.Stdout, "tick 0\ntick 1\n") || proc.State != "running" {
		t.Fatalf("sandbox_process_logs = %+v, want it running and ticking", proc)
	}
	call(t, loop, "sandbox_process_logs", map[string]any{"sandbox": sb.ID, "process": proc.ID, "max_bytes": 7}, &proc)
	if len(proc.Stdout) != 7 || !strings.HasSuffix(proc.Stdout, "\n") {
		t.Errorf("logs cut to 7 bytes = %q, want the newest 7", proc.Stdout)
	}
	call(t, loop, "sandbox_stop_process", map[string]any{"sandbox": sb.ID, "process": proc.ID, "grace_seconds": 2}, &proc)
	if proc.State != "cancelled" {
		t.Errorf("sandbox_stop_process = %+v, want it cancelled", proc)
	}

	// A checkpoint and a restore.
	var cp struct{ Name string }
	call(t, loop, "sandbox_checkpoint", map[string]any{"sandbox": sb.ID, "name": "fixed"}, &cp)
	call(t, loop, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "rm -r stats && echo gone", "cwd": home}, &run)
	if run.ExitCode != 0 {
		t.Fatalf("rm = %+v", run)
	}
	call(t, loop, "sandbox_restore", map[string]any{"sandbox": sb.ID, "checkpoint": cp.Name}, &sb)
	call(t, loop, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "python3 stats/mean.py 2 4", "cwd": home}, &run)
	if cp.Name != "fixed" || run.ExitCode != 0 || run.Stdout != "mean: 3.0\n" {
		t.Errorf("after restoring %q: run = %+v, want the fixed script back", cp.Name, run)
	}

	// A fork has the files, its own session, and no process.
	var fk struct {
		Sandboxes []struct {
			sandboxInfo
			ForkedFrom string `json:"forked_from"`
		}
	}
	call(t, loop, "sandbox_fork", map[string]any{"sandbox": sb.ID}, &fk)
	if len(fk.Sandboxes) != 1 || fk.Sandboxes[0].ForkedFrom != sb.ID || fk.Sandboxes[0].Session == sb.Session || fk.Sandboxes[0].Owner != sb.Owner {
		t.Fatalf("sandbox_fork = %+v, want one fork of %s with a session of its own", fk, sb.ID)
	}
	call(t, loop, "sandbox_exec", map[string]any{"sandbox": fk.Sandboxes[0].ID, "command": "python3 stats/mean.py 2 4", "cwd": home}, &run)
	if run.ExitCode != 0 || run.Stdout != "mean: 3.0\n" {
		t.Errorf("in the fork: run = %+v, want the source's script", run)
	}
	call(t, loop, "sandbox_destroy", map[string]any{"sandbox": fk.Sandboxes[0].ID}, &struct{}{})

	// Idle, the other sandbox paused; a call resumes it.
	var mine, others, all sandboxListOut
	deadline = time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		call(t, other, "sandbox_list", map[string]any{}, &others)
		if len(others.Sandboxes) == 1 && others.Sandboxes[0].Status == "paused" {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if others.Owner != "mcp:other-loop" || len(others.Sandboxes) != 1 || others.Sandboxes[0].ID != idle.ID || !others.Sandboxes[0].AutoPaused {
		t.Errorf("the other client's sandbox_list = %+v, want its own sandbox %s, paused as idle", others, idle.ID)
	}
	call(t, other, "sandbox_exec", map[string]any{"sandbox": idle.ID, "command": "echo awake"}, &run)
	if run.Stdout != "awake\n" {
		t.Errorf("exec in the paused sandbox = %+v", run)
	}
	call(t, loop, "sandbox_list", map[string]any{}, &mine)
	call(t, loop, "sandbox_list", map[string]any{"all": true}, &all)
	if len(mine.Sandboxes) != 1 || mine.Sandboxes[0].ID != sb.ID || len(all.Sandboxes) != 2 {
		t.Errorf("sandbox_list = %+v, all = %+v; want its own, then both", mine, all)
	}
	// The label is the API's too.
	api, err := client.New(d.Socket()).Sandbox(context.Background(), sb.ID)
	if err != nil || api.Owner != "mcp:agent-loop" {
		t.Errorf("GET the sandbox = %+v, %v; want owner mcp:agent-loop", api, err)
	}

	var gone struct{ Destroyed string }
	call(t, loop, "sandbox_destroy", map[string]any{"sandbox": sb.ID}, &gone)
	call(t, other, "sandbox_destroy", map[string]any{"sandbox": idle.ID}, nil)
	call(t, loop, "sandbox_list", map[string]any{"all": true}, &all)
	if gone.Destroyed != sb.ID || len(all.Sandboxes) != 0 {
		t.Errorf("after destroying both: %+v, list %+v", gone, all)
	}
	if msg := callErr(t, loop, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "true"}); !strings.Contains(msg, sb.ID) {
		t.Errorf("exec in a destroyed sandbox: %q, want an error naming it", msg)
	}
}

// TestHostileSandboxTools is what an MCP client could try: host paths,
// links and .. out of the machine, option injection through a search,
// file names that fake matches, floods of output (in the result and as
// progress), and malformed arguments of every kind. Owner labels are
// not a boundary (every tool acts on any sandbox, as the API does for
// whoever holds its token), so there is no other client's sandbox to
// break into.
func TestHostileSandboxTools(t *testing.T) {
	d := startSandboxDaemon(t)
	var mu sync.Mutex
	var notes, streamedBytes int
	cs := connectAs(t, d, "hostile", func(p *mcpsdk.ProgressNotificationParams) {
		mu.Lock()
		notes++
		streamedBytes += len(p.Message)
		mu.Unlock()
	})
	var sb sandboxInfo
	call(t, cs, "sandbox_create", map[string]any{}, &sb)

	// A host file the sandbox must not reach.
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "secret.txt")
	os.WriteFile(secret, []byte("host secret 7f3a"), 0o644)
	var run execResult
	call(t, cs, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "ln -s / /tmp/hostroot && ln -s " + secret + " /tmp/secret"}, &run)
	if run.ExitCode != 0 {
		t.Fatalf("ln = %+v", run)
	}
	for _, p := range []string{secret, "/../../.." + secret, "/tmp/hostroot" + secret, "/tmp/secret", "/proc/1/root" + secret} {
		res, err := cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: "sandbox_read_file", Arguments: map[string]any{"sandbox": sb.ID, "path": p}})
		if err == nil && !res.IsError {
			b, _ := json.Marshal(res.StructuredContent)
			if strings.Contains(string(b), "7f3a") {
				t.Errorf("sandbox_read_file(%s) read the host's file: %s", p, b)
			}
		}
		var found searchOut
		res, err = cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: "sandbox_search", Arguments: map[string]any{"sandbox": sb.ID, "pattern": "7f3a", "path": p}})
		if err == nil && !res.IsError {
			b, _ := json.Marshal(res.StructuredContent)
			json.Unmarshal(b, &found)
			if len(found.Matches) > 0 {
				t.Errorf("sandbox_search(%s) found the host's file: %+v", p, found)
			}
		}
	}
	call(t, cs, "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/hostroot" + secretDir + "/planted", "content": "x"}, nil)
	if _, err := os.Stat(filepath.Join(secretDir, "planted")); err == nil {
		t.Error("sandbox_write_file through a link wrote on the host")
	}

	// A search pattern that looks like options is a pattern; a file
	// name with a newline and a colon cannot fake a match.
	call(t, cs, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": `mkdir -p /tmp/s && printf 'needle\n' > "/tmp/s/a
99:needle" && printf 'x%.0s' $(seq 1 20000) > /tmp/s/long && printf 'needle\n' >> /tmp/s/long`}, &run)
	var found searchOut
	call(t, cs, "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "--include=*", "path": "/tmp/s"}, &found)
	if len(found.Matches) != 0 {
		t.Errorf("a pattern like an option = %+v, want no match", found)
	}
	call(t, cs, "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "needle", "path": "/tmp/s"}, &found)
	slices.SortFunc(found.Matches, func(a, b struct {
		Path, Text string
		Line       int
	}) int {
		return strings.Compare(a.Path, b.Path)
	})
	if len(found.Matches) != 2 || found.Matches[0].Path != "/tmp/s/a\n99:needle" || found.Matches[0].Line != 1 ||
		found.Matches[1].Path != "/tmp/s/long" || found.Matches[1].Line != 1 || len(found.Matches[1].Text) != 500 {
		t.Errorf("search with a lying file name and a long line = %+v", found)
	}

	// A flood of output: the result is capped and says so, and so is
	// what streams as progress.
	const flood = 20 << 20
	res, err := cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: "sandbox_exec", Meta: mcpsdk.Meta{"progressToken": 7},
		Arguments: map[string]any{"sandbox": sb.ID, "command": fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a; echo; echo tail-marker", flood)}})
	if err != nil || res.IsError {
		t.Fatalf("flood: %v %q", err, text(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &run)
	if run.ExitCode != 0 || !run.Truncated || run.StdoutBytes != int64(flood+len("\ntail-marker\n")) || len(run.Stdout) > 65<<10 ||
		!strings.HasPrefix(run.Stdout, "aaaa") || !strings.HasSuffix(run.Stdout, "tail-marker\n") || !strings.Contains(run.Stdout, "bytes cut") {
		t.Errorf("flood: exit %d, truncated %v, %d bytes said, %d returned; want 64 KiB with its start and end, the cut said",
			run.ExitCode, run.Truncated, run.StdoutBytes, len(run.Stdout))
	}
	if len(b) > 200<<10 {
		t.Errorf("flood: a result of %d bytes", len(b))
	}
	mu.Lock()
	if streamedBytes > (1<<20)+(64<<10) || notes == 0 {
		t.Errorf("flood: %d progress notifications with %d bytes, want at most 1 MiB streamed", notes, streamedBytes)
	}
	mu.Unlock()
	call(t, cs, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "sleep 30", "timeout_seconds": 0.5}, &run)
	if !run.TimedOut {
		t.Errorf("sleep past its timeout = %+v, want timed_out", run)
	}
	// A huge file reads as its first MiB.
	call(t, cs, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "head -c 5000000 /dev/urandom > /tmp/big"}, &run)
	var big fileOut
	call(t, cs, "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/big"}, &big)
	if big.Size != 5000000 || !big.Truncated || big.Encoding != "base64" || len(big.Content) != (1<<20+2)/3*4 {
		t.Errorf("a 5 MB binary file read as size %d, truncated %v, %s, %d bytes", big.Size, big.Truncated, big.Encoding, len(big.Content))
	}

	for _, tc := range []struct {
		name, tool string
		args       any
		want       string
	}{
		{"sandbox id as a path", "sandbox_exec", map[string]any{"sandbox": "../../v1/sandboxes", "command": "true"}, "give a sandbox id"},
		{"unknown sandbox", "sandbox_exec", map[string]any{"sandbox": "sbx-nosuch", "command": "true"}, "sbx-nosuch"},
		{"no command", "sandbox_exec", map[string]any{"sandbox": sb.ID}, "a command (a shell line) or an argv"},
		{"command and argv", "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "true", "argv": []string{"true"}}, "one of them"},
		{"NUL in argv", "sandbox_exec", map[string]any{"sandbox": sb.ID, "argv": []string{"echo", "a\x00b"}}, "NUL"},
		{"relative cwd", "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "true", "cwd": "tmp"}, "absolute path"},
		{"timeout too long", "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "true", "timeout_seconds": 1e9}, "0 to 3600"},
		{"negative timeout", "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "true", "timeout_seconds": -1}, "0 to 3600"},
		// JSON has no NaN nor infinities: the schema refuses a string.
		{"timeout as NaN", "sandbox_exec", json.RawMessage(`{"sandbox":"` + sb.ID + `","command":"true","timeout_seconds":"NaN"}`), "timeout_seconds"},
		{"max_output too big", "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "true", "max_output": 1 << 30}, "max_output"},
		{"env with =", "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "true", "env": map[string]string{"A=B": "c"}}, "environment variable"},
		{"relative path", "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": "etc/passwd"}, "absolute path"},
		{"NUL in path", "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": "/etc/passwd\x00.txt"}, "absolute path"},
		{"long path", "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": "/" + strings.Repeat("a", 5000)}, "absolute path"},
		{"read a directory", "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": "/etc"}, "sandbox_list_files"},
		{"read missing", "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": "/nope"}, "/nope"},
		{"negative max_bytes", "sandbox_read_file", map[string]any{"sandbox": sb.ID, "path": "/etc/passwd", "max_bytes": -1}, "max_bytes"},
		{"write the root", "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": "/", "content": "x"}, "name a file"},
		{"bad mode", "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/x", "content": "x", "mode": "999"}, "octal"},
		{"bad encoding", "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/x", "content": "x", "encoding": "hex"}, "text or base64"},
		{"bad base64", "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/x", "content": "!!", "encoding": "base64"}, "not base64"},
		{"too big to write", "sandbox_write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/x", "content": strings.Repeat("x", 2<<20+1)}, "at most 2097152"},
		{"empty pattern", "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "", "path": "/tmp"}, "pattern"},
		{"bad regex", "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "a(", "path": "/tmp"}, "grep"},
		{"search a missing path", "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "a", "path": "/nowhere"}, "is /nowhere a file or directory"},
		{"include with a slash", "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "a", "path": "/tmp", "include": "../*"}, "include"},
		{"too many results", "sandbox_search", map[string]any{"sandbox": sb.ID, "pattern": "a", "path": "/tmp", "max_results": 5000}, "max_results"},
		{"cpus NaN", "sandbox_create", json.RawMessage(`{"cpus":"NaN"}`), "cpus"},
		{"too many cpus", "sandbox_create", map[string]any{"cpus": 1000}, "0 to 64"},
		{"negative memory", "sandbox_create", map[string]any{"memory_mb": -5}, "memory_mb"},
		{"owner with a newline", "sandbox_create", map[string]any{"owner": "me\nyou"}, "printable"},
		{"unknown image", "sandbox_create", map[string]any{"image": "nosuch"}, "nosuch"},
		{"all and owner", "sandbox_list", map[string]any{"all": true, "owner": "x"}, "not both"},
		{"bad process id", "sandbox_process_logs", map[string]any{"sandbox": sb.ID, "process": "../../x"}, "process"},
		{"unknown process", "sandbox_stop_process", map[string]any{"sandbox": sb.ID, "process": "job-99"}, "job-99"},
		{"grace too long", "sandbox_stop_process", map[string]any{"sandbox": sb.ID, "process": "job-1", "grace_seconds": 3600}, "0 to 60"},
		{"bad checkpoint name", "sandbox_checkpoint", map[string]any{"sandbox": sb.ID, "name": "../x"}, "checkpoint name"},
		{"too many forks", "sandbox_fork", map[string]any{"sandbox": sb.ID, "count": 17}, "1 to 16"},
		{"fork of a bad id", "sandbox_fork", map[string]any{"sandbox": "../x"}, "sandbox"},
		{"unknown checkpoint", "sandbox_restore", map[string]any{"sandbox": sb.ID, "checkpoint": "never"}, "never"},
		{"unknown argument", "sandbox_destroy", map[string]any{"sandbox": sb.ID, "force": true}, "force"},
	} {
		msg := callErr(t, cs, tc.tool, tc.args)
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %s = %q, want an error about %q", tc.name, tc.tool, msg, tc.want)
		} else {
			t.Logf("%s: %s", tc.name, msg)
		}
	}
	// Still serving, and the sandbox still there.
	call(t, cs, "sandbox_exec", map[string]any{"sandbox": sb.ID, "command": "echo ok"}, &run)
	if run.Stdout != "ok\n" {
		t.Errorf("after the bad calls: %+v", run)
	}
}

// BenchmarkSandboxExec runs `true` in a sandbox through sandbox_exec
// (MCP client -> the daemon's /mcp on its socket -> the daemon's exec
// API) and, as the baseline in the same run, through the API client's
// Exec directly, interleaved; it reports what the tool adds.
func BenchmarkSandboxExec(b *testing.B) {
	d := startSandboxDaemon(b)
	ctx := context.Background()
	c := client.New(d.Socket())
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		b.Fatal(err)
	}
	mc := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := mc.Connect(ctx, &mcpsdk.StreamableClientTransport{Endpoint: "http://hearth/mcp", HTTPClient: unixHTTP(d.Socket())}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	viaMCP := func() {
		res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"sandbox": sb.Id, "argv": []string{"true"}}})
		if err != nil || res.IsError {
			b.Fatalf("sandbox_exec = %+v, %v", res, err)
		}
	}
	direct := func() {
		if st, err := c.Exec(ctx, sb.Id, client.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil || st.Code != 0 {
			b.Fatalf("exec = %+v, %v", st, err)
		}
	}
	for range 5 {
		viaMCP()
		direct()
	}
	var tool, api time.Duration
	for b.Loop() {
		t0 := time.Now()
		viaMCP()
		t1 := time.Now()
		direct()
		tool, api = tool+t1.Sub(t0), api+time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tool.Microseconds())/n, "mcp-µs/exec")
	b.ReportMetric(float64(api.Microseconds())/n, "api-µs/exec")
	b.ReportMetric(float64(tool)/float64(api), "x-mcp")
}

// TestSandboxExposePortTool: an agent loop outside starts a web server in
// its sandbox and exposes its port with sandbox_expose_port; the preview
// URL serves it with the API token and refuses a request without.
func TestSandboxExposePortTool(t *testing.T) {
	d := startSandboxDaemon(t, func(c *appliance.Config) { c.API.TCP = "127.0.0.1:0" })
	loop := connectAs(t, d, "agent-loop", nil)
	var created sandboxInfo
	call(t, loop, "sandbox_create", map[string]any{}, &created)
	call(t, loop, "sandbox_write_file", map[string]any{"sandbox": created.ID, "path": "/tmp/www/index.html", "content": "hello through the preview"}, nil)
	call(t, loop, "sandbox_start_process", map[string]any{"sandbox": created.ID, "argv": []string{"python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp/www"}}, nil)
	var p struct {
		URL       string `json:"url"`
		PublicURL string `json:"public_url"`
		Port      int
	}
	if msg := callErr(t, loop, "sandbox_expose_port", map[string]any{"sandbox": created.ID, "port": 70000}); !strings.Contains(msg, "1 to 65535") {
		t.Errorf("port 70000: %q", msg)
	}
	call(t, loop, "sandbox_expose_port", map[string]any{"sandbox": created.ID, "port": 8000}, &p)
	if p.Port != 8000 || p.URL == "" || p.PublicURL != "" {
		t.Fatalf("exposed %+v", p)
	}
	get := func(auth bool) (int, string) {
		req, _ := http.NewRequest("GET", p.URL, nil)
		if auth {
			req.Header.Set("Authorization", "Bearer "+d.Token())
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var code int
	var body string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body = get(true); code == 200 {
			break // the server is up
		}
	}
	if code != 200 || body != "hello through the preview" {
		t.Errorf("GET %s with the token = %d %q", p.URL, code, body)
	}
	if code, _ := get(false); code != http.StatusUnauthorized {
		t.Errorf("GET %s without the token = %d, want 401", p.URL, code)
	}
}
