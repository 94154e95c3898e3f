package adapter

import (
	"encoding/json"
	"io"
	"strings"

	"hearth/agents/stream"
)

// Gemini reads `gemini -p TASK --output-format stream-json` output (Gemini
// CLI 0.61.0): init, message, tool_use, tool_result, error and result lines.
// The zero value is ready to use; one value may run any number of
// executions, concurrently too.
type Gemini struct {
	MaxLine       int // longest stdout or stderr line accepted; 0 means DefaultMaxLine
	MaxToolOutput int // bytes of tool output per tool_result event; 0 means DefaultMaxToolOutput
}

var _ Adapter = (*Gemini)(nil)

// Run implements Adapter. Events, in stdout order:
//
//	init                         status {status: agent_started, cli: gemini, agent_session_id: session_id, model}
//	message (assistant)          text {text}: consecutive delta lines joined into one event
//	tool_use                     tool_call {id: tool_id, name: tool_name, input: parameters}
//	tool_result                  tool_result {id: tool_id, output (or the error's message), is_error: status error}
//	error (severity error)       error {message, stream: stdout, line}
//	error (severity warning)     warning {message}
//	result                       status {status: agent_finished, outcome: completed (status success) or failed, error, cli_usage, duration_ms}; failed, after an error {message}
//	bad or long line             error {message, stream, line, snippet | bytes}
//	stderr line                  output {stream: stderr, line}
//
// The user's own message line is skipped and counted, as are lines of
// other types. The session id for `--resume ID` is init's session_id.
func (g *Gemini) Run(ids IDs, stdout, stderr io.Reader, emit func(stream.Event)) (Summary, error) {
	return runJSONL(ids, g.MaxLine, stdout, stderr, emit, func(s *sink) (*jsonl, func(int, []byte), func()) {
		p := &geminiParser{j: newJSONL(s, g.MaxToolOutput)}
		return p.j, p.line, p.flush
	})
}

type geminiParser struct {
	j       *jsonl
	pending strings.Builder // assistant deltas not yet reported
}

type geminiLine struct {
	SessionID  string          `json:"session_id"`
	Model      string          `json:"model"`
	Role       string          `json:"role"`
	Content    string          `json:"content"`
	Delta      bool            `json:"delta"`
	ToolName   string          `json:"tool_name"`
	ToolID     string          `json:"tool_id"`
	Parameters json.RawMessage `json:"parameters"`
	Status     string          `json:"status"`
	Output     *string         `json:"output"`
	Severity   string          `json:"severity"`
	Message    string          `json:"message"`
	Error      *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	Stats *struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
		Cached       int64 `json:"cached"`
		DurationMS   int64 `json:"duration_ms"`
	} `json:"stats"`
}

func (p *geminiParser) line(n int, b []byte) {
	typ, ok := p.j.typeOf(n, b)
	if !ok {
		return
	}
	switch typ {
	case "init", "message", "tool_use", "tool_result", "error", "result":
	default:
		p.j.sum.ignore(typ)
		return
	}
	var l geminiLine
	if err := json.Unmarshal(b, &l); err != nil {
		p.flush()
		p.j.malformed(n, b, "has an unexpected "+typ+" shape", err)
		return
	}
	if typ == "message" && l.Role == "assistant" {
		p.pending.WriteString(l.Content)
		if !l.Delta {
			p.flush()
		}
		return
	}
	p.flush()
	switch typ {
	case "init":
		p.j.start("gemini", l.SessionID, l.Model)
	case "message":
		p.j.sum.ignore("message/" + l.Role)
	case "tool_use":
		p.j.toolCall(l.ToolID, l.ToolName, l.Parameters)
	case "tool_result":
		out := ""
		if l.Output != nil {
			out = *l.Output
		}
		if out == "" && l.Error != nil {
			out = l.Error.Message
		}
		p.j.toolResult(l.ToolID, out, l.Status == "error")
	case "error":
		if l.Severity == "warning" {
			p.j.warning(l.Message)
		} else {
			p.j.agentError(n, l.Message)
		}
	case "result":
		var u *Usage
		var dur int64
		if l.Stats != nil {
			// input_tokens counts the cached ones too, as Gemini's API does.
			u = &Usage{InputTokens: nonNeg(l.Stats.InputTokens), OutputTokens: nonNeg(l.Stats.OutputTokens), CacheReadTokens: nonNeg(l.Stats.Cached)}
			dur = nonNeg(l.Stats.DurationMS)
		}
		if l.Status == "success" {
			p.j.finish(Completed, "success", "", u, dur)
			return
		}
		msg := "the run failed (status " + l.Status + ")"
		if l.Error != nil && l.Error.Message != "" {
			msg = l.Error.Message
		}
		p.j.agentError(n, msg)
		p.j.finish(Failed, "error", msg, u, dur)
	}
}

// flush reports the assistant text gathered so far as one text event.
func (p *geminiParser) flush() {
	if p.pending.Len() == 0 {
		return
	}
	t := p.pending.String()
	p.pending.Reset()
	p.j.text(t, "", "")
}
