package appliance

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/agents/channel"
	"hearth/agents/modeltest"
)

// BenchmarkInsideDelegateFirstEvent: a delegate_task call, made over the
// hearth MCP server as a running parent agent (through its channel, with
// its token, as its CLI would), to the child's first streamed event;
// against, interleaved in the same run, `hearth agents run`'s way (an API
// start, then following the events over SSE) to its first event. Each
// child runs to its end before the next start. Reports both medians and
// their ratio (x-api). Run it with -benchtime 5x.
func BenchmarkInsideDelegateFirstEvent(b *testing.B) {
	// The parent's only answer keeps it running while it is measured;
	// every child answers "done" at once.
	env := startAgentDaemon(b, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		{Match: modeltest.LastUserContains("BENCH-PARENT"), Blocks: []modeltest.Block{
			modeltest.ToolUse("Bash", map[string]any{"command": "echo busy; sleep 590", "description": "stay", "timeout": 600000})}},
		textTurn("done"),
	}}, nil)
	ctx := context.Background()
	parent, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "BENCH-PARENT: stay running"})
	if err != nil {
		b.Fatal(err)
	}
	defer env.c.Cancel(ctx, parent.Id)
	// Only a running execution delegates.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if e, err := env.c.Execution(ctx, parent.Id); err == nil && e.Status == "running" {
			break
		} else if time.Now().After(deadline) {
			b.Fatalf("the parent is not running: %+v, %v", e, err)
		}
	}
	cs := insideClient(b, env, parent.Id, parent.Session)
	// firstEvent follows id's events from the start: it returns when the
	// first arrives, and ends when the execution has.
	firstEvent := func(id string, start time.Time) (first time.Duration) {
		err := env.c.FollowEvents(ctx, id, 0, func(Event) error {
			if first == 0 {
				first = time.Since(start)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return first
	}
	viaTool := func() time.Duration {
		start := time.Now()
		res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: "delegate_task", Arguments: map[string]any{
			"agent": "analyst", "prompt": "go", "limits": map[string]any{"usd": 0.01, "turns": 2, "wall_time": "2m"}}})
		if err != nil {
			b.Fatal(err)
		}
		if res.IsError {
			b.Fatalf("delegate_task: %s", res.Content[0].(*mcpsdk.TextContent).Text)
		}
		var st struct{ Execution string }
		raw, _ := json.Marshal(res.StructuredContent)
		if json.Unmarshal(raw, &st) != nil || st.Execution == "" {
			b.Fatalf("delegate_task answered %s", raw)
		}
		return firstEvent(st.Execution, start)
	}
	viaAPI := func() time.Duration {
		start := time.Now()
		e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{Usd: 0.01, Turns: 2, WallTime: "2m"}})
		if err != nil {
			b.Fatal(err)
		}
		return firstEvent(e.Id, start)
	}
	viaTool() // warm-up
	viaAPI()
	var tool, api []time.Duration
	for b.Loop() {
		tool = append(tool, viaTool())
		api = append(api, viaAPI())
	}
	b.ReportMetric(float64(median(tool).Microseconds())/1000, "ms-tool-first-event")
	b.ReportMetric(float64(median(api).Microseconds())/1000, "ms-api-first-event")
	b.ReportMetric(float64(median(tool))/float64(median(api)), "x-api")
}

// insideClient is an MCP session to the daemon's hearth server as
// execution id would open it from its machine: through its channel, with
// the token its CLI was configured with.
func insideClient(b *testing.B, env *agentEnv, id, session string) *mcpsdk.ClientSession {
	b.Helper()
	var conf struct {
		MCPServers map[string]struct {
			Headers map[string]string `json:"headers"`
		} `json:"mcpServers"`
	}
	var raw []byte
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if raw, err = env.d.agents.ws.store.ReadFile(session, "", ".home/.hearth/mcp-hearth.json", 0); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("no MCP configuration for %s: %v", id, err)
		}
	}
	if err := json.Unmarshal(raw, &conf); err != nil {
		b.Fatal(err)
	}
	auth := conf.MCPServers["hearth"].Headers["Authorization"]
	dial := channel.Dial(func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", env.d.agents.inSock)
	}, id)
	hc := &http.Client{Transport: authTransport{auth, &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx,
		&mcpsdk.StreamableClientTransport{Endpoint: "http://hearth/mcp", HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close() })
	return cs
}

type authTransport struct {
	auth string
	base http.RoundTripper
}

func (t authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", t.auth)
	return t.base.RoundTrip(r)
}
