package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/agents/modeltest"
	"hearth/appliance"
	"hearth/appliance/appliancetest"
	"hearth/appliance/mcp"
)

// These tests run a real daemon whose agents run for real (the claude
// CLI in jail machines, against the scripted model as the provider) and
// talk to its MCP server with the SDK's own client: over stdio, through
// the real `hearth mcp` binary, and over streamable HTTP at the daemon's
// /mcp, on its unix socket and on TCP behind the token.

const analystTOML = `description = "Analyses data files and writes a report."
image = "claude-code"
model = "claude-sonnet-4-5"
outputs = ["outputs/*.md"]

[limits]
usd = 5.0
turns = 20
`

type env struct {
	d          *appliance.Daemon
	configFile string
}

// startDaemon starts a daemon with the analyst agent, script as the model
// provider and the API on TCP too.
func startDaemon(t *testing.T, script modeltest.Config) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("agents need root (namespaces, mounts, cgroups, FUSE)")
	}
	dir := t.TempDir()
	state, mount := filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	agent := appliancetest.Agent(t)
	appliancetest.LinkImages(t, state, appliancetest.ClaudeCodeImages(t))
	model := modeltest.New(script)
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	key := filepath.Join(dir, "api-key")
	defs := filepath.Join(dir, "defs")
	os.MkdirAll(defs, 0o755)
	os.WriteFile(key, []byte(model.Key()), 0o600)
	os.WriteFile(filepath.Join(defs, "analyst.toml"), []byte(analystTOML), 0o644)
	config := filepath.Join(dir, "hearth.toml")
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[sandbox]\nagent = %q\ntier = \"jail\"\n[agents]\ndir = %q\ngrace = \"3s\"\n"+
		"[model]\nupstream = %q\napi_key_file = %q\n[api]\ntcp = \"127.0.0.1:0\"\n", state, mount, agent, defs, model.URL(), key)
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := appliance.LoadConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	d, err := appliance.Start(context.Background(), cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return &env{d: d, configFile: config}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func bash(command string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.ToolUse("Bash", map[string]string{"command": command, "description": "step"})},
		Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

func say(text string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text(text)}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

// buildHearth builds the hearth command into a temporary directory.
func buildHearth(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hearth")
	if out, err := exec.Command("go", "build", "-o", bin, "hearth/cmd/hearth").CombinedOutput(); err != nil {
		t.Fatalf("go build hearth: %v\n%s", err, out)
	}
	return bin
}

func connect(t *testing.T, tr mcpsdk.Transport) *mcpsdk.ClientSession {
	t.Helper()
	c := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "hearth-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// unixHTTP is an HTTP client that reaches the daemon on its socket.
func unixHTTP(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

// bearer adds the daemon's token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// call calls a tool and decodes its structured result into out (nil:
// none); it fails the test on a protocol error or a tool error.
func call(t *testing.T, cs *mcpsdk.ClientSession, tool string, args any, out any) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): %v", tool, args, err)
	}
	if res.IsError {
		t.Fatalf("%s(%v): tool error %q", tool, args, text(res))
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: result %s: %v", tool, b, err)
		}
	}
}

