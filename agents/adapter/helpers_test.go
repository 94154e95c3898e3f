package adapter

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"hearth/agents/stream"
)

var testIDs = IDs{Session: "session-a8f3e2", Execution: "exec-1"}

// run runs a over stdout and stderr and returns the events and summary. The
// emit callback appends without a lock: the race detector checks that
// adapters never call it concurrently.
func run(t *testing.T, a Adapter, stdout, stderr io.Reader) ([]stream.Event, Summary) {
	t.Helper()
	var evs []stream.Event
	sum, err := a.Run(testIDs, stdout, stderr, func(ev stream.Event) { evs = append(evs, ev) })
	if err != nil {
		t.Fatalf("Run() error = %v", err)
	}
	for _, ev := range evs {
		if ev.Session != testIDs.Session || ev.Execution != testIDs.Execution {
			t.Errorf("event %s has ids %q/%q, want %q/%q", ev.Type, ev.Session, ev.Execution, testIDs.Session, testIDs.Execution)
		}
		if !json.Valid(ev.Payload) {
			t.Errorf("event %s payload %q is not JSON", ev.Type, ev.Payload)
		}
	}
	return evs, sum
}

func payload(t *testing.T, ev stream.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(ev.Payload, &m); err != nil {
		t.Fatalf("payload of %s: %v", ev.Type, err)
	}
	return m
}

// describe renders an event as a short line for comparing sequences.
func describe(t *testing.T, ev stream.Event) string {
	p := payload(t, ev)
	switch ev.Type {
	case stream.Status:
		return fmt.Sprintf("status %v %v", p["status"], p["outcome"])
	case stream.Text:
		if k, ok := p["kind"]; ok {
			return fmt.Sprintf("text[%v] %v", k, p["text"])
		}
		return fmt.Sprintf("text %v", p["text"])
	case stream.ToolCall:
		in, _ := json.Marshal(p["input"])
		return fmt.Sprintf("tool_call %v %v %s", p["id"], p["name"], in)
	case stream.ToolResult:
		return fmt.Sprintf("tool_result %v %q is_error=%v truncated=%v", p["id"], p["output"], p["is_error"], p["truncated"])
	case stream.Error:
		return fmt.Sprintf("error %v line %v", p["stream"], p["line"])
	case stream.Output:
		return fmt.Sprintf("output %v %v", p["stream"], p["line"])
	case stream.Retry:
		return fmt.Sprintf("retry %v/%v status=%v delay_ms=%v error=%v", p["attempt"], p["max_retries"], p["status"], p["delay_ms"], p["error"])
	case stream.System:
		b, _ := json.Marshal(p["payload"])
		return fmt.Sprintf("system %v %s truncated=%v", p["subtype"], b, p["truncated"])
	}
	return string(ev.Type)
}

func describeAll(t *testing.T, evs []stream.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = describe(t, ev)
	}
	return out
}

func diffLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\ngot:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }
