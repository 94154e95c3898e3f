package agents

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// factsServer is a stdio MCP server in node (the claude-code image has
// node): one tool, lookup, whose answer names the key it was given and
// the FACT_SECRET its configuration's env gave it. It answers initialize
// after FACT_DELAY_MS, as a slow server would.
const factsServer = `const rl = require('readline').createInterface({ input: process.stdin });
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
rl.on('line', (line) => {
  let m;
  try { m = JSON.parse(line); } catch (e) { return; }
  if (m.method === 'initialize') {
    setTimeout(() => send({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: 'facts', version: '1.0.0' } } }), Number(process.env.FACT_DELAY_MS || 0));
  } else if (m.method === 'tools/list') {
    send({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'lookup', description: 'Looks up a fact by key',
      inputSchema: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] } }] } });
  } else if (m.method === 'tools/call') {
    send({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text',
      text: 'fact for ' + m.params.arguments.key + ': ' + process.env.FACT_SECRET }] } });
  } else if (m.id !== undefined) {
    send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no such method' } });
  }
});
`

// withAgentsDir gives the harness's agent an agents directory holding
// files, for its skills and context files.
func withAgentsDir(t *testing.T, h *harness, files map[string]string) (*Definition, string) {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	def := h.runner.cfg.Agents["analyst"]
	def.dir = dir
	return def, dir
}

// startedEvent is the agent_started event of an execution.
func startedEvent(t *testing.T, evs []stream.Event) (p struct {
	MCPServers []struct{ Name, Status string } `json:"mcp_servers"`
	Skills     []string                        `json:"skills"`
}) {
	t.Helper()
	for _, e := range evs {
		if e.Type == stream.Status && strings.Contains(string(e.Payload), `"agent_started"`) {
			if err := json.Unmarshal(e.Payload, &p); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("no agent_started event:\n%s", dump(evs))
	return p
}

// TestRunAgentContext: an agent whose definition lists a stdio MCP
// server, a skill and two context files. The CLI starts the server (the
// init line shows it connected), calls its tool when the model asks, and
// the tool's answer reaches the model, though the server takes 2 s to
// answer initialize (the CLI waits for it); the skill is listed; both
// CLAUDE.md files reach the model. A resumed session gets them again,
// refreshed from the agents directory, and a task adds a context file of
// its own.
func TestRunAgentContext(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.ToolUse("mcp__facts__lookup", map[string]string{"key": "q2"})}},
		{Blocks: []modeltest.Block{modeltest.Text("looked it up")}},
		{Blocks: []modeltest.Block{modeltest.Text("resumed")}},
	}, Limits{USD: 500}) // not what is checked: room for the hard cap's first-call bound (about $117: harnessOptions.price)
	def, dir := withAgentsDir(t, h, map[string]string{
		"skills/probe/SKILL.md":   "---\nname: hearth-probe\ndescription: Probes the appliance. Use when asked to probe.\n---\n\nRun the probe.\n",
		"skills/probe/ref/how.md": "how to probe\n",
		"context/project.md":      "Project rule: zebra-7731.\n",
		"context/home.md":         "Home rule: okapi-5519.\n",
	})
	def.MCPServers = []MCPServer{{Name: "facts", Command: []string{"node", "inputs/facts-mcp.js"}, Env: map[string]string{"FACT_SECRET": "s3cret-42", "FACT_DELAY_MS": "2000"}}}
	def.Skills = []string{"skills/probe"}
	def.Context = []ContextFile{{File: "context/project.md", To: "CLAUDE.md"}, {File: "context/home.md", To: "~/.claude/CLAUDE.md"}}
	if err := def.validate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "Look up q2",
		Inputs: map[string][]byte{"facts-mcp.js": []byte(factsServer)}})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil || res.Execution.Status != store.Completed || res.Execution.Result != "looked it up" {
		t.Fatalf("Run = %+v, %v\nevents:\n%s", res.Execution, err, dump(evs))
	}
	started := startedEvent(t, evs)
	if len(started.MCPServers) != 1 || started.MCPServers[0].Name != "facts" || started.MCPServers[0].Status != "connected" {
		t.Errorf("the init line's MCP servers = %+v, want facts connected\nevents:\n%s", started.MCPServers, dump(evs))
	}
	if !strings.Contains(","+strings.Join(started.Skills, ",")+",", ",hearth-probe,") {
		t.Errorf("the init line's skills = %q, want hearth-probe among them", started.Skills)
	}
	if countType(evs, stream.ToolCall, `"name":"mcp__facts__lookup"`) != 1 || countType(evs, stream.ToolResult, "fact for q2: s3cret-42") != 1 {
		t.Errorf("want the tool call and its result in the stream\nevents:\n%s", dump(evs))
	}
	reqs := h.model.MessageRequests()
	if len(reqs) != 2 {
		t.Fatalf("%d model requests, want 2", len(reqs))
	}
	if got := reqs[1].LastUserText(); !strings.Contains(got, "fact for q2: s3cret-42") {
		t.Errorf("the second request's last user text = %q, want the MCP tool's answer", got)
	}
	first := string(reqs[0].Body)
	for _, marker := range []string{"zebra-7731", "okapi-5519"} {
		if !strings.Contains(first, marker) {
			t.Errorf("the first request lacks the context file's %q: %.2000s", marker, first)
		}
	}
	if !strings.Contains(first, "mcp__facts__lookup") {
		t.Errorf("the first request does not offer the MCP tool")
	}

	// Resumed: the context is placed again, as the agents directory now has it.
	if err := os.WriteFile(filepath.Join(dir, "context/project.md"), []byte("Project rule: heron-2208.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resumed, err := h.runner.Run(ctx, TaskRequest{Session: res.Execution.Session, Prompt: "Again",
		Context: []ContextFile{{Text: "Task rule: ibis-9034.", To: "docs/CLAUDE.md"}}})
	if err != nil || resumed.Execution.Status != store.Completed {
		t.Fatalf("resume = %+v, %v\n%s", resumed.Execution, err, dump(h.eventsOf(t, resumed.Execution.ID)))
	}
	reqs = h.model.MessageRequests()
	last := string(reqs[len(reqs)-1].Body)
	if !strings.Contains(last, "heron-2208") {
		t.Errorf("the resumed execution's request lacks the refreshed CLAUDE.md: %.2000s", last)
	}
	if started := startedEvent(t, h.eventsOf(t, resumed.Execution.ID)); len(started.MCPServers) != 1 || started.MCPServers[0].Status != "connected" ||
		!strings.Contains(strings.Join(started.Skills, ","), "hearth-probe") {
		t.Errorf("resumed: init line %+v, want the server and the skill again", started)
	}
}

