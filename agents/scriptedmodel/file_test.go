package scriptedmodel

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseScript(t *testing.T) {
	cfg, err := ParseScript([]byte(`{"per_conversation": true, "turns": [
		{"blocks": [{"type": "tool_use", "name": "Bash", "input": {"command": "ls"}}], "usage": {"input_tokens": 10}, "delay": "5ms"},
		{"error": {"status": 529, "type": "overloaded_error"}},
		{"match_last_user": "again", "blocks": [{"type": "text", "text": "once more"}], "break": "cut"}],
		"final": {"blocks": [{"type": "text", "text": "bye"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.PerConversation || len(cfg.Turns) != 3 || cfg.Turns[0].Usage.InputTokens != 10 || cfg.Turns[0].Delay.Milliseconds() != 5 ||
		cfg.Turns[1].Error.Status != 529 || cfg.Turns[2].Match == nil || cfg.Turns[2].Break != Cut || cfg.Final.Blocks[0].Text != "bye" {
		t.Errorf("ParseScript = %+v", cfg)
	}
	for _, tc := range []struct{ name, script, want string }{
		{"unknown field", `{"turns": [{"text": "hi"}]}`, `unknown field "text"`},
		{"empty", `{}`, "no turns"},
		{"bad block", `{"turns": [{"blocks": [{"type": "image"}]}]}`, `turns[0]: blocks[0]: type "image"`},
		{"tool without name", `{"turns": [{"blocks": [{"type": "tool_use"}]}]}`, "needs a name"},
		{"input not an object", `{"turns": [{"blocks": [{"type": "tool_use", "name": "Bash", "input": [1]}]}]}`, "JSON object"},
		{"bad break", `{"turns": [{"blocks": [{"type": "text"}], "break": "snap"}]}`, `break "snap"`},
		{"bad delay", `{"turns": [{"blocks": [{"type": "text"}], "delay": "soon"}]}`, `delay "soon"`},
		{"bad error", `{"turns": [{"error": {"status": 200, "type": "x"}}]}`, "4xx or 5xx"},
		{"nothing to say", `{"turns": [{}]}`, "needs blocks or an error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseScript([]byte(tc.script)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseScript(%s) = %v, want an error containing %q", tc.script, err, tc.want)
			}
		})
	}
	demo, _ := json.Marshal(Demo())
	if _, err := ParseScript(demo); err != nil {
		t.Errorf("the demo script does not parse: %v", err)
	}
}

// TestPerConversation: each conversation gets the script from its start,
// by the number of answers it already has.
func TestPerConversation(t *testing.T) {
	s := start(t, Config{PerConversation: true, Turns: []Turn{{Blocks: []Block{Text("one")}}, {Blocks: []Block{Text("two")}}},
		Final: &Turn{Blocks: []Block{Text("end")}}})
	ask := func(messages string) string {
		resp := post(t, s, `{"model":"m","max_tokens":10,"messages":`+messages+`}`)
		defer resp.Body.Close()
		var m struct {
			Content []struct{ Text string } `json:"content"`
		}
		json.NewDecoder(resp.Body).Decode(&m)
		if len(m.Content) == 0 {
			return ""
		}
		return m.Content[0].Text
	}
	first := `[{"role":"user","content":"hi"}]`
	second := `[{"role":"user","content":"hi"},{"role":"assistant","content":"one"},{"role":"user","content":"and?"}]`
	third := `[{"role":"user","content":"hi"},{"role":"assistant","content":"one"},{"role":"user","content":"and?"},{"role":"assistant","content":"two"},{"role":"user","content":"more"}]`
	for i, tc := range []struct{ messages, want string }{{first, "one"}, {first, "one"}, {second, "two"}, {third, "end"}, {second, "two"}} {
		if got := ask(tc.messages); got != tc.want {
			t.Errorf("request %d = %q, want %q", i, got, tc.want)
		}
	}
}
