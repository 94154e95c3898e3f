package mcp_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/appliance"
	"hearth/client"
)

// BenchmarkToolCall calls list_sessions through the daemon's /mcp
// (streamable HTTP on its unix socket: MCP client -> daemon's MCP
// handler -> the daemon's own API) and, as the baseline in the same run,
// lists the sessions with the API client directly, interleaved; it
// reports what a tool call costs over the API call it wraps.
func BenchmarkToolCall(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("the daemon mounts the workspace with FUSE, which needs root")
	}
	dir := b.TempDir()
	cfg := appliance.Config{StateDir: filepath.Join(dir, "state"), Workspace: appliance.WorkspaceConfig{Mount: filepath.Join(dir, "agents")}}
	d, err := appliance.Start(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	c := client.New(d.Socket())
	mc := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := mc.Connect(ctx, &mcpsdk.StreamableClientTransport{Endpoint: "http://hearth/mcp", HTTPClient: unixHTTP(d.Socket())}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	viaMCP := func() {
		if res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: "list_sessions", Arguments: map[string]any{}}); err != nil || res.IsError {
			b.Fatalf("list_sessions = %+v, %v", res, err)
		}
	}
	direct := func() {
		if _, err := c.AgentSessions(ctx, client.AgentSessionFilter{}); err != nil {
			b.Fatal(err)
		}
	}
	for range 10 {
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
	b.ReportMetric(float64(tool.Microseconds())/n, "mcp-µs/call")
	b.ReportMetric(float64(api.Microseconds())/n, "api-µs/call")
	b.ReportMetric(float64(tool)/float64(api), "x-api")
}
