package appliance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/agents/store"
	evstream "hearth/agents/stream"
	"hearth/appliance/appliancetest"
	"hearth/client"
	"hearth/vmm"
)

// These tests start a real daemon whose agents run for real: the real
// claude CLI in jail machines of the claude-code image, through the
// daemon's metering gateway, against the scripted model (agents/modeltest)
// as the provider.

// analystTOML is the agent the tests delegate to; the built-in price
// table prices its model at $3 per million input tokens, $15 output.
const analystTOML = `description = "Analyses data files and writes a report."
image = "claude-code"
model = "claude-sonnet-4-5"
outputs = ["outputs/*.md"]

[limits]
usd = 5.0
turns = 20
wall_time = "10m"
`

type agentEnv struct {
	d     *Daemon
	c     *Client
	cfg   Config
	model *modeltest.Server
}

// startAgentDaemon starts a daemon with the analyst agent and script as
// the provider; edit, if not nil, changes the config first.
func startAgentDaemon(t testing.TB, script modeltest.Config, edit func(*Config)) *agentEnv {
	t.Helper()
	cfg := agentConfig(t)
	appliancetest.LinkImages(t, cfg.StateDir, appliancetest.ClaudeCodeImages(t))
	model := modeltest.New(script)
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	key := filepath.Join(t.TempDir(), "api-key")
	os.WriteFile(key, []byte(model.Key()+"\n"), 0o600)
	cfg.Model = ModelConfig{Upstream: model.URL(), APIKeyFile: key}
	cfg.Agents.Grace = Duration(3 * time.Second)
	os.MkdirAll(cfg.AgentsDir(), 0o755)
	if err := os.WriteFile(filepath.Join(cfg.AgentsDir(), "analyst.toml"), []byte(analystTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&cfg)
	}
	d, c := startSandboxDaemon(t, cfg)
	return &agentEnv{d: d, c: c, cfg: cfg, model: model}
}

// bashTurn is a turn that runs command with Claude Code's Bash tool. A
// command that is only a long sleep ("sleep 30") is refused by the CLI
// at once, with a hint to run it in the background: a test that needs
// the agent to stay in its tool call sleeps after another command
// ("echo busy; sleep 30").
func bashTurn(command string, usage modeltest.Usage) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.ToolUse("Bash", map[string]string{"command": command, "description": "step"})}, Usage: usage}
}

func textTurn(text string) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text(text)}, Usage: modeltest.Usage{InputTokens: 1000, OutputTokens: 100}}
}

// allEvents pages through an execution's events.
func allEvents(t *testing.T, c *Client, id string) []Event {
	t.Helper()
	var out []Event
	var after int64
	for {
		page, err := c.Events(context.Background(), id, after, 2)
		if err != nil {
			t.Fatalf("Events(%s, %d) = %v", id, after, err)
		}
		out = append(out, page.Events...)
		if page.Ended || len(page.Events) == 0 {
			return out
		}
		after = page.NextAfter
	}
}

func eventDump(evs []Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%d %s %s\n", e.Seq, e.Type, e.Payload)
	}
	return b.String()
}

func countEvents(evs []Event, typ, contains string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ && strings.Contains(string(e.Payload), contains) {
			n++
		}
	}
	return n
}

