package adapter

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"hearth/agents/stream"
)

// FuzzClaudeCode feeds arbitrary bytes as stdout (and their tail as
// stderr): no panic, every payload JSON, a sane summary.
func FuzzClaudeCode(f *testing.F) {
	if sample, err := os.ReadFile("testdata/stream-json-sample.jsonl"); err == nil {
		f.Add(sample)
	}
	if retry, err := os.ReadFile("testdata/api-retry.jsonl"); err == nil {
		f.Add(retry)
	}
	captures, _ := filepath.Glob("testdata/claude-code-*.jsonl")
	for _, name := range captures {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"", "\n", "{", "null\n[]\n42\n\"x\"\n",
		initLine + "\n" + resultLine,
		`{"type":"assistant","message":{"id":1,"content":{"a":1},"usage":[1]}}`,
		`{"type":"assistant","message":{"id":"m","content":[null,1,{"type":"tool_use","input":"x"}],"usage":{"input_tokens":-5,"output_tokens":1e300}}}`,
		`{"type":"user","message":{"content":[{"type":"tool_result","content":[1,{"type":null}],"is_error":"yes"}]}}`,
		`{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":512,"error_status":529,"error":"server_error"}`,
		`{"type":"system","subtype":"api_retry","attempt":[],"error_status":"x","error":{"a":"\udc00"}}`,
		`{"type":"system","subtype":{"x":1},"payload":1}`,
		`{"type":"system","subtype":"status","session_id":"s","uuid":"u","status":"compacting"}`,
		`{"type":"result","subtype":7,"is_error":"no","num_turns":"2","total_cost_usd":"1","usage":5,"permission_denials":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a := &ClaudeCode{MaxLine: 512, MaxToolOutput: 16, Thinking: len(data)%2 == 0}
		sum, err := a.Run(testIDs, bytes.NewReader(data), bytes.NewReader(data[len(data)/2:]), func(ev stream.Event) {
			if !json.Valid(ev.Payload) {
				t.Errorf("event %s payload %q is not JSON", ev.Type, ev.Payload)
			}
		})
		if err != nil {
			t.Errorf("Run() error = %v", err)
		}
		switch sum.Status {
		case Completed, Failed, NoResult:
		default:
			t.Errorf("Status = %q", sum.Status)
		}
		u := sum.Usage
		if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheReadTokens < 0 || u.CacheCreationTokens < 0 {
			t.Errorf("Usage = %+v, want no negative counts", u)
		}
	})
}

// fuzzJSONL is FuzzClaudeCode's checks for the JSONL adapters, seeded
// with every line of the real captures (each alone and all together).
func fuzzJSONL(f *testing.F, captures []string, extra []string, newAdapter func(n int) Adapter) {
	for _, name := range captures {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		for _, l := range bytes.Split(b, []byte("\n")) {
			f.Add(l)
		}
	}
	for _, s := range extra {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sum, err := newAdapter(len(data)).Run(testIDs, bytes.NewReader(data), bytes.NewReader(data[len(data)/2:]), func(ev stream.Event) {
			if !json.Valid(ev.Payload) {
				t.Errorf("event %s payload %q is not JSON", ev.Type, ev.Payload)
			}
		})
		if err != nil {
			t.Errorf("Run() error = %v", err)
		}
		switch sum.Status {
		case Completed, Failed, NoResult:
		default:
			t.Errorf("Status = %q", sum.Status)
		}
		if u := sum.ResultUsage; u != nil && (u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheReadTokens < 0 || u.CacheCreationTokens < 0) {
			t.Errorf("ResultUsage = %+v, want no negative counts", *u)
		}
	})
}

func FuzzCodex(f *testing.F) {
	fuzzJSONL(f, []string{"codex-0.169.0-tool.jsonl", "codex-0.169.0-error.jsonl", "codex-0.169.0-retry.jsonl"}, []string{
		"", "{", `{"type":null}`, `{"type":"item.completed","item":{"type":"mcp_tool_call","arguments":"\udc00","result":{"content":[1]}}}`,
		`{"type":"turn.completed","usage":{"input_tokens":-5,"output_tokens":1e300}}`,
		`{"type":"item.completed","item":{"type":"file_change","changes":{"a":1},"status":7}}`,
	}, func(n int) Adapter { return &Codex{MaxLine: 512, MaxToolOutput: 16, Thinking: n%2 == 0} })
}

func FuzzGemini(f *testing.F) {
	fuzzJSONL(f, []string{"gemini-cli-0.61.0-tool.jsonl", "gemini-cli-0.61.0-error.jsonl"}, []string{
		`{"type":"message","role":"assistant","content":"\xff","delta":true}`, `{"type":"result","status":"error","stats":{"input_tokens":-1}}`,
		`{"type":"tool_result","tool_id":1,"output":null}`,
	}, func(n int) Adapter { return &Gemini{MaxLine: 512, MaxToolOutput: 16} })
}

func FuzzOpenCode(f *testing.F) {
	fuzzJSONL(f, []string{"opencode-1.18.33-tool.jsonl", "opencode-1.18.33-error.jsonl"}, []string{
		`{"type":"step_finish","part":{"reason":"stop","tokens":{"input":-3,"cache":{"read":-1}}}}`,
		`{"type":"tool_use","sessionID":"s","part":{"state":{"input":[1],"output":"\xff\xfe"}}}`,
		`{"type":"error","error":{"data":null}}`,
	}, func(n int) Adapter { return &OpenCode{MaxLine: 512, MaxToolOutput: 16, Thinking: n%2 == 0} })
}
