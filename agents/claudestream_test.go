package agents

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"hearth/agents/adapter"
	"hearth/agents/stream"
	"hearth/image"
)

// claudeIgnored are the kinds of the claude CLI's stream-json output the
// adapter skips on purpose (adapter.Summary.Ignored), and why. Anything
// else it skipped is output it does not know: the stream's format changed.
var claudeIgnored = map[string]string{
	"user/text":               "the prompt, replayed as a user line",
	"rate_limit_event":        "the CLI's notice of its rate-limit state, nothing the task did",
	"stream_event":            "partial-message deltas, printed only with --include-partial-messages",
	"block/thinking":          "extended thinking, not shown unless the adapter is asked (ClaudeCode.Thinking)",
	"block/redacted_thinking": "thinking the provider encrypted: nothing to show",
}

// claudeSystemSubtypes are the system lines, other than init (the
// agent_started status) and api_retry (retry events), that the adapter
// passes on as system events without reading them, and why they may come.
var claudeSystemSubtypes = map[string]string{
	"status":           "the CLI's notice of what it is doing (compacting, ...)",
	"compact_boundary": "where the CLI compacted a long conversation",
	"hook_response":    "the output of a hook in the CLI's settings",
}

// pinnedClaude is the claude CLI version the image was built with, as its
// manifest records it (the recipe's pin, the one place it is written).
func pinnedClaude(t *testing.T, img image.Image) string {
	t.Helper()
	for _, p := range img.Npm {
		if p.Name == "@anthropic-ai/claude-code" {
			return p.Version
		}
	}
	t.Fatalf("the claude-code image's manifest lists no @anthropic-ai/claude-code among %+v", img.Npm)
	return ""
}

// checkClaudeStream fails the test, saying what changed, unless every
// line the pinned claude printed was one the adapter knows (see
// claudeStreamChanges). It is what makes a version bump of the
// claude-code recipe safe to land: a release whose stream-json output the
// adapter would misread fails here.
func checkClaudeStream(t *testing.T, version string, sum adapter.Summary, evs []stream.Event) {
	t.Helper()
	t.Logf("claude %s: %d stdout lines, skipped on purpose %v, %d malformed", version, sum.StdoutLines, sum.Ignored, sum.Malformed)
	for _, c := range claudeStreamChanges(version, sum, evs) {
		t.Error(c)
	}
}

// claudeStreamChanges lists how a run's output departs from what the
// adapter knows: malformed lines, kinds skipped beyond claudeIgnored,
// system subtypes beyond claudeSystemSubtypes, another version than the
// image pins, no completed result with a session id.
func claudeStreamChanges(version string, sum adapter.Summary, evs []stream.Event) []string {
	bump := fmt.Sprintf("claude %s (the claude-code recipe's pin)", version)
	var out []string
	if sum.Malformed != 0 {
		out = append(out, fmt.Sprintf("%s printed %d stdout lines the adapter could not read (a changed stream format: see agents/adapter/claudecode_lines.go):\n%s",
			bump, sum.Malformed, eventsOfType(evs, stream.Error)))
	}
	for _, kind := range slices.Sorted(maps.Keys(sum.Ignored)) {
		if _, ok := claudeIgnored[kind]; !ok {
			out = append(out, fmt.Sprintf("%s printed %d lines or blocks of kind %q, which the adapter skips without knowing them (a changed stream format): "+
				"teach agents/adapter the kind, or list it in claudeIgnored with why it may be skipped; known: %s",
				bump, sum.Ignored[kind], kind, strings.Join(slices.Sorted(maps.Keys(claudeIgnored)), ", ")))
		}
	}
	for _, ev := range evs {
		if ev.Type != stream.System {
			continue
		}
		var p struct {
			Subtype string `json:"subtype"`
		}
		_ = json.Unmarshal(ev.Payload, &p)
		if _, ok := claudeSystemSubtypes[p.Subtype]; !ok {
			out = append(out, fmt.Sprintf("%s printed a system line of subtype %q, new to the adapter (a changed stream format): "+
				"read it in agents/adapter, or list it in claudeSystemSubtypes; its payload: %.300s", bump, p.Subtype, ev.Payload))
		}
	}
	started := findStatus(evs, "agent_started")
	if got := started["claude_code_version"]; got != version {
		out = append(out, fmt.Sprintf("%s: its init line says claude_code_version %v, want %s (init line read as %v)", bump, got, version, started))
	}
	if sum.AgentSessionID == "" || sum.Status != adapter.Completed || sum.StdoutLines == 0 {
		out = append(out, fmt.Sprintf("%s: adapter summary %+v, want a session id, completed, some stdout lines", bump, sum))
	}
	return out
}

// findStatus is the payload of the first status event whose status is
// status, or nil.
func findStatus(evs []stream.Event, status string) map[string]any {
	for _, ev := range evs {
		var p map[string]any
		if ev.Type == stream.Status && json.Unmarshal(ev.Payload, &p) == nil && p["status"] == status {
			return p
		}
	}
	return nil
}

func eventsOfType(evs []stream.Event, typ stream.Type) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Type == typ {
			b.WriteString("  " + string(ev.Payload) + "\n")
		}
	}
	return b.String()
}

// TestClaudeStreamChanges: the check TestRunClaudeCode makes of the real
// CLI's output passes a stream the adapter knows and names each change in
// one it does not.
func TestClaudeStreamChanges(t *testing.T) {
	const (
		init   = `{"type":"system","subtype":"init","session_id":"s1","claude_code_version":"9.9.9"}`
		text   = `{"type":"assistant","message":{"id":"m1","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"done"}]}}`
		result = `{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"done","session_id":"s1"}`
	)
	tests := []struct {
		name    string
		version string
		lines   []string
		want    []string // each change must contain its string, in order
	}{
		{"known", "9.9.9", []string{init, `{"type":"rate_limit_event"}`, text, result}, nil},
		{"changed", "9.9.10", []string{init, `{"type":"brand_new"}`, `{"type":"system","subtype":"hook_started"}`,
			`{"type":"assistant","message":"text"}`, text, `{"type":"result","subtype":"success","is_error":true}`},
			[]string{"1 stdout lines the adapter could not read", `kind "brand_new"`, `subtype "hook_started"`,
				"claude_code_version 9.9.9, want 9.9.10", "want a session id, completed"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var evs []stream.Event
			sum, err := (&adapter.ClaudeCode{}).Run(adapter.IDs{Session: "x", Execution: "y"},
				strings.NewReader(strings.Join(tc.lines, "\n")+"\n"), strings.NewReader(""), func(ev stream.Event) { evs = append(evs, ev) })
			if err != nil {
				t.Fatal(err)
			}
			got := claudeStreamChanges(tc.version, sum, evs)
			if len(got) != len(tc.want) {
				t.Fatalf("claudeStreamChanges = %d changes, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "claude "+tc.version) {
					t.Errorf("change %d = %q, want it to name claude %s and say %q", i, got[i], tc.version, w)
				}
			}
		})
	}
}