// TestAgentsDelegate delegates a task and waits for it: inputs in, the
// agent's tool call, file write and answer as events, the cost metered,
// the report downloadable, and nothing outside outputs/ reachable.
func TestAgentsDelegate(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("mkdir -p outputs/charts && awk -F, 'NR>1{s+=$2} END{print \"# Q2\\n\\ntotal \" s}' inputs/q2.csv > outputs/report.md && "+
			"echo chart > outputs/charts/a.svg && echo secret > .home/secret && ln -s ../.home/secret outputs/link.md && cat outputs/report.md",
			modeltest.Usage{InputTokens: 1000, OutputTokens: 100}),
		textTurn("Wrote outputs/report.md: total 30"),
	}}, nil)
	ctx := context.Background()
	c := env.c

	defs, err := c.Agents(ctx)
	if err != nil || len(defs) != 1 || defs[0].Name != "analyst" || defs[0].Limits.Usd != 5 || defs[0].Limits.WallTime != "10m0s" {
		t.Fatalf("Agents = %+v, %v", defs, err)
	}
	e, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "Analyze Q2 sales", Wait: true,
		Inputs: map[string][]byte{"q2.csv": []byte("region,revenue\nnorth,10\nsouth,20\n")}, Limits: Limits{Usd: 1}})
	if err != nil {
		t.Fatalf("Delegate = %v", err)
	}
	evs := allEvents(t, c, e.Id)
	// 2 turns: $0.003 + $0.0015 each.
	if e.Status != "completed" || e.Turns != 2 || e.Tokens.Input != 2000 || e.Tokens.Output != 200 || e.Usd < 0.00899 || e.Usd > 0.00901 ||
		e.Result != "Wrote outputs/report.md: total 30" || e.Limits.Usd != 1 || e.Limits.Turns != 20 || e.Ended == nil {
		t.Errorf("execution = %+v\nevents:\n%s", e, eventDump(evs))
	}
	if !slices.Contains(e.Outputs, "outputs/report.md") || slices.Contains(e.Outputs, "outputs/link.md") {
		t.Errorf("outputs = %q, want outputs/report.md and not the link", e.Outputs)
	}
	for _, want := range []struct{ typ, contains string }{
		{"status", `"running"`}, {"tool_call", `"Bash"`}, {"tool_result", "total 30"}, {"file", "outputs/report.md"},
		{"model_call", `"status":200`}, {"text", "total 30"}, {"status", `"completed"`},
	} {
		if countEvents(evs, want.typ, want.contains) == 0 {
			t.Errorf("no %s event with %s\nevents:\n%s", want.typ, want.contains, eventDump(evs))
		}
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) || ev.Execution != e.Id || ev.Session != e.Session {
			t.Fatalf("event %d = seq %d of %s/%s, want seq %d of %s/%s", i, ev.Seq, ev.Session, ev.Execution, i+1, e.Session, e.Id)
		}
	}

	files, err := c.Outputs(ctx, e.Id)
	var paths []string
	for _, f := range files {
		paths = append(paths, fmt.Sprintf("%s:%v", f.Path, f.Matched))
	}
	if err != nil || strings.Join(paths, " ") != "outputs/charts/a.svg:false outputs/report.md:true" {
		t.Errorf("Outputs = %q, %v; want the chart and the report (matched), no link", paths, err)
	}
	var b bytes.Buffer
	if _, err := c.DownloadOutput(ctx, e.Id, "outputs/report.md", &b); err != nil || b.String() != "# Q2\n\ntotal 30\n" {
		t.Errorf("DownloadOutput(report.md) = %q, %v", b.String(), err)
	}
	b.Reset()
	if _, err := c.DownloadOutput(ctx, e.Id, "charts/a.svg", &b); err != nil || b.String() != "chart\n" {
		t.Errorf("DownloadOutput(charts/a.svg), a '/' in the path = %q, %v", b.String(), err)
	}
	os.WriteFile(filepath.Join(env.cfg.Workspace.Mount, "neighbour-secret.txt"), []byte("no"), 0o644)
	runErrorCases(t, []errorCase{
		{"traversal", func() error { _, err := c.DownloadOutput(ctx, e.Id, "../.home/secret", io.Discard); return err }, "bad_request", 400, "under outputs/"},
		{"traversal out of the session", func() error {
			_, err := c.DownloadOutput(ctx, e.Id, "../../neighbour-secret.txt", io.Discard)
			return err
		}, "bad_request", 400, "under outputs/"},
		{"absolute", func() error { _, err := c.DownloadOutput(ctx, e.Id, "/etc/passwd", io.Discard); return err }, "bad_request", 400, "under outputs/"},
		{"symbolic link", func() error { _, err := c.DownloadOutput(ctx, e.Id, "link.md", io.Discard); return err }, "bad_request", 400, "symbolic link"},
		{"directory", func() error { _, err := c.DownloadOutput(ctx, e.Id, "charts", io.Discard); return err }, "bad_request", 400, "not a regular file"},
		{"missing", func() error { _, err := c.DownloadOutput(ctx, e.Id, "nope.md", io.Discard); return err }, "not_found", 404, "no file outputs/nope.md"},
		{"unknown execution", func() error { _, err := c.Execution(ctx, "exec-00000000"); return err }, "not_found", 404, "exec-00000000"},
		{"unknown agent", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "nobody", Prompt: "go"})
			return err
		}, "not_found", 404, `no agent "nobody": the agents are analyst`},
		{"loosening limit", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{Usd: 50, WallTime: "1h"}})
			return err
		}, "bad_request", 400, "may only tighten its agent's limits: budget $50.00 is more than the agent's $5.00\ntimeout 1h0m0s is more than the agent's 10m0s"},
		{"bad wall time", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{WallTime: "soon"}})
			return err
		}, "bad_request", 400, "limits.wall_time"},
		{"empty prompt", func() error { _, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst"}); return err }, "bad_request", 400, "prompt is empty"},
		{"input with a path", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Inputs: map[string][]byte{"../x": nil}})
			return err
		}, "bad_request", 400, "plain file name"},
		{"output outside outputs", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Outputs: []string{"../*"}})
			return err
		}, "bad_request", 400, "under outputs/"},
		{"mcp server outside the network list", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", McpServers: []client.MCPServer{{Name: "web", Url: "https://mcp.example.com/mcp"}}})
			return err
		}, "bad_request", 400, "agent analyst: mcp_servers \"web\": url = \"https://mcp.example.com/mcp\": the machine reaches it through the egress proxy, and mcp.example.com is not in the agent's network list: add mcp.example.com to network"},
		{"mcp server named hearth", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", McpServers: []client.MCPServer{{Name: "hearth", Command: []string{"x"}}}})
			return err
		}, "bad_request", 400, "Hearth's own server"},
		{"skill outside the agents directory", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Skills: []string{"../skills"}})
			return err
		}, "bad_request", 400, "skills: \"../skills\": give a clean path inside"},
		{"context into outputs", func() error {
			_, err := c.Resume(ctx, e.Session, ResumeRequest{Prompt: "go", Context: []client.ContextFile{{Text: "x", To: "outputs/x.md"}}})
			return err
		}, "bad_request", 400, "not in outputs/"},
		{"unknown session", func() error {
			_, err := c.Resume(ctx, "session-000000", ResumeRequest{Prompt: "go"})
			return err
		}, "not_found", 404, "session-000000"},
		{"bad status filter", func() error { _, err := c.Executions(ctx, ExecutionFilter{Status: []string{"done"}}); return err }, "bad_request", 400, "status \"done\""},
		{"cancel an ended execution", func() error { _, err := c.Cancel(ctx, e.Id); return err }, "conflict", 409, "already ended"},
		{"top up an ended execution", func() error { _, err := c.TopUp(ctx, e.Id, 1); return err }, "conflict", 409, "already ended"},
		{"top up nothing", func() error { _, err := c.TopUp(ctx, e.Id, 0); return err }, "bad_request", 400, "positive number of dollars"},
		{"top up NaN-like", func() error { _, err := c.TopUp(ctx, e.Id, -3); return err }, "bad_request", 400, "positive number of dollars"},
		{"top up no execution", func() error { _, err := c.TopUp(ctx, "exec-00000000", 1); return err }, "not_found", 404, "exec-00000000"},
		{"bad on_budget", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{OnBudget: "later"}})
			return err
		}, "bad_request", 400, "on_budget"},
	})
	if n := len(env.model.MessageRequests()); n != 2 {
		t.Errorf("the provider got %d requests, want 2: a refused task must not reach it", n)
	}
	list, err := c.Executions(ctx, ExecutionFilter{Agent: "analyst", Status: []string{"completed"}})
	if err != nil || len(list) != 1 || list[0].Id != e.Id {
		t.Errorf("Executions(completed) = %+v, %v", list, err)
	}
	sessions, err := c.AgentSessions(ctx, AgentSessionFilter{})
	if err != nil || len(sessions) != 1 || sessions[0].Id != e.Session || sessions[0].LastExecution != e.Id {
		t.Errorf("AgentSessions = %+v, %v", sessions, err)
	}
}

