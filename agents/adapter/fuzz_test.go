package adapter

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"hearth/agents/stream"
)

// FuzzClaudeCode feeds arbitrary bytes as stdout (and their tail as
// stderr): no panic, every payload JSON, a sane summary.
func FuzzClaudeCode(f *testing.F) {
	if sample, err := os.ReadFile("testdata/stream-json-sample.jsonl"); err == nil {
		f.Add(sample)
	}
	for _, s := range []string{
		"", "\n", "{", "null\n[]\n42\n\"x\"\n",
		initLine + "\n" + resultLine,
		`{"type":"assistant","message":{"id":1,"content":{"a":1},"usage":[1]}}`,
		`{"type":"assistant","message":{"id":"m","content":[null,1,{"type":"tool_use","input":"x"}],"usage":{"input_tokens":-5,"output_tokens":1e300}}}`,
		`{"type":"user","message":{"content":[{"type":"tool_result","content":[1,{"type":null}],"is_error":"yes"}]}}`,
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
