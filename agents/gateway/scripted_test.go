package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"time"

	"hearth/agents/modeltest"
	"hearth/agents/stream"
)

// TestProtocolsAgainstScriptedModel runs requests the real CLIs sent
// (Codex 0.169.0's and Gemini CLI 0.61.0's, captured in
// agents/scriptedmodel/testdata/clients; a Chat Completions body as
// OpenCode writes one) through the gateway to the scripted model, which
// validates every request as strictly as the provider: under a dollar
// limit, with the cap set in the protocol's own field, and at 90%, with
// the wrap-up text added, the rewritten bodies are still accepted, and
// every call is metered exactly as the script's usage says, streamed and
// not.
func TestProtocolsAgainstScriptedModel(t *testing.T) {
	clients := filepath.Join("..", "scriptedmodel", "testdata", "clients")
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(clients, name))
		if err != nil {
			t.Fatalf("the captured CLI requests are committed with the scripted model: %v", err)
		}
		return string(b)
	}
	codexFirst, codexAfter := read("codex-0.169.0-first.json"), read("codex-0.169.0-after-tool.json")
	geminiFirst, geminiAfter := read("gemini-cli-0.61.0-first.json"), read("gemini-cli-0.61.0-after-tool.json")
	// Gemini CLI's resumed session repeats its tool's response, which the
	// API (and the scripted model) refuses unless the gateway drops it.
	resumed, err := os.ReadFile(filepath.Join("testdata", "protocols", "gemini-cli-0.61.0-resumed.json"))
	if err != nil {
		t.Fatal(err)
	}
	geminiResumed := string(resumed)
	chatFirst := `{"model":"gpt-5","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are opencode."},{"role":"user","content":"write hi to outputs/a.txt"}],"tools":[{"type":"function","function":{"name":"write","description":"write a file","parameters":{"type":"object","properties":{"filePath":{"type":"string"},"content":{"type":"string"}},"required":["filePath","content"]}}}],"max_tokens":32000}`
	chatPlain := strings.Replace(chatFirst, `"stream":true,"stream_options":{"include_usage":true},`, ``, 1)

	usage := modeltest.Usage{InputTokens: 900, CacheReadInputTokens: 3000, OutputTokens: 400, ReasoningTokens: 120}
	turn := func(blocks ...modeltest.Block) modeltest.Turn { return modeltest.Turn{Blocks: blocks, Usage: usage} }
	tool := modeltest.ToolUse("shell", map[string]any{"command": []string{"bash", "-lc", "echo hi > outputs/a.txt"}})
	cases := []struct {
		name, path, body string
		turn             modeltest.Turn
		model            string
		price            Price
	}{
		{"codex first call", "/v1/responses", codexFirst, turn(modeltest.Text("Writing it."), tool), "gpt-5.5", Price{Input: 5, Output: 30, CacheRead: 0.5}},
		{"codex after the tool", "/v1/responses", codexAfter, turn(modeltest.Text("Done.")), "gpt-5.5", Price{Input: 5, Output: 30, CacheRead: 0.5}},
		{"codex not streamed", "/v1/responses", strings.Replace(codexFirst, `"stream":true`, `"stream":false`, 1), turn(modeltest.Text("Done.")), "gpt-5.5", Price{Input: 5, Output: 30, CacheRead: 0.5}},
		{"gemini cli first call", "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", geminiFirst, turn(modeltest.Text("Writing it."), modeltest.ToolUse("run_shell_command", map[string]any{"command": "echo hi > outputs/a.txt"})), "gemini-2.5-pro", Price{Input: 1, Output: 10, CacheRead: 0.1}},
		{"gemini cli after the tool", "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", geminiAfter, turn(modeltest.Text("Done.")), "gemini-2.5-pro", Price{Input: 1, Output: 10, CacheRead: 0.1}},
		{"gemini cli resumed", "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", geminiResumed, turn(modeltest.Text("Summary added.")), "gemini-2.5-pro", Price{Input: 1, Output: 10, CacheRead: 0.1}},
		{"gemini not streamed", "/v1beta/models/gemini-2.5-pro:generateContent", geminiFirst, turn(modeltest.Text("Done.")), "gemini-2.5-pro", Price{Input: 1, Output: 10, CacheRead: 0.1}},
		{"chat streamed", "/v1/chat/completions", chatFirst, turn(modeltest.Text("Writing it."), modeltest.ToolUse("write", map[string]any{"filePath": "outputs/a.txt", "content": "hi"})), "gpt-5", Price{Input: 1, Output: 10, CacheRead: 0.1}},
		{"chat not streamed", "/v1/chat/completions", chatPlain, turn(modeltest.Text("Done.")), "gpt-5", Price{Input: 1, Output: 10, CacheRead: 0.1}},
	}
	for _, level := range []struct {
		name  string
		spent float64 // of a $100 limit
	}{{"under a limit", 0}, {"past 90%", 91}, {"near the end", 99.5}} {
		for _, c := range cases {
			t.Run(level.name+"/"+c.name, func(t *testing.T) {
				up := modeltest.New(modeltest.Config{Key: "real-provider-key", Turns: []modeltest.Turn{c.turn}})
				if err := up.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(up.Close)
				var mu sync.Mutex
				var events []stream.Event
				prices := map[string]Price{"gpt-5.5": {Input: 5, Output: 30, CacheRead: 0.5}, "gpt-5": {Input: 1, Output: 10, CacheRead: 0.1}, "gemini-2.5-pro": {Input: 1, Output: 10, CacheRead: 0.1}}
				gw, err := New(Config{
					Providers: map[string]Provider{
						ProviderOpenAI: {Upstream: up.URL(), APIKey: up.Key(), Prices: NewPrices(prices)},
						ProviderGemini: {Upstream: up.URL(), APIKey: up.Key(), Prices: NewPrices(prices)},
					},
					OnEvent: func(e stream.Event) { mu.Lock(); events = append(events, e); mu.Unlock() },
				})
				if err != nil {
					t.Fatal(err)
				}
				srv := httptest.NewServer(gw)
				t.Cleanup(srv.Close)
				budget := &Limits{USD: 100}
				budget.Charge(level.spent, 0)
				token := gw.Register(Execution{Session: "s", ID: "e", Budget: budget})

				req, _ := http.NewRequest("POST", srv.URL+c.path, strings.NewReader(c.body))
				req.Header.Set("Content-Type", "application/json")
				if strings.HasPrefix(c.path, "/v1beta/") {
					req.Header.Set("x-goog-api-key", token)
				} else {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				answer, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				reqs := up.Requests()
				if resp.StatusCode != 200 || len(reqs) != 1 || reqs[0].Status != 200 {
					var why string
					if len(reqs) > 0 {
						why = reqs[0].Error
					}
					t.Fatalf("%d %.300s; the scripted model said %q", resp.StatusCode, answer, why)
				}
				sent := reqs[0].Body
				pr, _, _ := route(httptest.NewRequest("POST", c.path, nil))
				_, asked := pr.maxOutput([]byte(c.body))
				switch n, ok := pr.maxOutput(sent); {
				case !ok && (asked || float64(MaxAnswerTokens)*c.price.Output/1e6 > 100-level.spent):
					t.Errorf("the provider got no output cap, though the body named one or what is left does not pay %d output tokens", MaxAnswerTokens)
				case ok && (n < DefaultMinOutput || float64(n)*c.price.Output/1e6 > 100-level.spent):
					t.Errorf("the provider got output cap %d: not set within what is left", n)
				}
				if level.spent > 0 && !bytes.Contains(sent, []byte(DefaultWrapUp)) {
					t.Errorf("past 90%%: no wrap-up in what the provider got")
				}
				if level.spent == 0 && bytes.Contains(sent, []byte(DefaultWrapUp)) {
					t.Errorf("under 90%%: a wrap-up in what the provider got")
				}
				if bytes.Contains(sent, []byte(token)) || reqs[0].Header.Get("Authorization")+reqs[0].Header.Get("X-Goog-Api-Key") == "" {
					t.Errorf("the provider got the agent's token, or no key")
				}
				mu.Lock()
				defer mu.Unlock()
				var calls []ModelCallPayload
				for _, e := range events {
					if e.Type == stream.ModelCall {
						var p ModelCallPayload
						json.Unmarshal(e.Payload, &p)
						calls = append(calls, p)
					}
				}
				if len(calls) != 1 {
					t.Fatalf("model_call events %+v", calls)
				}
				p := calls[0]
				want := Usage{InputTokens: 900, CacheReadTokens: 3000, OutputTokens: 400, ReasoningTokens: 120}
				got := Usage{InputTokens: p.InputTokens, CacheReadTokens: p.CacheReadTokens, OutputTokens: p.OutputTokens, ReasoningTokens: p.ReasoningTokens, CacheCreationTokens: p.CacheCreationTokens}
				usd := c.price.Cost(want)
				if got != want || p.Model != c.model || p.Error != "" || math.Abs(p.USD-usd) > 1e-12 {
					t.Errorf("metered %+v, want %+v of %s at $%v", p, want, c.model, usd)
				}
				if spent, turns := budget.Spent(); math.Abs(spent-level.spent-usd) > 1e-9 || turns != 1 {
					t.Errorf("charged $%v and %d calls, want $%v and 1", spent-level.spent, turns, usd)
				}
			})
		}
	}
}

