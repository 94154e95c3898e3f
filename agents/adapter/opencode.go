package adapter

import (
	"encoding/json"
	"io"

	"hearth/agents/stream"
)

// OpenCode reads `opencode run --format json` output (OpenCode 1.18.33):
// step_start, text, reasoning, tool_use, step_finish and error lines, each
// with the session id and a message part. The zero value is ready to use;
// one value may run any number of executions, concurrently too.
type OpenCode struct {
	MaxLine       int // longest stdout or stderr line accepted; 0 means DefaultMaxLine
	MaxToolOutput int // bytes of tool output per tool_result event; 0 means DefaultMaxToolOutput
	// Thinking makes reasoning parts text events with kind "thinking"; by
	// default they are skipped (and counted in Summary.Ignored).
	Thinking bool
}

var _ Adapter = (*OpenCode)(nil)

// Run implements Adapter. Events, in stdout order:
//
//	first line with a sessionID   status {status: agent_started, cli: opencode, agent_session_id: sessionID}
//	text                          text {text, message_id}
//	reasoning                     text {text, kind: thinking, message_id} if o.Thinking
//	tool_use                      tool_call {id: callID, name: tool, input: state.input}, then tool_result {id, output: state.output (or state.error), is_error: state.status error}
//	error                         error {message, stream: stdout, line}
//	end of stdout                 status {status: agent_finished, outcome, error, cli_usage}
//	bad or long line              error {message, stream, line, snippet | bytes}
//	stderr line                   output {stream: stderr, line}
//
// OpenCode prints no line when a run ends, so the outcome is decided at the
// end of stdout: failed after an error line; completed when the last
// step_finish's reason is not "tool-calls" (the model answered and stopped);
// otherwise no_result (no agent_finished event). step_start is skipped and
// counted; each step_finish counts one model response in Summary.Messages
// and its tokens in the CLI's usage. The session id for `--session ID` is
// any line's sessionID.
func (o *OpenCode) Run(ids IDs, stdout, stderr io.Reader, emit func(stream.Event)) (Summary, error) {
	return runJSONL(ids, o.MaxLine, stdout, stderr, emit, func(s *sink) (*jsonl, func(int, []byte), func()) {
		p := &openCodeParser{j: newJSONL(s, o.MaxToolOutput), thinking: o.Thinking}
		return p.j, p.line, p.end
	})
}

type openCodeParser struct {
	j          *jsonl
	thinking   bool
	usage      Usage
	steps      int
	lastReason string
	errMsg     string
}

type openCodeLine struct {
	SessionID string `json:"sessionID"`
	Part      *struct {
		MessageID string `json:"messageID"`
		Text      string `json:"text"`
		Tool      string `json:"tool"`
		CallID    string `json:"callID"`
		Reason    string `json:"reason"`
		State     *struct {
			Status string          `json:"status"`
			Input  json.RawMessage `json:"input"`
			Output string          `json:"output"`
			Error  string          `json:"error"`
		} `json:"state"`
		Tokens *struct {
			Input     int64 `json:"input"`
			Output    int64 `json:"output"`
			Reasoning int64 `json:"reasoning"`
			Cache     struct {
				Read  int64 `json:"read"`
				Write int64 `json:"write"`
			} `json:"cache"`
		} `json:"tokens"`
	} `json:"part"`
	Error *struct {
		Name string `json:"name"`
		Data *struct {
			Message string `json:"message"`
		} `json:"data"`
	} `json:"error"`
}

func (p *openCodeParser) line(n int, b []byte) {
	typ, ok := p.j.typeOf(n, b)
	if !ok {
		return
	}
	switch typ {
	case "step_start", "text", "reasoning", "tool_use", "step_finish", "error":
	default:
		p.j.sum.ignore(typ)
		return
	}
	var l openCodeLine
	if err := json.Unmarshal(b, &l); err != nil {
		p.j.malformed(n, b, "has an unexpected "+typ+" shape", err)
		return
	}
	if l.SessionID != "" {
		p.j.start("opencode", l.SessionID, "")
	}
	if typ == "error" {
		msg := "opencode reported an error"
		if l.Error != nil {
			msg = l.Error.Name
			if l.Error.Data != nil && l.Error.Data.Message != "" {
				msg = l.Error.Data.Message
			}
		}
		p.errMsg = msg
		p.j.agentError(n, msg)
		return
	}
	if l.Part == nil {
		p.j.malformed(n, b, "has no part", errMissing)
		return
	}
	pt := l.Part
	switch typ {
	case "step_start":
		p.j.sum.ignore(typ)
	case "text":
		p.j.text(pt.Text, "", pt.MessageID)
	case "reasoning":
		if p.thinking {
			p.j.text(pt.Text, "thinking", pt.MessageID)
		} else {
			p.j.sum.ignore(typ)
		}
	case "tool_use":
		if pt.State == nil {
			p.j.malformed(n, b, "has no tool state", errMissing)
			return
		}
		p.j.toolCall(pt.CallID, pt.Tool, pt.State.Input)
		out := pt.State.Output
		if pt.State.Status == "error" && out == "" {
			out = pt.State.Error
		}
		p.j.toolResult(pt.CallID, out, pt.State.Status == "error")
	case "step_finish":
		p.steps++
		p.lastReason = pt.Reason
		if t := pt.Tokens; t != nil {
			p.usage = p.usage.Add(Usage{InputTokens: nonNeg(t.Input), OutputTokens: nonNeg(t.Output),
				CacheReadTokens: nonNeg(t.Cache.Read), CacheCreationTokens: nonNeg(t.Cache.Write)})
		}
	}
}

func (p *openCodeParser) end() {
	p.j.sum.Messages = p.steps
	var u *Usage
	if p.steps > 0 {
		u = &p.usage
	}
	switch {
	case p.errMsg != "":
		p.j.finish(Failed, "error", p.errMsg, u, 0)
	case p.steps > 0 && p.lastReason != "tool-calls":
		p.j.finish(Completed, p.lastReason, "", u, 0)
	default:
		p.j.sum.ResultUsage = u
	}
}