// rawGet sends a GET over the daemon's socket, for what the client does
// not send.
func rawGet(t *testing.T, cfg Config, path string, header http.Header) (*http.Response, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", cfg.SocketPath())
	}}}
	req, _ := http.NewRequest("GET", "http://hearth"+path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestAgentsDetachedStream delegates without waiting and follows the
// execution's events live over SSE: they arrive while it runs; a client
// that stops and comes back with Last-Event-ID gets the rest, each event
// once; an ended execution's stream replays and ends.
func TestAgentsDetachedStream(t *testing.T) {
	slow := bashTurn("sleep 2; echo slept", modeltest.Usage{InputTokens: 100})
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("echo first", modeltest.Usage{InputTokens: 100}), slow, textTurn("done"),
	}}, nil)
	ctx := context.Background()
	start := time.Now()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "take your time"})
	if err != nil || time.Since(start) > 5*time.Second || Ended(e) || e.Id == "" {
		t.Fatalf("Delegate without wait = %+v, %v after %v; want it accepted at once", e, err, time.Since(start))
	}
	// Follow until the first tool result, then stop.
	var first []Event
	errStop := errors.New("stop")
	err = env.c.FollowEvents(ctx, e.Id, 0, func(ev Event) error {
		first = append(first, ev)
		if ev.Type == "tool_result" {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) {
		t.Fatalf("FollowEvents = %v, want the callback's error", err)
	}
	if now, _ := env.c.Execution(ctx, e.Id); Ended(now) {
		t.Fatalf("the execution had ended (%s) when its first tool result arrived: the stream was not live", now.Status)
	}
	// Resume after the last event received, as Last-Event-ID.
	last := first[len(first)-1].Seq
	var rest []Event
	if err := env.c.FollowEvents(ctx, e.Id, last, func(ev Event) error { rest = append(rest, ev); return nil }); err != nil {
		t.Fatalf("FollowEvents after %d = %v", last, err)
	}
	all := append(first, rest...)
	for i, ev := range all {
		if ev.Seq != int64(i+1) {
			t.Fatalf("events through the two streams: seq %d at %d, want no gap and no repeat\n%s", ev.Seq, i, eventDump(all))
		}
	}
	if !FinalEvent(all[len(all)-1]) || !strings.Contains(string(all[len(all)-1].Payload), `"completed"`) {
		t.Errorf("last event = %s %s, want the completed status", all[len(all)-1].Type, all[len(all)-1].Payload)
	}
	stored := allEvents(t, env.c, e.Id)
	if len(stored) != len(all) {
		t.Errorf("streamed %d events, stored %d", len(all), len(stored))
	}
	// An ended execution: the stream replays from Last-Event-ID and ends.
	resp, body := rawGet(t, env.cfg, "/v1/executions/"+e.Id+"/events", http.Header{"Accept": {"text/event-stream"}, "Last-Event-Id": {fmt.Sprint(len(all) - 2)}})
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" ||
		strings.Count(body, "\nid: ") != 1 || !strings.HasPrefix(body, fmt.Sprintf("id: %d\n", len(all)-1)) {
		t.Errorf("SSE of an ended execution after %d: %d %s\n%s", len(all)-2, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	resp, body = rawGet(t, env.cfg, "/v1/executions/"+e.Id+"/events?after=1&limit=2", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `"seq":2`) || !strings.Contains(body, `"seq":3`) || strings.Contains(body, `"seq":4`) || !strings.Contains(body, `"next_after":3`) {
		t.Errorf("JSON page after 1, limit 2: %d %s", resp.StatusCode, body)
	}
	resp, body = rawGet(t, env.cfg, "/v1/executions/nope/events", http.Header{"Accept": {"text/event-stream"}})
	if resp.StatusCode != 404 || !strings.Contains(body, "not_found") {
		t.Errorf("SSE of an unknown execution: %d %s", resp.StatusCode, body)
	}
}

// TestAgentsCancelRetryResume cancels an execution mid-task (it ends
// cancelled with its partial output), retries it (a new execution in the
// same session that completes), and resumes the session with a new
// prompt (the agent keeps its conversation).
func TestAgentsCancelRetryResume(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("mkdir -p outputs && echo partial > outputs/draft.md && sleep 60", modeltest.Usage{InputTokens: 100}),
		textTurn("retried and done"),
		textTurn("resumed and done"),
	}}, nil)
	ctx := context.Background()
	c := env.c
	e, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "draft a report"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, c, e.Id, "file") // the draft is written; now it sleeps
	_, err = c.Resume(ctx, e.Session, ResumeRequest{Prompt: "meanwhile"})
	wantCode(t, err, "conflict", 409)
	start := time.Now()
	cancelled, err := c.Cancel(ctx, e.Id)
	if err != nil || cancelled.Status != "cancelled" || time.Since(start) > 15*time.Second {
		t.Fatalf("Cancel = %+v, %v after %v; want cancelled within the grace period", cancelled, err, time.Since(start))
	}
	if !slices.Contains(cancelled.Outputs, "outputs/draft.md") {
		t.Errorf("cancelled outputs = %q, want the partial outputs/draft.md kept", cancelled.Outputs)
	}
	if evs := allEvents(t, c, e.Id); !FinalEvent(evs[len(evs)-1]) || !strings.Contains(string(evs[len(evs)-1].Payload), "cancelled") {
		t.Errorf("last event = %s", eventDump(evs[len(evs)-1:]))
	}
	retried, err := c.Retry(ctx, e.Id, true)
	if err != nil || retried.Status != "completed" || retried.Kind != "retry" || retried.Previous != e.Id || retried.Session != e.Session ||
		retried.Prompt != "draft a report" || retried.Result != "retried and done" {
		t.Fatalf("Retry = %+v, %v", retried, err)
	}
	resumed, err := c.Resume(ctx, e.Session, ResumeRequest{Prompt: "now add a summary", Wait: true})
	if err != nil || resumed.Status != "completed" || resumed.Kind != "resume" || resumed.Previous != retried.Id || resumed.Result != "resumed and done" {
		t.Fatalf("Resume = %+v, %v", resumed, err)
	}
	reqs := env.model.MessageRequests()
	if body := string(reqs[len(reqs)-1].Body); !strings.Contains(body, "retried and done") || !strings.Contains(body, "now add a summary") {
		t.Errorf("the resumed execution's request lacks the session's conversation: %.300s", body)
	}
	_, err = c.Retry(ctx, "exec-00000000", false)
	wantCode(t, err, "not_found", 404)
}

