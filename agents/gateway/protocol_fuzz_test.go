package gateway

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// protocolsByIndex are the protocols the fuzz targets choose from.
var protocolsByIndex = []protocol{anthropicProto{}, responsesProto{}, chatProto{}, geminiProto{}}

// FuzzProtocolMeters feeds each protocol's meter arbitrary answers (the
// provider's bytes are untrusted too), streamed in two pieces split
// anywhere and whole: it must not panic, must read a stream the same from
// any split, and must never make a usage figure negative.
func FuzzProtocolMeters(f *testing.F) {
	for i, name := range []string{"responses.sse", "responses.json", "chat.sse", "chat.json", "chat_nousage.sse", "gemini.sse", "gemini.json", "gemini_array.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", "protocols", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(1+i%3), uint16(len(b)/3))
	}
	f.Add([]byte("data: {\"usageMetadata\":{\"promptTokenCount\":-5,\"cachedContentTokenCount\":99}}\r\n\r\n"), uint8(3), uint16(9))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":1e9}}}\n\ndata: [DONE]\n\n"), uint8(2), uint16(40))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"code\":7,\"message\":\"x\"}\n\n"), uint8(1), uint16(3))
	f.Fuzz(func(t *testing.T, answer []byte, which uint8, split uint16) {
		p := protocolsByIndex[int(which)%len(protocolsByIndex)]
		at := int(split) % (len(answer) + 1)
		whole := meter{kind: kindSSE, p: p}
		whole.write(answer)
		whole.end()
		parts := meter{kind: kindSSE, p: p}
		parts.write(answer[:at])
		parts.write(answer[at:])
		parts.end()
		if !sameReading(&whole, &parts) {
			t.Fatalf("split at %d changed the reading:\nwhole %+v\nparts %+v", at, summary(&whole), summary(&parts))
		}
		for _, kind := range []int{kindJSON, kindError} {
			m := meter{kind: kind, p: p}
			m.write(answer)
			m.end()
			checkUsage(t, m.usage)
		}
		checkUsage(t, whole.usage)
		if est := whole.estimatedOutput(); est < whole.usage.OutputTokens {
			t.Fatalf("estimated output %d below the reported %d", est, whole.usage.OutputTokens)
		}
	})
}

func checkUsage(t *testing.T, u Usage) {
	t.Helper()
	if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheReadTokens < 0 || u.CacheCreationTokens < 0 || u.ReasoningTokens < 0 {
		t.Fatalf("negative usage %+v", u)
	}
}

// FuzzProtocolCap rewrites arbitrary request bodies (the agent's:
// hostile) with each protocol's cap: a body it accepts comes out as
// valid JSON whose cap, read as the provider reads it, is the one
// reported and at most the limit, with the cap's key once, no second
// spelling of the cap left, and no input stored by the provider; the wrap-up, when it accepts a body,
// keeps it valid JSON and adds the text.
func FuzzProtocolCap(f *testing.F) {
	f.Add([]byte(responsesBody), uint8(1), uint32(1000))
	f.Add([]byte(`{"model":"gpt-5","input":"x","max_output_tokens":1,"max_output_tokens":1e9}`), uint8(1), uint32(500))
	f.Add([]byte(chatBody), uint8(2), uint32(100))
	f.Add([]byte(`{"model":"gpt-5","max_tokens":99999,"max_completion_tokens":5,"n":1,"messages":[]}`), uint8(2), uint32(300))
	f.Add([]byte(`{"model":"m","max_completion_tokens":"9","messages":[]}`), uint8(2), uint32(300))
	f.Add([]byte(geminiBody), uint8(3), uint32(4096))
	f.Add([]byte(`{"contents":[],"generationConfig":{"maxOutputTokens":9,"thinkingConfig":{"thinkingBudget":-1}},"generationConfig":{"maxOutputTokens":99999}}`), uint8(3), uint32(2048))
	f.Add([]byte(`{"generation_config":{"max_output_tokens":99999}}`), uint8(3), uint32(2048))
	f.Add([]byte(`{"contents":[{"role":"user","parts":[{"functionResponse":{"id":"a"}},{"functionResponse":{"id":"a"}}]}]}`), uint8(3), uint32(2048))
	f.Fuzz(func(t *testing.T, body []byte, which uint8, limit32 uint32) {
		p := protocolsByIndex[1+int(which)%3]
		limit := int64(limit32%1_000_000) + 1
		out, n, err := p.capOutput(body, limit)
		if err == nil && json.Valid(body) {
			if !json.Valid(out) {
				t.Fatalf("capOutput(%q) gave invalid JSON %q", body, out)
			}
			if n < 1 || n > limit {
				t.Fatalf("capOutput(%q, %d) reports cap %d", body, limit, n)
			}
			var obj map[string]json.RawMessage
			if json.Unmarshal(out, &obj) != nil {
				t.Fatalf("not an object: %q", out)
			}
			for k, c := range topKeys(t, out) {
				if c != 1 && (k == "max_output_tokens" || k == "max_completion_tokens" || k == "max_tokens" || k == "generationConfig") {
					t.Fatalf("key %q %d times in %q", k, c, out)
				}
			}
			for _, k := range []string{"previous_response_id", "conversation", "prompt", "cachedContent"} {
				if v, ok := obj[k]; ok && string(v) != "null" {
					t.Fatalf("%s survived in %q", k, out)
				}
			}
			got, ok := p.maxOutput(out)
			if !ok || got != n {
				t.Fatalf("capOutput(%q) = %q: cap read back %d, %v; reported %d", body, out, got, ok, n)
			}
			if _, isGemini := p.(geminiProto); isGemini {
				var gc map[string]json.RawMessage
				json.Unmarshal(obj["generationConfig"], &gc)
				if _, ok := obj["generation_config"]; ok || gc["max_output_tokens"] != nil {
					t.Fatalf("a second spelling of the cap survived: %q", out)
				}
			}
		}
		w, err := p.wrapUp(body, "WRAP-UP")
		if err == nil && (!json.Valid(w) || !bytes.Contains(w, []byte("WRAP-UP"))) {
			t.Fatalf("wrapUp(%q) = %q", body, w)
		}
		if b, err := p.prepare(body); err == nil && !bytes.Equal(b, body) && !json.Valid(b) {
			t.Fatalf("prepare(%q) = %q", body, b)
		}
	})
}