// TestHostileAgentContextReadOnly: the agent cannot change the skills
// and context files it is given, nor its MCP configuration: they belong
// to the machine's root with modes 0444 and 0555. What it does to its
// copies of them does not outlive the execution: the next one gets them
// fresh.
func TestHostileAgentContextReadOnly(t *testing.T) {
	attack := strings.Join([]string{
		"W=$PWD; cd ~/.claude/skills",
		"(echo evil >> probe-skill/SKILL.md) 2>/dev/null && echo WROTE-SKILL",
		"rm -f probe-skill/SKILL.md 2>/dev/null; test -f probe-skill/SKILL.md || echo REMOVED-SKILL",
		"chmod 0666 probe-skill/SKILL.md 2>/dev/null && echo CHMOD-SKILL",
		"mkdir planted 2>/dev/null && echo PLANTED-SKILL",
		"mv probe-skill gone 2>/dev/null && echo MOVED-SKILL",
		"(echo evil >> ~/.hearth/mcp-agent.json) 2>/dev/null && echo WROTE-MCP",
		"(echo evil >> $W/CLAUDE.md) 2>/dev/null && echo WROTE-CONTEXT",
		"cd; rm -rf .claude/skills 2>/dev/null; test -d .claude/skills || echo REMOVED-ALL",
		"stat -c '%u %a %n' .claude/skills/probe-skill/SKILL.md .claude/skills/probe-skill .claude/skills .hearth/mcp-agent.json $W/CLAUDE.md",
		"echo ATTACK-DONE",
	}, "; ")
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{bash(attack)}},
		{Blocks: []modeltest.Block{modeltest.Text("tried")}},
		// The agent owns its home, so it can move the skills directory
		// aside and put its own in its place ...
		{Blocks: []modeltest.Block{bash("cd ~/.claude && mv skills old && mkdir -p skills/probe-skill && echo planted > skills/probe-skill/SKILL.md && echo SWAPPED")}},
		{Blocks: []modeltest.Block{modeltest.Text("swapped")}},
		// ... but the next execution gets the skill as given.
		{Blocks: []modeltest.Block{bash("cat ~/.claude/skills/probe-skill/SKILL.md; ls ~/.claude/skills")}},
		{Blocks: []modeltest.Block{modeltest.Text("checked")}},
	}, Limits{USD: 500}) // not what is checked: room for the hard cap's first-call bound (about $117: harnessOptions.price)
	def, _ := withAgentsDir(t, h, map[string]string{
		"skills/probe/SKILL.md": "---\nname: probe-skill\ndescription: Probes.\n---\nthe real skill\n",
		"context/project.md":    "Project rule.\n",
	})
	def.Skills = []string{"skills/probe"}
	def.Context = []ContextFile{{File: "context/project.md"}}
	def.MCPServers = []MCPServer{{Name: "facts", Command: []string{"node", "inputs/facts-mcp.js"}}}
	ctx := context.Background()
	res, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "attack",
		Inputs: map[string][]byte{"facts-mcp.js": []byte(factsServer)}})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil || res.Execution.Status != store.Completed || countType(evs, stream.ToolResult, "ATTACK-DONE") != 1 {
		t.Fatalf("Run = %+v, %v\n%s", res.Execution, err, dump(evs))
	}
	for _, bad := range []string{"WROTE-SKILL", "REMOVED-SKILL", "CHMOD-SKILL", "PLANTED-SKILL", "MOVED-SKILL", "WROTE-MCP", "WROTE-CONTEXT", "REMOVED-ALL"} {
		if n := countType(evs, stream.ToolResult, bad); n != 0 {
			t.Errorf("the agent could: %s\n%s", bad, dump(evs))
		}
	}
	for _, mode := range []string{"0 444 .claude/skills/probe-skill/SKILL.md", "0 555 .claude/skills/probe-skill", "0 555 .claude/skills", "0 444 .hearth/mcp-agent.json", "0 444 /workspace/agents/"} {
		if countType(evs, stream.ToolResult, mode) != 1 {
			t.Errorf("want %q in the stat output\n%s", mode, dump(evs))
		}
	}
	swap, err := h.runner.Run(ctx, TaskRequest{Session: res.Execution.Session, Prompt: "swap"})
	if err != nil || countType(h.eventsOf(t, swap.Execution.ID), stream.ToolResult, "SWAPPED") != 1 {
		t.Fatalf("swap = %+v, %v\n%s", swap.Execution, err, dump(h.eventsOf(t, swap.Execution.ID)))
	}
	again, err := h.runner.Run(ctx, TaskRequest{Session: res.Execution.Session, Prompt: "check"})
	evs = h.eventsOf(t, again.Execution.ID)
	if err != nil || countType(evs, stream.ToolResult, "the real skill") != 1 || countType(evs, stream.ToolResult, "planted") != 0 {
		t.Errorf("the next execution: %+v, %v; want the skill as given\n%s", again.Execution, err, dump(evs))
	}
}