// BenchmarkProtocolOverhead times a real CLI's streamed call (Codex's
// and Gemini CLI's captured first requests, about 40 KB) through the
// gateway under a dollar limit (so the body is decoded, capped and
// encoded again) and the same call straight to the scripted provider,
// alternately, in one run: the medians and what the gateway adds.
func BenchmarkProtocolOverhead(b *testing.B) {
	for _, c := range []struct{ name, file, path, header string }{
		{"responses", "codex-0.169.0-first.json", "/v1/responses", "Authorization"},
		{"gemini", "gemini-cli-0.61.0-first.json", "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", "x-goog-api-key"},
	} {
		b.Run(c.name, func(b *testing.B) {
			body, err := os.ReadFile(filepath.Join("..", "scriptedmodel", "testdata", "clients", c.file))
			if err != nil {
				b.Fatalf("the committed capture of the CLI's first request: %v", err)
			}
			final := modeltest.Turn{Blocks: []modeltest.Block{modeltest.Text("Writing it."), modeltest.ToolUse("shell", map[string]any{"command": []string{"ls"}})},
				Usage: modeltest.Usage{InputTokens: 12000, OutputTokens: 80, CacheReadInputTokens: 30000}}
			up := modeltest.New(modeltest.Config{Key: "real", Final: &final, DiscardRequests: true})
			if err := up.Start(); err != nil {
				b.Fatal(err)
			}
			defer up.Close()
			prices := NewPrices(map[string]Price{"gpt-5.5": {Input: 5, Output: 30, CacheRead: 0.5}, "gemini-2.5-pro": {Input: 1.25, Output: 10, CacheRead: 0.125}})
			gw, err := New(Config{Providers: map[string]Provider{
				ProviderOpenAI: {Upstream: up.URL(), APIKey: "real", Prices: prices},
				ProviderGemini: {Upstream: up.URL(), APIKey: "real", Prices: prices},
			}, OnEvent: func(stream.Event) {}})
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(gw)
			defer srv.Close()
			token := gw.Register(Execution{Session: "s", ID: "e", Budget: &Limits{USD: 1e9}})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			call := func(base, key string) time.Duration {
				req, _ := http.NewRequest("POST", base+c.path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if c.header == "Authorization" {
					key = "Bearer " + key
				}
				req.Header.Set(c.header, key)
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
			for range 10 {
				call(up.URL(), "real")
				call(srv.URL, token)
			}
			direct := make([]time.Duration, 0, b.N)
			viaGW := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				if i%2 == 0 {
					direct = append(direct, call(up.URL(), "real"))
					viaGW = append(viaGW, call(srv.URL, token))
				} else {
					viaGW = append(viaGW, call(srv.URL, token))
					direct = append(direct, call(up.URL(), "real"))
				}
			}
			b.StopTimer()
			md, mg := median(direct), median(viaGW)
			b.ReportMetric(float64(md)/1e6, "ms-median-direct")
			b.ReportMetric(float64(mg)/1e6, "ms-median-gateway")
			b.ReportMetric(float64(mg-md)/1e3, "added-µs-median")
			b.ReportMetric(float64(mg)/float64(md), "x-direct")
		})
	}
}
