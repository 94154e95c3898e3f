package adapter

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"

	"hearth/agents/stream"
)

// jsonl is what the Codex, OpenCode and Gemini CLI adapters share: one JSON
// object per stdout line, with a "type" member. Lines of a type an adapter
// does not know are skipped and counted in Summary.Ignored under their type
// (a CLI upgrade that adds events loses nothing the run depends on; the
// count shows what was skipped). A line that is not a JSON object, or a known
// type of the wrong shape, is an error event and counts as Malformed.
type jsonl struct {
	s         *sink
	maxOutput int
	sum       Summary
	started   bool
	finished  bool
}

func newJSONL(s *sink, maxOutput int) *jsonl {
	if maxOutput <= 0 {
		maxOutput = DefaultMaxToolOutput
	}
	return &jsonl{s: s, maxOutput: maxOutput}
}

// runJSONL reads stdout with line (after counting it and skipping blank
// lines) and stderr as output events, then calls end, which may emit.
func runJSONL(ids IDs, maxLine int, stdout, stderr io.Reader, emit func(stream.Event),
	newParser func(s *sink) (*jsonl, func(n int, b []byte), func())) (Summary, error) {
	s := &sink{ids: ids, emit: emit}
	j, line, end := newParser(s)
	var stderrLines, stderrLong int
	err := pump(s, maxLine, stdout, stderr,
		lineFuncs{
			line: func(n int, b []byte) {
				j.sum.StdoutLines++
				if len(bytes.TrimSpace(b)) == 0 {
					return
				}
				line(n, b)
			},
			tooLong: func(n int, size int64) {
				j.sum.StdoutLines++
				j.sum.Malformed++
				tooLongEvent(s, "stdout", maxLine, n, size)
			},
		},
		(&Plain{MaxLine: maxLine}).funcs(s, "stderr", &stderrLines, &stderrLong))
	end()
	sum := j.sum
	sum.StderrLines = stderrLines
	sum.Malformed += stderrLong
	if !j.finished {
		sum.Status = NoResult
	}
	return sum, err
}

// typeOf decodes a line's "type"; ok is false (and an error event sent) for
// a line that is not a JSON object with a string type.
func (j *jsonl) typeOf(n int, b []byte) (string, bool) {
	var env struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		j.malformed(n, b, "is not a JSON object", err)
		return "", false
	}
	if env.Type == nil {
		j.sum.ignore("untyped")
		return "", false
	}
	return *env.Type, true
}

func (j *jsonl) malformed(n int, b []byte, what string, err error) {
	j.sum.Malformed++
	j.s.send(stream.Error, errorPayload{
		Message: "stdout line " + strconv.Itoa(n) + " " + what + ": " + err.Error(),
		Stream:  "stdout", Line: n, Snippet: snippet(b, snippetSize),
	})
}

// jsonlStarted is the agent_started status of the JSONL adapters.
type jsonlStarted struct {
	Status         string `json:"status"`
	CLI            string `json:"cli"`
	AgentSessionID string `json:"agent_session_id"`
	Model          string `json:"model,omitempty"`
}

// start reports the CLI's session id once, the first time it is seen.
func (j *jsonl) start(cli, sessionID, model string) {
	if j.started {
		return
	}
	j.started = true
	j.sum.AgentSessionID = sessionID
	j.sum.Model = model
	j.s.send(stream.Status, jsonlStarted{Status: "agent_started", CLI: cli, AgentSessionID: sessionID, Model: model})
}

// jsonlFinished is the agent_finished status of the JSONL adapters.
type jsonlFinished struct {
	Status  string `json:"status"`
	Outcome Status `json:"outcome"`
	Subtype string `json:"subtype,omitempty"`
	IsError bool   `json:"is_error"`
	Error   string `json:"error,omitempty"`
	// Usage is the CLI's own token count for the run: its view, never a
	// model_call (the gateway meters the calls).
	Usage      *Usage `json:"cli_usage,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
}

// finish records how the CLI said the run ended; only the first terminal
// line counts, a later one is ignored as "repeated/<subtype>".
func (j *jsonl) finish(outcome Status, subtype, errMsg string, usage *Usage, durationMS int64) {
	if j.finished {
		j.sum.ignore("repeated/" + subtype)
		return
	}
	j.finished = true
	j.sum.Status = outcome
	j.sum.Subtype = subtype
	j.sum.IsError = outcome == Failed
	if errMsg != "" {
		j.sum.Result = errMsg
	}
	j.sum.ResultUsage = usage
	j.sum.DurationMS = durationMS
	j.s.send(stream.Status, jsonlFinished{Status: "agent_finished", Outcome: outcome, Subtype: subtype,
		IsError: outcome == Failed, Error: errMsg, Usage: usage, DurationMS: durationMS})
}

// text reports text the agent wrote; the last one is the run's result.
func (j *jsonl) text(text, kind, messageID string) {
	if text == "" {
		return
	}
	if kind == "" {
		j.sum.Result = text
	}
	j.s.send(stream.Text, textPayload{Text: text, Kind: kind, MessageID: messageID})
}

func (j *jsonl) toolCall(id, name string, input json.RawMessage) {
	if len(input) == 0 || !json.Valid(input) {
		input = json.RawMessage("null")
	}
	j.s.send(stream.ToolCall, toolCallPayload{ID: id, Name: name, Input: input})
}

func (j *jsonl) toolResult(id, output string, isError bool) {
	ev := toolResultPayload{ID: id, IsError: isError}
	ev.Output, ev.Truncated = cut(output, j.maxOutput)
	if ev.Truncated {
		ev.OutputBytes = len(output)
	}
	ev.Output = toValidUTF8(ev.Output)
	j.s.send(stream.ToolResult, ev)
}

// agentError reports an error the CLI printed on stdout (not a bad line).
func (j *jsonl) agentError(n int, msg string) {
	j.s.send(stream.Error, errorPayload{Message: msg, Stream: "stdout", Line: n})
}

func (j *jsonl) warning(msg string) {
	j.s.send(stream.Warning, map[string]string{"message": msg})
}

func toValidUTF8(s string) string { return string(bytes.ToValidUTF8([]byte(s), []byte("\uFFFD"))) }