// waitForEvent follows an execution until an event of type typ.
func waitForEvent(t *testing.T, c *Client, id, typ string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	found := errors.New("found")
	err := c.FollowEvents(ctx, id, 0, func(ev Event) error {
		if ev.Type == typ {
			return found
		}
		return nil
	})
	if !errors.Is(err, found) {
		t.Fatalf("waiting for a %s event of %s: %v", typ, id, err)
	}
}

// TestAgentsCredits: with credits enabled a task needs a budget the
// balance covers; added credits let it run, and it is charged exactly what
// the gateway metered.
func TestAgentsCredits(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{textTurn("done")}},
		func(cfg *Config) { cfg.Credits.Enabled = true })
	ctx := context.Background()
	c := env.c
	_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{Usd: 1}, Wait: true})
	wantCode(t, err, "insufficient_credits", 402)
	if !strings.Contains(err.Error(), "hearth credits add") {
		t.Errorf("error %q, want it to say how to add credits", err)
	}
	_, err = c.AddCredits(ctx, -1, "")
	wantCode(t, err, "bad_request", 400)
	cr, err := c.AddCredits(ctx, 2, "test budget")
	if err != nil || !cr.Enabled || cr.Available != 2 || len(cr.Entries) != 1 || cr.Entries[0].Note != "test budget" {
		t.Fatalf("AddCredits = %+v, %v", cr, err)
	}
	e, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{Usd: 1}, Wait: true})
	if err != nil || e.Status != "completed" {
		t.Fatalf("Delegate with credits = %+v, %v", e, err)
	}
	cr, err = c.Credits(ctx)
	want := 2 - 0.0045
	if err != nil || cr.Reserved != 0 || cr.Spent < 0.00449 || cr.Spent > 0.00451 || cr.Available < want-1e-6 || cr.Available > want+1e-6 {
		t.Errorf("Credits after = %+v, %v; want $%.4f available, $0.0045 spent", cr, err, want)
	}
	if len(env.model.MessageRequests()) != 1 {
		t.Errorf("the provider got %d requests, want 1", len(env.model.MessageRequests()))
	}
}

