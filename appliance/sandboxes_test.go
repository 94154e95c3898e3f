package appliance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hearth/client"
)

// recorder keeps the order in which output chunks arrived and when.
type recorder struct {
	mu     sync.Mutex
	start  time.Time
	chunks []chunk
}

type chunk struct {
	stream, data string
	at           time.Duration
}

func (r *recorder) writer(stream string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		r.mu.Lock()
		r.chunks = append(r.chunks, chunk{stream, string(p), time.Since(r.start)})
		r.mu.Unlock()
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// run execs a shell script in sandbox id and returns its stdout.
func run(t *testing.T, c *Client, id, script string) (string, ExitStatus) {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := c.Exec(context.Background(), id, ExecRequest{Argv: []string{"sh", "-c", script}}, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", script, id, err)
	}
	if errb.Len() > 0 {
		t.Logf("exec %q: stderr %q", script, errb.String())
	}
	return out.String(), st
}

func wantCode(t *testing.T, err error, code string, status int) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Code != code || ae.Status != status {
		t.Fatalf("error = %v, want code %s and status %d", err, code, status)
	}
}

func TestSandboxLifecycle(t *testing.T) {
	cfg := sandboxConfig(t)
	d, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "life", Session: "s1", Owner: "mcp:test", Env: map[string]string{"FOO": "bar"}, Memory: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Status != "running" || sb.Image != "tiny" || sb.User != "agent" || sb.Network != "none" || sb.Driver != "jail" || sb.Owner != "mcp:test" {
		t.Errorf("created %+v", sb)
	}

	t.Run("output streams in order", func(t *testing.T) {
		rec := &recorder{start: time.Now()}
		script := "echo out1; sleep 0.1; echo err1 >&2; sleep 0.1; echo out2; sleep 1; echo late; exit 3"
		st, err := c.Exec(ctx, "life", ExecRequest{Argv: []string{"sh", "-c", script}}, rec.writer("stdout"), rec.writer("stderr"))
		if err != nil || st.Code != 3 {
			t.Fatalf("exec = %+v, %v; want exit 3", st, err)
		}
		var order []string
		for _, ch := range rec.chunks {
			order = append(order, ch.stream+":"+strings.TrimSpace(ch.data))
		}
		if got := strings.Join(order, " "); !strings.HasPrefix(got, "stdout:out1 stderr:err1 stdout:out2") {
			t.Errorf("chunks arrived as %s", got)
		}
		last := rec.chunks[len(rec.chunks)-1]
		first := rec.chunks[0]
		if last.at-first.at < 900*time.Millisecond {
			t.Errorf("output was not streamed: first chunk at %v, the one after sleep 1 at %v", first.at, last.at)
		}
	})

	t.Run("execs one after another keep their connection", func(t *testing.T) {
		// Each exec's stream is read to its end, so the next request
		// goes on the same connection instead of dialing again.
		var reused []bool
		tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) { reused = append(reused, ci.Reused) },
		})
		for _, argv := range [][]string{{"true"}, {"sh", "-c", "exit 4"}, {"echo", "hi"}} {
			if _, err := c.Exec(tctx, "life", ExecRequest{Argv: argv}, io.Discard, nil); err != nil {
				t.Fatalf("exec %v: %v", argv, err)
			}
		}
		_, err := c.Exec(tctx, "life", ExecRequest{Argv: []string{"no-such-command"}}, nil, nil)
		if _, err := c.Sandbox(tctx, "life"); err != nil {
			t.Fatal(err)
		}
		if len(reused) != 5 || slices.Contains(reused[1:], false) {
			t.Errorf("connections reused by 3 execs, a failed one (%v), then a get: %v; want every one after the first", err, reused)
		}
	})

	t.Run("environment, user and directory", func(t *testing.T) {
		out, _ := run(t, c, "life", "echo $FOO $HOME $LANG $USER; pwd; id -u")
		if out != "bar /home/agent C.UTF-8 agent\n/home/agent\n1000\n" {
			t.Errorf("exec as default user = %q", out)
		}
		var b bytes.Buffer
		st, err := c.Exec(ctx, "life", ExecRequest{Argv: []string{"sh", "-c", "id -u; echo $HOME $FOO; pwd"}, User: "root",
			Env: map[string]string{"FOO": "override"}, Cwd: "/tmp"}, &b, nil)
		if err != nil || st.Code != 0 || b.String() != "0\n/root override\n/tmp\n" {
			t.Errorf("exec as root = %q, %+v, %v", b.String(), st, err)
		}
	})

	t.Run("stdin, signal, timeout", func(t *testing.T) {
		var b bytes.Buffer
		st, err := c.Exec(ctx, "life", ExecRequest{Argv: []string{"sh", "-c", "tr a-z A-Z"}, Stdin: []byte("hello")}, &b, nil)
		if err != nil || st.Code != 0 || b.String() != "HELLO" {
			t.Errorf("exec with stdin = %q, %+v, %v", b.String(), st, err)
		}
		if _, st := run(t, c, "life", "kill -9 $$"); st.Code != -1 || st.Signal != "killed" {
			t.Errorf("killed exec = %+v, want code -1 signal killed", st)
		}
		st, err = c.Exec(ctx, "life", ExecRequest{Argv: []string{"sleep", "5"}, Timeout: "200ms"}, nil, nil)
		if err != nil || !st.TimedOut {
			t.Errorf("exec past its timeout = %+v, %v; want timed_out", st, err)
		}
	})

	t.Run("files", func(t *testing.T) {
		data := bytes.Repeat([]byte("0123456789"), 10000)
		if n, err := c.Upload(ctx, "life", "/tmp/data.bin", bytes.NewReader(data), 0o600); err != nil || n != int64(len(data)) {
			t.Fatalf("Upload = %d, %v", n, err)
		}
		var got bytes.Buffer
		n, mode, err := c.Download(ctx, "life", "/tmp/data.bin", &got)
		if err != nil || n != int64(len(data)) || mode != 0o600 || !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("Download = %d bytes, mode %o, %v; want the %d bytes uploaded, mode 600", n, mode, err, len(data))
		}
		fi, err := c.Stat(ctx, "life", "/tmp/data.bin")
		if err != nil || fi.Size != int64(len(data)) || fi.IsDir {
			t.Errorf("Stat = %+v, %v", fi, err)
		}
		list, err := c.List(ctx, "life", "/tmp")
		if err != nil || len(list) != 1 || list[0].Name != "data.bin" {
			t.Errorf("List(/tmp) = %+v, %v", list, err)
		}
		_, _, err = c.Download(ctx, "life", "/tmp/nope", io.Discard)
		wantCode(t, err, "not_found", 404)
	})

	t.Run("workspace session", func(t *testing.T) {
		out, st := run(t, c, "life", "echo from-sandbox > /workspace/agents/s1/outputs/a.txt && ls -ld /workspace/agents/s1 | awk '{print $3}'")
		if st.Code != 0 || out != "agent\n" {
			t.Errorf("writing the session's outputs: %q, exit %d", out, st.Code)
		}
		got, err := os.ReadFile(filepath.Join(cfg.Workspace.Mount, "s1", "outputs", "a.txt"))
		if err != nil || string(got) != "from-sandbox\n" {
			t.Errorf("host sees %q, %v", got, err)
		}
		var fi syscall.Stat_t
		syscall.Stat(filepath.Join(cfg.Workspace.Mount, "s1"), &fi)
		if want := 1000 + d.sbx.driver.Capabilities().HostIDOffset; fi.Uid != want {
			t.Errorf("session directory owned by uid %d on the host, want %d", fi.Uid, want)
		}
	})

	t.Run("explicit pause refuses exec", func(t *testing.T) {
		if sb, err := c.PauseSandbox(ctx, "life"); err != nil || sb.Status != "paused" || sb.AutoPaused {
			t.Fatalf("Pause = %+v, %v", sb, err)
		}
		_, err := c.Exec(ctx, "life", ExecRequest{Argv: []string{"true"}}, nil, nil)
		wantCode(t, err, "conflict", 409)
		if !strings.Contains(err.Error(), "hearth sandboxes resume life") {
			t.Errorf("exec while paused: %v, want a hint to resume", err)
		}
		if _, _, err := c.Download(ctx, "life", "/tmp/data.bin", io.Discard); err == nil {
			t.Errorf("download while paused succeeded")
		}
		if sb, err := c.ResumeSandbox(ctx, "life"); err != nil || sb.Status != "running" {
			t.Fatalf("Resume = %+v, %v", sb, err)
		}
		if out, _ := run(t, c, "life", "echo back"); out != "back\n" {
			t.Errorf("exec after resume = %q", out)
		}
	})

	if err := c.DestroySandbox(ctx, "life"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Sandbox(ctx, "life")
	wantCode(t, err, "not_found", 404)
	if _, err := os.Stat(filepath.Join(cfg.Workspace.Mount, "s1", "outputs", "a.txt")); err != nil {
		t.Errorf("the session's files went with the sandbox: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(cfg.StateDir, "sandboxes")); len(ents) != 0 {
		t.Errorf("records left after destroy: %v", ents)
	}
}

// TestSandboxIdlePause: an idle sandbox pauses itself, an exec resumes it
// transparently, and a running exec or background job keeps it awake.
func TestSandboxIdlePause(t *testing.T) {
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "idle", IdleTimeout: "500ms"}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "idle", "paused", true)
	start := time.Now()
	if out, _ := run(t, c, "idle", "echo awake"); out != "awake\n" {
		t.Errorf("exec on an idle-paused sandbox = %q", out)
	}
	t.Logf("exec that resumed an idle sandbox took %v", time.Since(start))
	if sb, _ := c.Sandbox(ctx, "idle"); sb.Status != "running" {
		t.Errorf("after the exec: %s, want running", sb.Status)
	}
	// A long exec is activity.
	if _, st := run(t, c, "idle", "sleep 1.5"); st.Code != 0 {
		t.Errorf("sleep 1.5 = %+v", st)
	}
	// So is a background job.
	if _, err := c.StartJob(ctx, "idle", JobRequest{Argv: []string{"sleep", "2"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if sb, _ := c.Sandbox(ctx, "idle"); sb.Status != "running" {
		t.Errorf("with a background job running: %s, want running", sb.Status)
	}
	waitStatus(t, c, "idle", "paused", true)
}

func waitStatus(t *testing.T, c *Client, id, status string, auto bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sb, err := c.Sandbox(context.Background(), id)
		if err == nil && string(sb.Status) == status && sb.AutoPaused == auto {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s = %+v, %v; want %s (auto %v)", id, sb, err, status, auto)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSandboxBadInput(t *testing.T) {
	cfg := sandboxConfig(t)
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "bad"}); err != nil {
		t.Fatal(err)
	}
	runErrorCases(t, []errorCase{
		{"unknown sandbox", func() error { _, err := c.Sandbox(ctx, "nope"); return err }, "not_found", 404, "hearth sandboxes ls"},
		{"exec in unknown sandbox", func() error {
			_, err := c.Exec(ctx, "nope", ExecRequest{Argv: []string{"true"}}, nil, nil)
			return err
		}, "not_found", 404, ""},
		{"destroy unknown", func() error { return c.DestroySandbox(ctx, "nope") }, "not_found", 404, ""},
		{"bad id", func() error { _, err := c.Sandbox(ctx, "../etc"); return err }, "bad_request", 400, "lowercase"},
		{"bad id on create", func() error { _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "Bad_ID"}); return err }, "bad_request", 400, ""},
		{"duplicate id", func() error { _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Id: "bad"}); return err }, "conflict", 409, "already exists"},
		{"unknown image", func() error { _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Image: "nosuch"}); return err }, "not_found", 404, "the recipes are"},
		{"image not built", func() error { _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Image: "node"}); return err }, "not_found", 404, "hearth images build node"},
		{"bad session", func() error { _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Session: "../x"}); return err }, "bad_request", 400, "session id"},
		{"owner with a newline", func() error { _, err := c.CreateSandbox(ctx, CreateSandboxRequest{Owner: "mcp:a\nb"}); return err }, "bad_request", 400, "printable"},
		{"owner too long", func() error {
			_, err := c.CreateSandbox(ctx, CreateSandboxRequest{Owner: strings.Repeat("o", 129)})
			return err
		}, "bad_request", 400, "at most 128"},
		{"bad duration", func() error { _, err := c.CreateSandbox(ctx, CreateSandboxRequest{IdleTimeout: "soon"}); return err }, "bad_request", 400, "duration"},
		{"empty argv", func() error { _, err := c.Exec(ctx, "bad", ExecRequest{Argv: []string{}}, nil, nil); return err }, "bad_request", 400, ""},
		{"no such command", func() error {
			_, err := c.Exec(ctx, "bad", ExecRequest{Argv: []string{"/no/such/cmd"}}, nil, nil)
			return err
		}, "bad_request", 400, "/no/such/cmd"},
		{"unknown user", func() error {
			_, err := c.Exec(ctx, "bad", ExecRequest{Argv: []string{"true"}, User: "mallory"}, nil, nil)
			return err
		}, "bad_request", 400, "passwd"},
		{"relative path", func() error { _, err := c.Stat(ctx, "bad", "etc/passwd"); return err }, "bad_request", 400, "absolute"},
		{"upload too large", func() error {
			_, err := c.Upload(ctx, "bad", "/tmp/big", bytes.NewReader(make([]byte, 2<<20)), 0o644)
			return err
		}, "too_large", 413, "max_upload"},
		{"streamed upload too large", func() error {
			_, err := c.Upload(ctx, "bad", "/tmp/big", io.LimitReader(zeros{}, 2<<20), 0o644)
			return err
		}, "too_large", 413, "max_upload"},
		{"build unknown recipe", func() error { _, err := c.BuildImage(ctx, "nosuch", nil); return err }, "not_found", 404, "recipes are"},
		{"inspect unbuilt image", func() error { _, err := c.InspectImage(ctx, "node"); return err }, "not_found", 404, ""},
		{"remove image in use", func() error { return c.RemoveImage(ctx, "tiny") }, "conflict", 409, "bad"},
		{"remove unbuilt image", func() error { return c.RemoveImage(ctx, "node") }, "not_found", 404, ""},
	})
	if _, err := c.Stat(ctx, "bad", "/tmp/big"); err == nil {
		t.Errorf("a refused upload left /tmp/big behind")
	}
	// Paths are resolved inside the machine: .. stops at its root.
	var b bytes.Buffer
	if _, _, err := c.Download(ctx, "bad", "/../../../../etc/passwd", &b); err != nil || !strings.HasPrefix(b.String(), "root:x:0:0:root:/root:/bin/sh\nagent:") {
		t.Errorf("download /../../../../etc/passwd = %q, %v; want the sandbox's own passwd", b.String(), err)
	}
	run(t, c, "bad", "ln -s ../../../../etc/group /tmp/escape")
	b.Reset()
	if _, _, err := c.Download(ctx, "bad", "/tmp/escape", &b); err != nil || b.String() != "root:x:0:\nagent:x:1000:\n" {
		t.Errorf("download through a symlink to ../../../../etc/group = %q, %v; want the sandbox's own group file", b.String(), err)
	}
	// Bodies are size-limited and strict.
	resp, err := c.HTTP().Post("http://hearth/v1/sandboxes", "application/json", strings.NewReader(`{"id":"x","cpu":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("create with an unknown field = %d, want 400", resp.StatusCode)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestSandboxesUnavailable(t *testing.T) {
	cfg := sandboxConfig(t)
	cfg.Sandbox.Agent = filepath.Join(t.TempDir(), "hearth-guest")
	_, c := startSandboxDaemon(t, cfg)
	_, err := c.CreateSandbox(context.Background(), CreateSandboxRequest{})
	wantCode(t, err, "unavailable", 503)
	if !strings.Contains(err.Error(), "go build") {
		t.Errorf("error %q, want it to say how to build the agent", err)
	}
	if list, err := c.Sandboxes(context.Background()); err != nil || len(list) != 0 {
		t.Errorf("Sandboxes = %v, %v; want an empty list", list, err)
	}
}

// TestSandboxRestart: a new daemon on the same state re-attaches to the
// machines the old one left running, keeps a paused one paused, and
// marks one whose machine died meanwhile stopped.
func TestSandboxRestart(t *testing.T) {
	cfg := sandboxConfig(t)
	d1, err := Start(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(cfg.SocketPath())
	ctx := context.Background()
	for _, req := range []CreateSandboxRequest{{Id: "keep", Session: "s1", Owner: "mcp:keeper"}, {Id: "frozen"}, {Id: "doomed"}} {
		if _, err := c.CreateSandbox(ctx, req); err != nil {
			d1.Close()
			t.Fatal(err)
		}
	}
	run(t, c, "keep", "echo kept > /tmp/state")
	job, err := c.StartJob(ctx, "keep", JobRequest{Argv: []string{"sh", "-c", "echo before; sleep 1; echo after"}})
	if err != nil {
		d1.Close()
		t.Fatal(err)
	}
	c.PauseSandbox(ctx, "frozen")
	if err := d1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	pid, _ := os.ReadFile(filepath.Join(cfg.StateDir, "jail", "machines", "doomed", "pid"))
	var p int
	fmt.Sscan(string(pid), &p)
	if p <= 0 || syscall.Kill(p, syscall.SIGKILL) != nil {
		t.Fatalf("kill doomed's agent (pid %q)", pid)
	}

	_, c = startSandboxDaemon(t, cfg)
	if out, st := run(t, c, "keep", "cat /tmp/state"); out != "kept\n" || st.Code != 0 {
		t.Errorf("exec after the restart = %q, %+v", out, st)
	}
	// The job went on across the restart (frozen while no daemon served
	// keep's workspace, see sandboxManager.Close), and its output was kept.
	if j := waitJob(t, c, "keep", job.Id); j.State != "completed" || jobOutput(t, c, "keep", job.Id, "stdout") != "before\nafter\n" {
		t.Errorf("a job across the restart: %+v, output %q", j, jobOutput(t, c, "keep", job.Id, "stdout"))
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "views", "keep", "s1", "outputs")); err != nil {
		t.Errorf("keep's workspace view is not mounted again: %v", err)
	}
	if sb, _ := c.Sandbox(ctx, "keep"); sb.Owner != "mcp:keeper" {
		t.Errorf("keep's owner after the restart = %q, want the label it was created with", sb.Owner)
	}
	sb, _ := c.Sandbox(ctx, "frozen")
	if sb.Status != "paused" || sb.AutoPaused {
		t.Errorf("frozen after the restart: %+v, want paused", sb)
	}
	if _, err := c.ResumeSandbox(ctx, "frozen"); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, c, "frozen", "echo thawed"); out != "thawed\n" {
		t.Errorf("exec in frozen after resume = %q", out)
	}
	if sb, _ := c.Sandbox(ctx, "doomed"); sb.Status != "stopped" {
		t.Errorf("doomed after the restart: %s, want stopped", sb.Status)
	}
	_, err = c.Exec(ctx, "doomed", ExecRequest{Argv: []string{"true"}}, nil, nil)
	wantCode(t, err, "conflict", 409)
	if err := c.DestroySandbox(ctx, "doomed"); err != nil {
		t.Errorf("destroy a stopped sandbox: %v", err)
	}
}
