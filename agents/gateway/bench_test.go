package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/modeltest"
	"hearth/agents/stream"
)

// claudeCodeBody is a request shaped like the CLI's: a long system prompt,
// a dozen tools with schemas, a few turns of history; about 40 KB.
func claudeCodeBody() string {
	var tools []map[string]any
	for i := range 12 {
		tools = append(tools, map[string]any{
			"name": fmt.Sprintf("Tool%d", i), "description": strings.Repeat("Does a useful thing. ", 60),
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{
				"command": map[string]string{"type": "string", "description": "what to run"}}},
		})
	}
	body := map[string]any{
		"model": "claude-opus-4-8", "max_tokens": 32000, "stream": true,
		"system":   []map[string]any{{"type": "text", "text": strings.Repeat("You are Claude Code. ", 500), "cache_control": map[string]string{"type": "ephemeral"}}},
		"tools":    tools,
		"metadata": map[string]string{"user_id": "user_bench"},
		"messages": []any{
			map[string]any{"role": "user", "content": "Analyze the sales data in inputs/ and write outputs/report.md"},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "Tool0", "input": map[string]string{"command": "ls inputs"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": strings.Repeat("q2.csv\n", 200)}}},
		},
	}
	b, _ := json.Marshal(body)
	return string(b)
}

// BenchmarkGatewayOverhead times a streamed call through the gateway and
// the same call straight to the scripted provider, alternately, in one
// run, and reports the medians and what the gateway adds.
func BenchmarkGatewayOverhead(b *testing.B) {
	final := modeltest.Turn{
		Blocks: []modeltest.Block{modeltest.Text("I will look at the data first."), modeltest.ToolUse("Tool0", map[string]string{"command": "head inputs/q2.csv"})},
		Usage:  modeltest.Usage{InputTokens: 12000, OutputTokens: 80, CacheReadInputTokens: 30000},
	}
	up := modeltest.New(modeltest.Config{Key: realKey, Final: &final})
	if err := up.Start(); err != nil {
		b.Fatal(err)
	}
	defer up.Close()
	gw, err := New(Config{Upstream: up.URL(), APIKey: realKey, Prices: NewPrices(map[string]Price{"claude-opus-4": {Input: 5, Output: 25, CacheRead: 0.5, CacheWrite: 6.25}}),
		OnEvent: func(stream.Event) {}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	token := gw.Register(Execution{Session: "s", ID: "e", Budget: &Limits{USD: 1e9, Turns: 1 << 30}})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	body := claudeCodeBody()
	call := func(base, key string) time.Duration {
		req, _ := http.NewRequest("POST", base+"/v1/messages?beta=true", strings.NewReader(body))
		req.Header.Set("x-api-key", key)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n == 0 {
			b.Fatalf("%s: status %d, %d bytes, %v", base, resp.StatusCode, n, err)
		}
		return time.Since(start)
	}
	for range 10 { // warm up connections on both paths
		call(up.URL(), realKey)
		call(srv.URL, token)
	}
	direct := make([]time.Duration, 0, b.N)
	viaGW := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			direct = append(direct, call(up.URL(), realKey))
			viaGW = append(viaGW, call(srv.URL, token))
		} else {
			viaGW = append(viaGW, call(srv.URL, token))
			direct = append(direct, call(up.URL(), realKey))
		}
	}
	b.StopTimer()
	md, mg := median(direct), median(viaGW)
	b.ReportMetric(float64(md)/1e6, "ms-median-direct")
	b.ReportMetric(float64(mg)/1e6, "ms-median-gateway")
	b.ReportMetric(float64(mg-md)/1e3, "added-µs-median")
	b.ReportMetric(float64(mg)/float64(md), "x-direct")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
