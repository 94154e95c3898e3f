package gateway

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzAnthropicSSE feeds the meter arbitrary streams, in two pieces split
// anywhere: it must not panic, must read the same from any split (the
// provider's bytes arrive in chunks of any size), and its estimate of a
// cut stream's output must never be below what the provider reported.
func FuzzAnthropicSSE(f *testing.F) {
	f.Add([]byte(sampleSSE), uint16(100))
	f.Add([]byte(strings.ReplaceAll(sampleSSE, "\n", "\r\n")), uint16(7))
	f.Add([]byte(sampleSSE[:len(sampleSSE)/2]), uint16(0))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"}}\n\n"), uint16(3))
	f.Add([]byte("event: content_block_delta\ndata: {\"delta\":{\"text\":\"abc\"}}\rdata: x\r\r"), uint16(30))
	f.Fuzz(func(t *testing.T, stream []byte, split uint16) {
		at := int(split) % (len(stream) + 1)
		whole := meter{kind: kindSSE}
		whole.write(stream)
		whole.end()
		parts := meter{kind: kindSSE}
		parts.write(stream[:at])
		parts.write(stream[at:])
		parts.end()
		if !sameReading(&whole, &parts) {
			t.Fatalf("split at %d changed the reading:\nwhole %+v\nparts %+v", at, summary(&whole), summary(&parts))
		}
		if est := whole.estimatedOutput(); est < whole.usage.OutputTokens {
			t.Fatalf("estimated output %d below the reported %d", est, whole.usage.OutputTokens)
		}
	})
}

func sameReading(a, b *meter) bool {
	return a.id == b.id && a.model == b.model && a.usage == b.usage && a.final == b.final && a.stopped == b.stopped &&
		a.deltas == b.deltas && a.content == b.content && a.errType == b.errType && a.errMsg == b.errMsg && a.problem == b.problem
}

func summary(m *meter) map[string]any {
	return map[string]any{"id": m.id, "model": m.model, "usage": m.usage, "final": m.final, "stopped": m.stopped,
		"deltas": m.deltas, "content": m.content, "err": m.errType + ": " + m.errMsg, "problem": m.problem}
}

// FuzzRequestBody checks the request parsing of a call: peekModel finds
// the model encoding/json finds in any valid JSON object (the last
// "model" key, exactly spelled), and injectWrapUp, when it accepts a
// body, returns valid JSON with the same model and the instruction in it.
func FuzzRequestBody(f *testing.F) {
	f.Add([]byte(request(true, hello)))
	f.Add([]byte(`{"model":"a","model":"claude-opus-4","messages":[{"role":"assistant","content":"x"}],"system":"S"}`))
	f.Add([]byte(`{"mod\u0065l":"claude","messages":[{"role":"user","content":[{"type":"text","text":"}\"{"}]}]}`))
	f.Add([]byte(`{"Model":"upper","messages":[]}`))
	f.Add([]byte(` { "messages" : [ ] , "model" : "m" } `))
	f.Add([]byte(claudeCodeBody()))
	f.Fuzz(func(t *testing.T, body []byte) {
		model, ok := peekModel(body)
		var obj map[string]json.RawMessage
		if json.Unmarshal(body, &obj) == nil && obj != nil {
			var want string
			wantOK := json.Unmarshal(obj["model"], &want) == nil && want != ""
			if ok != wantOK || model != want {
				t.Fatalf("peekModel(%q) = %q, %v; encoding/json reads %q, %v", body, model, ok, want, wantOK)
			}
		}
		out, err := injectWrapUp(body, "WRAP-UP")
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("injectWrapUp(%q) gave invalid JSON %q", body, out)
		}
		if !bytes.Contains(out, []byte("WRAP-UP")) {
			t.Fatalf("injectWrapUp(%q) = %q lost the instruction", body, out)
		}
		if m2, ok2 := peekModel(out); ok && (m2 != model || !ok2) {
			t.Fatalf("injectWrapUp changed the model %q to %q (%v)", model, m2, ok2)
		}
	})
}