func text(res *mcpsdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcpsdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

type execution struct {
	ID, Agent, Session, Status, Result, Error string
	Ended                                     bool
	Outputs                                   []string
	Turns                                     int
	USD                                       float64
	Limits                                    struct {
		USD      float64
		OnBudget string `json:"on_budget"`
	}
}

type output struct {
	Path, Encoding, Content string
	Size                    int64
	Truncated               bool
}

// TestMCP delegates a task over stdio (the real hearth mcp, waiting for
// the result) and continues its session over HTTP (returning at once,
// then polling), reads the outputs back as tool results and resources,
// and checks that bad calls come back as errors the caller can read
// while the server keeps serving.
func TestMCP(t *testing.T) {
	t.Cleanup(mcp.SetSessionsPerPage(1)) // in the daemon: resources/list pages through the sessions
	e := startDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bash("mkdir -p outputs && wc -l < inputs/q2.csv > outputs/report.md && cat outputs/report.md"),
		say("Wrote outputs/report.md"),
		bash("printf 'north and south\\n' > outputs/summary.md && printf '\\377\\376' > outputs/blob.bin"),
		say("Wrote outputs/summary.md"),
		bash("echo busy; sleep 300"), // until cancelled
	}})
	bin := buildHearth(t)
	stdio := connect(t, &mcpsdk.CommandTransport{Command: exec.Command(bin, "mcp", "--config", e.configFile)})
	local := connect(t, &mcpsdk.StreamableClientTransport{Endpoint: "http://hearth/mcp", HTTPClient: unixHTTP(e.d.Socket())})
	remote := connect(t, &mcpsdk.StreamableClientTransport{Endpoint: "http://" + e.d.TCPAddr() + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{e.d.Token()}}})

	noToken := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "intruder", Version: "1"}, nil)
	if cs, err := noToken.Connect(context.Background(), &mcpsdk.StreamableClientTransport{Endpoint: "http://" + e.d.TCPAddr() + "/mcp", MaxRetries: -1}, nil); err == nil {
		cs.Close()
		t.Error("an MCP client without the token connected over TCP")
	}

	// A page in a browser on another site, even one holding the
	// dashboard's cookie, is refused.
	req, _ := http.NewRequest("POST", "http://"+e.d.TCPAddr()+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.AddCookie(&http.Cookie{Name: "hearth_token", Value: e.d.Token()})
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("a cross-site POST to /mcp = %v, %v; want 403", resp, err)
	} else {
		resp.Body.Close()
	}

	for name, cs := range map[string]*mcpsdk.ClientSession{"stdio": stdio, "unix": local, "tcp": remote} {
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatalf("%s: ListTools: %v", name, err)
		}
		var names []string
		for _, tool := range tools.Tools {
			if !strings.HasPrefix(tool.Name, "sandbox_") { // TestSandboxTools checks those
				names = append(names, tool.Name)
			}
		}
		slices.Sort(names)
		if want := []string{"branch_session", "cancel_execution", "delegate_task", "get_execution", "list_agents", "list_sessions", "read_output", "rewind_session", "topup_execution"}; !slices.Equal(names, want) {
			t.Errorf("%s: tools %v, want %v", name, names, want)
		}
		var agents struct{ Agents []struct{ Name string } }
		call(t, cs, "list_agents", nil, &agents)
		if len(agents.Agents) != 1 || agents.Agents[0].Name != "analyst" {
			t.Errorf("%s: list_agents = %+v, want the analyst", name, agents)
		}
	}

	// Over stdio, waiting.
	var first execution
	call(t, stdio, "delegate_task", map[string]any{"agent": "analyst", "prompt": "Analyze Q2 sales", "wait": true,
		"inputs": map[string]string{"q2.csv": "region,revenue\nnorth,10\nsouth,20\n"}, "limits": map[string]any{"usd": 2, "on_budget": "pause"},
		"context": []map[string]any{{"text": "Be brief.", "to": "~/.claude/CLAUDE.md"}}}, &first)
	t.Logf("first: %+v", first)
	if first.Status != "completed" || !first.Ended || first.Result != "Wrote outputs/report.md" || first.Turns != 2 ||
		!slices.Contains(first.Outputs, "outputs/report.md") || first.USD <= 0 || first.Limits.USD != 2 || first.Limits.OnBudget != "pause" {
		t.Fatalf("delegate_task with wait = %+v, want it completed with its result, report, turns, cost and the tighter limit", first)
	}

	// Over TCP, returning at once, in the same session; polled.
	var second execution
	call(t, remote, "delegate_task", map[string]any{"agent": "analyst", "prompt": "Summarize", "session": first.Session}, &second)
	if second.ID == "" || second.ID == first.ID || second.Session != first.Session || second.Ended {
		t.Fatalf("delegate_task without wait = %+v, want a new execution in session %s, running", second, first.Session)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for !second.Ended && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		call(t, local, "get_execution", map[string]any{"id": second.ID}, &second)
	}
	if second.Status != "completed" || second.Result != "Wrote outputs/summary.md" || second.Limits.OnBudget != "stop" {
		t.Fatalf("polled execution = %+v, want it completed, with the default on_budget stop", second)
	}

	// Outputs, as tool results and as resources.
	var out output
	call(t, remote, "read_output", map[string]any{"session": first.Session, "path": "report.md"}, &out)
	if out != (output{Path: "outputs/report.md", Encoding: "text", Content: "3\n", Size: 2}) {
		t.Errorf("read_output(report.md) = %+v, want the report", out)
	}
	call(t, stdio, "read_output", map[string]any{"execution": first.ID, "path": "outputs/summary.md", "max_bytes": 5}, &out)
	if out != (output{Path: "outputs/summary.md", Encoding: "text", Content: "north", Size: 16, Truncated: true}) {
		t.Errorf("read_output(summary.md, 5 bytes) = %+v, want its first 5 bytes, truncated", out)
	}
	call(t, local, "read_output", map[string]any{"session": first.Session, "path": "blob.bin"}, &out)
	if out != (output{Path: "outputs/blob.bin", Encoding: "base64", Content: "//4=", Size: 2}) {
		t.Errorf("read_output(blob.bin) = %+v, want its bytes in base64", out)
	}
	// A task in a new session, cancelled while it runs.
	var cancelled execution
	call(t, local, "delegate_task", map[string]any{"agent": "analyst", "prompt": "take your time"}, &cancelled)
	call(t, local, "cancel_execution", map[string]any{"id": cancelled.ID}, &cancelled)
	if cancelled.Status != "cancelled" || !cancelled.Ended || cancelled.Session == first.Session {
		t.Errorf("cancel_execution = %+v, want it cancelled, in a session of its own", cancelled)
	}

	var sessions struct {
		Sessions []struct {
			ID, Agent     string
			LastExecution string `json:"last_execution"`
		}
	}
	call(t, local, "list_sessions", map[string]any{"agent": "analyst"}, &sessions)
	if len(sessions.Sessions) != 2 || sessions.Sessions[0].ID != cancelled.Session || sessions.Sessions[1].ID != first.Session ||
		sessions.Sessions[1].LastExecution != second.ID {
		t.Errorf("list_sessions = %+v, want sessions %s and %s (last execution %s), newest first", sessions, cancelled.Session, first.Session, second.ID)
	}
	call(t, local, "list_sessions", map[string]any{"limit": 1}, &sessions)
	if len(sessions.Sessions) != 1 || sessions.Sessions[0].ID != cancelled.Session {
		t.Errorf("list_sessions(limit 1) = %+v, want the newest session only", sessions)
	}
	for name, cs := range map[string]*mcpsdk.ClientSession{"stdio": stdio, "tcp": remote, "unix": local} {
		checkResources(t, name, cs, first.Session)
	}
	// One session a page in the daemon: the newest has no outputs yet.
	if page, err := local.ListResources(context.Background(), nil); err != nil || len(page.Resources) != 0 || page.NextCursor != cancelled.Session {
		t.Errorf("first resources page = %+v, %v; want none, and the cursor %s", page, err, cancelled.Session)
	}

	for name, cs := range map[string]*mcpsdk.ClientSession{"stdio": stdio, "unix": local} {
		t.Run(name, func(t *testing.T) { checkBadCalls(t, cs, first) })
	}
}