// TestAgentsUnavailable: without an API key the daemon starts, reads
// work, and a delegation says what is missing.
func TestAgentsUnavailable(t *testing.T) {
	cfg := agentConfig(t)
	cfg.Model = ModelConfig{Upstream: "https://api.anthropic.com", APIKeyEnv: "HEARTH_TEST_NO_SUCH_KEY"}
	_, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go"})
	wantCode(t, err, "unavailable", 503)
	if !strings.Contains(err.Error(), "HEARTH_TEST_NO_SUCH_KEY") {
		t.Errorf("error %q, want it to name the variable", err)
	}
	if list, err := c.Executions(ctx, ExecutionFilter{}); err != nil || len(list) != 0 {
		t.Errorf("Executions = %v, %v", list, err)
	}
	if cr, err := c.Credits(ctx); err != nil || cr.Enabled {
		t.Errorf("Credits = %+v, %v", cr, err)
	}
}

// TestAgentsInterruptedAtStart: executions a daemon left running (it
// died) end interrupted when the next one starts, with a status event
// after the events they had, the partial outputs their agent's patterns
// match, and their machines destroyed.
func TestAgentsInterruptedAtStart(t *testing.T) {
	cfg := sandboxConfig(t)
	os.MkdirAll(cfg.AgentsDir(), 0o755)
	os.WriteFile(filepath.Join(cfg.AgentsDir(), "analyst.toml"), []byte(analystTOML), 0o644)
	os.WriteFile(filepath.Join(cfg.AgentsDir(), "tinyagent.toml"), []byte("image = \"tiny\"\nmodel = \"claude-haiku-4-5\"\n"), 0o644)
	cfg.Model.APIKeyEnv = "HEARTH_TEST_NO_SUCH_KEY"
	d, c := startSandboxDaemon(t, cfg)
	ctx := context.Background()
	if err := c.CreateSession(ctx, "session-cut"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(cfg.Workspace.Mount, "session-cut", "outputs", "partial.md"), []byte("half"), 0o644)
	st := d.agents.store
	sess, err := st.CreateSession(ctx, store.Session{ID: "session-cut", Agent: "analyst"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := st.CreateExecution(ctx, store.Execution{Session: sess.ID, Prompt: "long task"})
	if err == nil {
		_, err = st.UpdateExecution(ctx, e.ID, func(x *store.Execution) error { x.Status = store.Running; return nil })
	}
	if err == nil {
		_, err = st.Append(ctx, evstream.New(sess.ID, e.ID, evstream.Text, map[string]string{"text": "working"}))
	}
	if err != nil {
		t.Fatal(err)
	}
	// The machine the execution ran in, still running when its daemon died.
	img, err := d.images.resolve("tiny")
	if err != nil {
		t.Fatal(err)
	}
	// An execution of an agent on the tiny image holds that image.
	tinySess, err := st.CreateSession(ctx, store.Session{Agent: "tinyagent"})
	if err == nil {
		_, err = st.CreateExecution(ctx, store.Execution{Session: tinySess.ID, Prompt: "x"})
	}
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.RemoveImage(ctx, "tiny"), "conflict", 409)
	m, err := d.driver.Create(ctx, vmm.Spec{ID: e.ID, RootFS: img.Rootfs(), UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	m.Guest().Close() // as the death of its daemon would
	d.Close()

	d, c = startSandboxDaemon(t, cfg)
	got, err := c.Execution(ctx, e.ID)
	if err != nil || got.Status != "interrupted" || got.Ended == nil || !strings.Contains(got.Error, "daemon stopped") ||
		strings.Join(got.Outputs, ",") != "outputs/partial.md" {
		t.Errorf("after a restart: %+v, %v; want interrupted with its partial output", got, err)
	}
	evs := allEvents(t, c, e.ID)
	if len(evs) != 2 || evs[0].Type != "text" || !FinalEvent(evs[1]) || !strings.Contains(string(evs[1].Payload), `"interrupted"`) {
		t.Errorf("events after a restart:\n%s\nwant the one it had and the interrupted status", eventDump(evs))
	}
	if ids, _ := d.driver.List(ctx); slices.Contains(ids, e.ID) {
		t.Errorf("machines after the restart = %q: the interrupted execution's is still there", ids)
	}
}

// TestAgentsConfigErrors: a key file or price table named in the config
// that cannot be read stops the daemon from starting, saying which key.
func TestAgentsConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		model      ModelConfig
	}{
		{"missing key file", "model.api_key_file", ModelConfig{Upstream: "http://127.0.0.1:9", APIKeyFile: "/nonexistent/key"}},
		{"bad price table", "model.prices", ModelConfig{Upstream: "http://127.0.0.1:9", Prices: "/nonexistent/prices.toml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := agentConfig(t)
			cfg.Model = tc.model
			d, err := Start(context.Background(), cfg, testLogger(t))
			if err == nil {
				d.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want an error naming %s", err, tc.want)
			}
			if _, err := os.Stat(cfg.SocketPath()); err == nil {
				t.Errorf("the API socket is left after a failed start")
			}
		})
	}
}

// TestAgentsCloseCancels: a daemon that stops cancels its running
// executions; a follower sees the final event before its stream ends, and
// the next daemon shows them cancelled, not interrupted.
func TestAgentsCloseCancels(t *testing.T) {
	before := runtime.NumGoroutine()
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{bashTurn("echo busy; sleep 60", modeltest.Usage{InputTokens: 100})}}, nil)
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, env.c, e.Id, "tool_call")
	followed := make(chan error, 1)
	var last Event
	go func() { followed <- env.c.FollowEvents(ctx, e.Id, 0, func(ev Event) error { last = ev; return nil }) }()
	time.Sleep(200 * time.Millisecond)
	if err := env.d.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if err := <-followed; err != nil || !FinalEvent(last) || !strings.Contains(string(last.Payload), "cancelled") {
		t.Errorf("FollowEvents while the daemon stopped = %v, last event %s", err, last.Payload)
	}
	// Every goroutine of the daemon (executions, gateway, streams) is gone.
	env.model.Close()
	env.c.HTTP().CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after Close, %d before the daemon started:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	_, c := startSandboxDaemon(t, env.cfg)
	if got, err := c.Execution(ctx, e.Id); err != nil || got.Status != "cancelled" {
		t.Errorf("after the restart: %+v, %v; want cancelled", got, err)
	}
}

