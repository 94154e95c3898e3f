package adapter

import (
	"strings"
	"testing"
)

// testAdapter is the behaviour every Adapter shares, whatever it parses.
func testAdapter(t *testing.T, newAdapter func(maxLine int) Adapter) {
	t.Run("stderr lines are output events", func(t *testing.T) {
		evs, sum := run(t, newAdapter(0), strings.NewReader(""), strings.NewReader("one\ntwo\r\n"))
		diffLines(t, "events", describeAll(t, evs), []string{"output stderr one", "output stderr two"})
		if sum.StderrLines != 2 {
			t.Errorf("StderrLines = %d, want 2", sum.StderrLines)
		}
	})
	t.Run("long stderr line is an error event", func(t *testing.T) {
		evs, sum := run(t, newAdapter(8), strings.NewReader(""), strings.NewReader("0123456789\nok\n"))
		diffLines(t, "events", describeAll(t, evs), []string{"error stderr line 1", "output stderr ok"})
		if sum.Malformed != 1 {
			t.Errorf("Malformed = %d, want 1", sum.Malformed)
		}
	})
	t.Run("nil readers", func(t *testing.T) {
		evs, _ := run(t, newAdapter(0), nil, nil)
		if len(evs) != 0 {
			t.Errorf("got %d events from nothing, want 0", len(evs))
		}
	})
	t.Run("busy streams at once", func(t *testing.T) {
		// run's emit appends without a lock: -race catches concurrent calls.
		in := strings.Repeat("line\n", 2000)
		evs, sum := run(t, newAdapter(0), strings.NewReader(in), strings.NewReader(in))
		if sum.StderrLines != 2000 || sum.StdoutLines != 2000 || len(evs) < 2000 {
			t.Errorf("StdoutLines, StderrLines, events = %d, %d, %d; want 2000, 2000, >= 2000", sum.StdoutLines, sum.StderrLines, len(evs))
		}
	})
}

func TestConformanceClaudeCode(t *testing.T) {
	testAdapter(t, func(maxLine int) Adapter { return &ClaudeCode{MaxLine: maxLine} })
}

func TestConformancePlain(t *testing.T) {
	testAdapter(t, func(maxLine int) Adapter { return &Plain{MaxLine: maxLine} })
}