func checkResources(t *testing.T, name string, cs *mcpsdk.ClientSession, session string) {
	t.Helper()
	ctx := context.Background()
	var uris []string
	for r, err := range cs.Resources(ctx, nil) { // every page
		if err != nil {
			t.Fatalf("%s: ListResources: %v", name, err)
		}
		uris = append(uris, r.URI)
	}
	prefix := "hearth://sessions/" + session + "/outputs/"
	report, blob := prefix+"report.md", prefix+"blob.bin"
	if want := []string{blob, report, prefix + "summary.md"}; !slices.Equal(uris, want) {
		t.Errorf("%s: resources %v, want %v", name, uris, want)
	}
	if res, err := cs.ReadResource(ctx, &mcpsdk.ReadResourceParams{URI: blob}); err != nil || len(res.Contents) != 1 || string(res.Contents[0].Blob) != "\xff\xfe" {
		t.Errorf("%s: ReadResource(%s) = %+v, %v; want its bytes as a blob", name, blob, res, err)
	}
	res, err := cs.ReadResource(ctx, &mcpsdk.ReadResourceParams{URI: report})
	if err != nil || len(res.Contents) != 1 || res.Contents[0].Text != "3\n" || !strings.HasPrefix(res.Contents[0].MIMEType, "text/") {
		t.Errorf("%s: ReadResource(%s) = %+v, %v; want the report as text", name, report, res, err)
	}
	templates, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(templates.ResourceTemplates) != 1 || templates.ResourceTemplates[0].URITemplate != "hearth://sessions/{session}/outputs/{+path}" {
		t.Errorf("%s: ListResourceTemplates = %+v, %v; want the outputs template", name, templates, err)
	}
	for _, uri := range []string{
		"hearth://sessions/" + session + "/outputs/../inputs/q2.csv",
		"hearth://sessions/" + session + "/outputs/%2E%2E/inputs/q2.csv",
		"hearth://sessions/" + session + "/outputs/missing.md",
		"hearth://sessions/session-000000/outputs/report.md",
		"hearth://sessions/" + session + "/inputs/q2.csv",
	} {
		if res, err := cs.ReadResource(ctx, &mcpsdk.ReadResourceParams{URI: uri}); err == nil {
			t.Errorf("%s: ReadResource(%s) = %+v, want an error", name, uri, res)
		}
	}
}