// TestAgentsShutdownFinish: under on_shutdown = "finish" a stopping
// daemon refuses new executions but lets a running one complete; Hurry
// stops the one still running at once, and it ends cancelled.
func TestAgentsShutdownFinish(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("sleep 2; echo done > outputs/done.md", modeltest.Usage{InputTokens: 100}), textTurn("finished")}},
		func(c *Config) { c.Agents.OnShutdown = OnShutdownFinish })
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "work"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, env.c, e.Id, "tool_call")
	closed := make(chan error, 1)
	go func() { closed <- env.d.Close() }()
	// New work is refused while the running one goes on.
	var refused error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, refused = env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "more"}); refused != nil {
			break
		}
	}
	var ae *client.APIError
	if !errors.As(refused, &ae) || ae.Status != http.StatusServiceUnavailable {
		t.Errorf("Delegate while stopping = %v, want 503 the daemon is stopping", refused)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	_, c := startSandboxDaemon(t, env.cfg)
	got, err := c.Execution(ctx, e.Id)
	if err != nil || got.Status != "completed" || got.Result != "finished" || !slices.Contains(got.Outputs, "outputs/done.md") {
		t.Fatalf("after a finish shutdown: %+v, %v; want it completed with its output", got, err)
	}

	// A second daemon with a task that would run for a minute: Hurry
	// cuts the wait short.
	env2 := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{bashTurn("echo busy; sleep 60", modeltest.Usage{InputTokens: 100})}},
		func(c *Config) { c.Agents.OnShutdown = OnShutdownFinish })
	e2, err := env2.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, env2.c, e2.Id, "tool_call")
	closed2 := make(chan error, 1)
	go func() { closed2 <- env2.d.Close() }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-closed2:
		t.Fatalf("Close returned (%v) while the execution ran, under finish", err)
	default:
	}
	env2.d.Hurry()
	select {
	case err := <-closed2:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return after Hurry")
	}
	_, c2 := startSandboxDaemon(t, env2.cfg)
	if got, err := c2.Execution(ctx, e2.Id); err != nil || got.Status != "cancelled" {
		t.Errorf("after Hurry: %+v, %v; want cancelled", got, err)
	}
}