// TestRunAgentHTTPMCP: an HTTP MCP server outside, listed in the agent's
// network, is reached by the CLI through the egress proxy: its tool's
// answer reaches the model and the proxy's network event records the
// requests. One not in the list is refused at the task. Then an https
// one, through a CONNECT tunnel, its CA given to the CLI as a context
// file that NODE_EXTRA_CA_CERTS names.
func TestRunAgentHTTPMCP(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.ToolUse("mcp__web__whoami", map[string]string{})}},
		{Blocks: []modeltest.Block{modeltest.Text("asked")}},
		{Blocks: []modeltest.Block{modeltest.ToolUse("mcp__tls__whoami", map[string]string{})}},
		{Blocks: []modeltest.Block{modeltest.Text("asked over TLS")}},
	}, Limits{USD: 500}) // not what is checked: room for the hard cap's first-call bound (about $117: harnessOptions.price)
	var calls, headers atomic.Int32
	srv := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "web", Version: "1"}, nil)
	type noArgs struct{}
	mcpsdk.AddTool(srv, &mcpsdk.Tool{Name: "whoami", Description: "Says who answers"},
		func(ctx context.Context, req *mcpsdk.CallToolRequest, _ noArgs) (*mcpsdk.CallToolResult, any, error) {
			calls.Add(1)
			return &mcpsdk.CallToolResult{Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: "answered by the web server outside"}}}, nil, nil
		})
	// The server stands for one outside, reached here on loopback with
	// the outside name as Host: the SDK's guard for servers on localhost
	// would refuse that.
	mcpHandler := mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return srv },
		&mcpsdk.StreamableHTTPOptions{DisableLocalhostProtection: true})
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Team") == "core" {
			headers.Add(1)
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	defer web.Close()
	h.site("mcp.test", 80, web.Listener.Addr().String())
	def := h.runner.cfg.Agents["analyst"]
	def.Network = []string{"mcp.test"}
	ctx := context.Background()
	if _, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "x",
		MCPServers: []MCPServer{{Name: "other", URL: "http://other.test/mcp"}}}); err == nil || !strings.Contains(err.Error(), "add other.test to network") {
		t.Errorf("a task's server outside the network list = %v, want refused", err)
	}
	res, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "ask the web server",
		MCPServers: []MCPServer{{Name: "web", URL: "http://mcp.test/mcp", Headers: map[string]string{"X-Team": "core"}}}})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil || res.Execution.Status != store.Completed {
		t.Fatalf("Run = %+v, %v\n%s", res.Execution, err, dump(evs))
	}
	started := startedEvent(t, evs)
	if len(started.MCPServers) != 1 || started.MCPServers[0].Status != "connected" {
		t.Fatalf("the init line's MCP servers = %+v, want web connected\n%s", started.MCPServers, dump(evs))
	}
	reqs := h.model.MessageRequests()
	if calls.Load() != 1 || len(reqs) != 2 || !strings.Contains(reqs[1].LastUserText(), "answered by the web server outside") {
		t.Errorf("%d tool calls, %d model requests; want the tool's answer in the second\n%s", calls.Load(), len(reqs), dump(evs))
	}
	if headers.Load() == 0 {
		t.Error("the configured header never reached the server")
	}
	if countType(evs, stream.Network, `"host":"mcp.test","port":80,"method":"POST","allowed":true`) == 0 {
		t.Errorf("no network event for the MCP requests through the proxy\n%s", dump(evs))
	}

	tlsWeb := httptest.NewTLSServer(mcpHandler) // its certificate names example.com
	defer tlsWeb.Close()
	h.site("example.com", 443, tlsWeb.Listener.Addr().String())
	def.Network = []string{"mcp.test", "example.com"}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsWeb.Certificate().Raw})
	def.Env = map[string]string{"NODE_EXTRA_CA_CERTS": ".home/test-ca.pem"} // relative to the working directory
	res, err = h.runner.Run(ctx, TaskRequest{Session: res.Execution.Session, Prompt: "ask over TLS",
		MCPServers: []MCPServer{{Name: "tls", URL: "https://example.com/mcp"}},
		Context:    []ContextFile{{Text: string(ca), To: "~/test-ca.pem"}}})
	evs = h.eventsOf(t, res.Execution.ID)
	if err != nil || res.Execution.Status != store.Completed {
		t.Fatalf("Run over TLS = %+v, %v\n%s", res.Execution, err, dump(evs))
	}
	if started := startedEvent(t, evs); len(started.MCPServers) != 1 || started.MCPServers[0].Status != "connected" {
		t.Fatalf("over TLS, the init line's MCP servers = %+v, want tls connected\n%s", started.MCPServers, dump(evs))
	}
	reqs = h.model.MessageRequests()
	if calls.Load() != 2 || !strings.Contains(reqs[len(reqs)-1].LastUserText(), "answered by the web server outside") {
		t.Errorf("over TLS: %d tool calls; want the tool's answer in the last request\n%s", calls.Load(), dump(evs))
	}
	if countType(evs, stream.Network, `"host":"example.com","port":443,"method":"CONNECT","allowed":true`) == 0 {
		t.Errorf("no CONNECT through the proxy for the https server\n%s", dump(evs))
	}
}