// checkBadCalls makes calls that must fail, each with a message that
// says what was wrong, and checks the server still answers after them.
func checkBadCalls(t *testing.T, cs *mcpsdk.ClientSession, first execution) {
	for _, tc := range []struct {
		name, tool string
		args       any
		want       string // in the tool error; "" for a protocol error
	}{
		{"unknown agent", "delegate_task", map[string]any{"agent": "nobody", "prompt": "go"}, `no agent "nobody"`},
		{"missing prompt", "delegate_task", map[string]any{"agent": "analyst"}, "prompt"},
		{"empty prompt", "delegate_task", map[string]any{"agent": "analyst", "prompt": " "}, "needs an agent"},
		{"loosening limits", "delegate_task", map[string]any{"agent": "analyst", "prompt": "go", "limits": map[string]any{"usd": 50}}, "may only tighten"},
		{"wait not a bool", "delegate_task", map[string]any{"agent": "analyst", "prompt": "go", "wait": "yes"}, "wait"},
		{"unknown argument", "delegate_task", map[string]any{"agent": "analyst", "prompt": "go", "budget": 1}, "budget"},
		{"unknown execution", "get_execution", map[string]any{"id": "exec-00000000"}, "exec-00000000"},
		{"id not a string", "get_execution", map[string]any{"id": 42}, "id"},
		{"no id", "cancel_execution", map[string]any{}, "id"},
		{"cancel ended", "cancel_execution", map[string]any{"id": first.ID}, "already ended"},
		{"top up ended", "topup_execution", map[string]any{"id": first.ID, "usd": 1}, "already ended"},
		{"top up nothing", "topup_execution", map[string]any{"id": first.ID, "usd": 0}, "positive number of dollars"},
		{"top up with a string", "topup_execution", map[string]any{"id": first.ID, "usd": "5"}, "usd"},
		{"bad on_budget", "delegate_task", map[string]any{"agent": "analyst", "prompt": "go", "limits": map[string]any{"on_budget": "later"}}, "on_budget"},
		{"mcp server outside the network", "delegate_task", map[string]any{"agent": "analyst", "prompt": "go",
			"mcp_servers": []map[string]any{{"name": "web", "url": "https://mcp.example.com/mcp"}}}, "add mcp.example.com to network"},
		{"skill leaving the agents directory", "delegate_task", map[string]any{"agent": "analyst", "prompt": "go", "skills": []string{"../secrets"}}, "clean path"},
		{"context file and text", "delegate_task", map[string]any{"agent": "analyst", "prompt": "go",
			"context": []map[string]any{{"file": "context/CLAUDE.md", "text": "x"}}}, "not both"},
		{"traversal", "read_output", map[string]any{"session": first.Session, "path": "../inputs/q2.csv"}, "under outputs/"},
		{"traversal inside", "read_output", map[string]any{"execution": first.ID, "path": "outputs/a/../../../etc/passwd"}, "under outputs/"},
		{"absolute path", "read_output", map[string]any{"execution": first.ID, "path": "/etc/passwd"}, "under outputs/"},
		{"missing output", "read_output", map[string]any{"execution": first.ID, "path": "nothing.md"}, "nothing.md"},
		{"no session or execution", "read_output", map[string]any{"path": "report.md"}, "a session or an execution"},
		{"both session and execution", "read_output", map[string]any{"session": first.Session, "execution": first.ID, "path": "report.md"}, "one of them"},
		{"unknown session", "read_output", map[string]any{"session": "session-000000", "path": "report.md"}, "session-000000"},
		{"max_bytes too big", "read_output", map[string]any{"execution": first.ID, "path": "report.md", "max_bytes": 2 << 20}, "max_bytes"},
		{"negative limit", "list_sessions", map[string]any{"limit": -1}, "limit"},
		{"rewind without a call", "rewind_session", map[string]any{"session": first.Session}, "which model call"},
		{"rewind past the calls", "rewind_session", map[string]any{"session": first.Session, "call": 99}, "no call 99"},
		{"branch an unknown session", "branch_session", map[string]any{"session": "session-000000", "call": 1}, "session-000000"},
		{"unknown tool", "frobnicate", map[string]any{}, ""},
	} {
		res, err := cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: tc.tool, Arguments: tc.args})
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%s: %s(%v) = %+v, want a protocol error", tc.name, tc.tool, tc.args, res)
		case tc.want == "":
		case err != nil:
			t.Errorf("%s: %s(%v): protocol error %v, want a tool error", tc.name, tc.tool, tc.args, err)
		case !res.IsError || !strings.Contains(text(res), tc.want):
			t.Errorf("%s: %s(%v) = %v %q, want a tool error about %q", tc.name, tc.tool, tc.args, res.IsError, text(res), tc.want)
		default:
			t.Logf("%s: %s", tc.name, text(res))
		}
	}
	var agents struct{ Agents []struct{ Name string } }
	call(t, cs, "list_agents", nil, &agents)
	if len(agents.Agents) != 1 {
		t.Errorf("after the bad calls, list_agents = %+v", agents)
	}
}

// TestMCPDaemonDown runs hearth mcp with no daemon: it says so on
// stderr, answers every tool call with an error that says to start it,
// and ends cleanly when the client goes.
func TestMCPDaemonDown(t *testing.T) {
	config := filepath.Join(t.TempDir(), "hearth.toml")
	os.WriteFile(config, []byte(fmt.Sprintf("state_dir = %q\n", filepath.Dir(config))), 0o644)
	cmd := exec.Command(buildHearth(t), "mcp", "--config", config)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cs := connect(t, &mcpsdk.CommandTransport{Command: cmd})
	for _, tool := range []string{"list_agents", "list_sessions"} {
		res, err := cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: tool, Arguments: map[string]any{}})
		if err != nil || !res.IsError || !strings.Contains(text(res), "start it with 'hearth up'") {
			t.Errorf("%s = %+v, %v; want a tool error saying to start the daemon", tool, res, err)
		}
	}
	if _, err := cs.ListResources(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("ListResources = %v, want an error saying the daemon is not running", err)
	}
	if err := cs.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("hearth mcp ended %v (stderr %q), want exit 0 when the client closes", cmd.ProcessState, stderr.String())
	}
	if !strings.Contains(stderr.String(), "hearth mcp: the hearth daemon is not running") {
		t.Errorf("stderr %q, want it to say the daemon is not running", stderr.String())
	}
}