// TestAgentsShutdownLeave: under on_shutdown = "leave" a stopping daemon
// leaves a running agent in its machine; the next daemon on the same
// state takes it up, and it completes with its output, every turn
// metered once, and its credits settled.
func TestAgentsShutdownLeave(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("sleep 3; echo slept", modeltest.Usage{InputTokens: 100}),
		bashTurn("mkdir -p outputs; echo done > outputs/left.md", modeltest.Usage{InputTokens: 200}),
		textTurn("finished")}},
		func(c *Config) { c.Agents.OnShutdown = OnShutdownLeave; c.Credits.Enabled = true })
	ctx := context.Background()
	if _, err := env.c.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "work", Limits: Limits{Usd: 2}})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, env.c, e.Id, "tool_call")
	t0 := time.Now()
	if err := env.d.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 10*time.Second {
		t.Errorf("Close took %v with an execution left running", took)
	}
	_, c := startSandboxDaemon(t, env.cfg)
	var got Execution
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, err = c.Execution(ctx, e.Id); err != nil || Ended(got) || time.Now().After(deadline) {
			break
		}
	}
	evs := allEvents(t, c, e.Id)
	if err != nil || got.Status != "completed" || got.Result != "finished" || got.Turns != 3 || got.Tokens.Input != 1300 ||
		!slices.Contains(got.Outputs, "outputs/left.md") {
		t.Fatalf("after the next start: %+v, %v\n%s", got, err, eventDump(evs))
	}
	if countEvents(evs, "status", `"detached"`) != 1 || countEvents(evs, "status", `"reattached":true`) != 1 || countEvents(evs, "model_call", `"status":200`) != 3 {
		t.Errorf("want one detach, one take-up and three model calls:\n%s", eventDump(evs))
	}
	// Call snapshots go on numbering under the next daemon.
	for n := 1; n <= 3; n++ {
		if countEvents(evs, "model_call", fmt.Sprintf(`"snapshot":"%s.call-%d"`, e.Id, n)) != 1 {
			t.Errorf("no model_call event names snapshot call-%d\n%s", n, eventDump(evs))
		}
	}
	if n := countEvents(evs, "error", "snapshot"); n != 0 {
		t.Errorf("%d error events about snapshots\n%s", n, eventDump(evs))
	}
	cr, _ := c.Credits(ctx)
	if cr.Reserved != 0 || math.Abs(cr.Spent-got.Usd) > 1e-9 || math.Abs(cr.Available-(10-got.Usd)) > 1e-9 {
		t.Errorf("credits after the run: %+v, want $%.4f spent and nothing reserved", cr, got.Usd)
	}
}

// TestAgentsShutdownLeaveMidCall: a daemon stopped under on_shutdown =
// "leave" while a model answer is streaming (slowly) lets it finish:
// the agent gets it whole and does not retry it, it is metered once and
// not cut, and the execution goes on under the next daemon to its end.
func TestAgentsShutdownLeaveMidCall(t *testing.T) {
	slow := bashTurn("mkdir -p outputs; echo done > outputs/left.md", modeltest.Usage{InputTokens: 200, OutputTokens: 102})
	slow.Delay = 400 * time.Millisecond // about 4 s for the whole answer
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("echo started", modeltest.Usage{InputTokens: 100}), slow, textTurn("finished")}},
		func(c *Config) { c.Agents.OnShutdown = OnShutdownLeave; c.Credits.Enabled = true })
	ctx := context.Background()
	if _, err := env.c.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "work", Limits: Limits{Usd: 2}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); len(env.model.MessageRequests()) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the slow call never came: %d calls", len(env.model.MessageRequests()))
		}
	}
	t0 := time.Now()
	if err := env.d.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	_, c := startSandboxDaemon(t, env.cfg)
	var got Execution
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if got, err = c.Execution(ctx, e.Id); err != nil || Ended(got) || time.Now().After(deadline) {
			break
		}
	}
	evs := allEvents(t, c, e.Id)
	if err != nil || got.Status != "completed" || got.Turns != 3 || got.Tokens.Output != 102+100 {
		t.Fatalf("after the next start: %+v, %v\n%s", got, err, eventDump(evs))
	}
	if n := len(env.model.MessageRequests()); n != 3 || countEvents(evs, "model_call", `"status":200`) != 3 ||
		countEvents(evs, "model_call", `"cut":true`) != 0 || countEvents(evs, "model_call", `"status":499`) != 0 {
		t.Errorf("%d calls reached the provider; want 3, each metered once and none cut (Close took %v)\n%s", n, took, eventDump(evs))
	}
	if took < time.Second || took > time.Minute {
		t.Errorf("Close took %v: want it to wait for the answer in flight (seconds), and no longer", took)
	}
	cr, _ := c.Credits(ctx)
	if cr.Reserved != 0 || math.Abs(cr.Spent-got.Usd) > 1e-9 {
		t.Errorf("credits after the run: %+v, want $%.4f spent and nothing reserved", cr, got.Usd)
	}
}

// TestAgentsNetwork: the daemon's egress proxy is in the agent's path: a
// domain outside the definition's network list is refused with a 403
// that names the list, and the refusal is in the execution's stream.
func TestAgentsNetwork(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("curl -sS http://denied.test/ 2>&1; echo; env | grep -c '^HTTPS_PROXY=http://exec:'", modeltest.Usage{InputTokens: 100}),
		textTurn("done"),
	}}, func(cfg *Config) {
		os.WriteFile(filepath.Join(cfg.AgentsDir(), "analyst.toml"), []byte("network = [\"allowed.test\"]\n"+analystTOML), 0o644)
	})
	e, err := env.c.Delegate(context.Background(), DelegateRequest{Agent: "analyst", Prompt: "fetch", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, env.c, e.Id)
	if countEvents(evs, "network", `"host":"denied.test"`) != 1 || countEvents(evs, "network", `"allowed":false`) != 1 ||
		countEvents(evs, "tool_result", "network list") != 1 {
		t.Errorf("a request to an unlisted domain: want a refusal in the stream and in the tool's output\n%s", eventDump(evs))
	}
}

// TestAgentsCallSnapshots: through the daemon (whose gateway records each
// call in the store before it goes on), a three-call task leaves its
// start, call and end snapshots in the session's list as
// agents.call_snapshots = "last 2" keeps them, each call's model_call
// event naming its snapshot.
func TestAgentsCallSnapshots(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn("echo one > outputs/a.txt", modeltest.Usage{InputTokens: 100}),
		bashTurn("echo two > outputs/b.txt", modeltest.Usage{InputTokens: 100}),
		textTurn("done"),
	}}, func(cfg *Config) { cfg.Agents.CallSnapshots = "last 2" })
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "write two files", Wait: true})
	if err != nil || e.Status != "completed" {
		t.Fatalf("Delegate = %+v, %v", e, err)
	}
	evs := allEvents(t, env.c, e.Id)
	for n := 1; n <= 3; n++ {
		if got := countEvents(evs, "model_call", fmt.Sprintf(`"snapshot":"%s.call-%d"`, e.Id, n)); got != 1 {
			t.Errorf("%d model_call events name snapshot call-%d, want 1\n%s", got, n, eventDump(evs))
		}
	}
	list, err := env.c.Snapshots(ctx, e.Session)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	want := []string{e.Id + ".call-2", e.Id + ".call-3", e.Id + ".end", e.Id + ".start"}
	if !slices.Equal(names, want) {
		t.Errorf("session snapshots %q, want %q", names, want)
	}
}
