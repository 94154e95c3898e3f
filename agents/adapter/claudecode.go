package adapter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"hearth/agents/stream"
)

// DefaultMaxToolOutput is how much of a tool result's output a tool_result
// event carries; the rest is cut and the event says so.
const DefaultMaxToolOutput = 64 << 10

// snippetSize is how much of a malformed line an error event quotes.
const snippetSize = 200

// ClaudeCode reads the Claude Code CLI's `--output-format stream-json
// --verbose` output. The zero value is ready to use; one value may run any
// number of executions, concurrently too.
type ClaudeCode struct {
	MaxLine       int // longest stdout or stderr line accepted; 0 means DefaultMaxLine
	MaxToolOutput int // bytes of tool output per tool_result event; 0 means DefaultMaxToolOutput
	// Thinking makes thinking blocks text events with kind "thinking";
	// by default they are skipped (and counted in Summary.Ignored).
	Thinking bool
}

var _ Adapter = (*ClaudeCode)(nil)

// Run implements Adapter. Events, in stdout order:
//
//	system/init        status {status: agent_started, agent_session_id, model, cwd, tools, claude_code_version, permission_mode, mcp_servers [{name, status}], skills}
//	system/api_retry   retry {attempt, max_retries, status, delay_ms, error}
//	system/other       system {subtype, payload} (payload: the line less type, subtype, session_id, uuid; cut past 4 KiB)
//	assistant text     text {text, message_id}
//	assistant thinking text {text, kind: thinking, message_id} if c.Thinking
//	assistant tool_use tool_call {id, name, input, message_id}
//	user tool_result   tool_result {id, output, is_error, truncated, output_bytes}
//	result             status {status: agent_finished, outcome, subtype, is_error, num_turns, terminal_reason, cli_estimate_usd}
//	bad or long line   error {message, stream, line, snippet | bytes}
//	stderr line        output {stream: stderr, line}
//
// Assistant and user events carry parent_tool_use_id when a subagent
// produced them. A content block repeated under the same message id (the
// CLI reprints messages as they stream) is reported once.
func (c *ClaudeCode) Run(ids IDs, stdout, stderr io.Reader, emit func(stream.Event)) (Summary, error) {
	s := &sink{ids: ids, emit: emit}
	p := newCCParser(s, c.MaxToolOutput, c.Thinking)
	var stderrLines, stderrLong int
	err := pump(s, c.MaxLine, stdout, stderr,
		lineFuncs{
			line: p.line,
			tooLong: func(n int, size int64) {
				p.sum.StdoutLines++
				p.sum.Malformed++
				tooLongEvent(s, "stdout", c.MaxLine, n, size)
			},
		},
		(&Plain{MaxLine: c.MaxLine}).funcs(s, "stderr", &stderrLines, &stderrLong))
	return p.finish(stderrLines, stderrLong), err
}

// ccParser holds one run's state; only the stdout goroutine touches it.
type ccParser struct {
	s         *sink
	maxOutput int
	thinking  bool
	sum       Summary
	usage     map[string]Usage // per message id, field-wise max
	anonUsage Usage            // messages without an id, counted per line
	anonMsgs  int
	seen      map[[32]byte]struct{} // content blocks already reported
	result    bool
}

func newCCParser(s *sink, maxOutput int, thinking bool) *ccParser {
	if maxOutput <= 0 {
		maxOutput = DefaultMaxToolOutput
	}
	return &ccParser{
		s: s, maxOutput: maxOutput, thinking: thinking,
		usage: make(map[string]Usage), seen: make(map[[32]byte]struct{}),
	}
}

// envelope is the part every line shares.
type envelope struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
}

func (p *ccParser) line(n int, b []byte) {
	p.sum.StdoutLines++
	if len(bytes.TrimSpace(b)) == 0 {
		return
	}
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		p.malformed(n, b, "is not a JSON object", err)
		return
	}
	var err error
	switch env.Type {
	case "system":
		err = p.system(b, env.Subtype)
	case "assistant":
		err = p.assistant(n, b)
	case "user":
		err = p.user(n, b)
	case "result":
		err = p.resultLine(b)
	default: // stream_event, rate_limit_event, and whatever comes next
		p.sum.ignore(kindOf(env))
	}
	if err != nil {
		p.malformed(n, b, "has an unexpected "+kindOf(env)+" shape", err)
	}
}

func kindOf(env envelope) string {
	t := env.Type
	if t == "" {
		t = "untyped"
	}
	if env.Subtype != "" && (t == "system" || t == "result") {
		return t + "/" + env.Subtype
	}
	return t
}

func (p *ccParser) malformed(n int, b []byte, what string, err error) {
	p.sum.Malformed++
	p.s.send(stream.Error, errorPayload{
		Message: fmt.Sprintf("stdout line %d %s: %v", n, what, err),
		Stream:  "stdout", Line: n, Snippet: snippet(b, snippetSize),
	})
}

// snippet is at most max bytes of b's start, as valid UTF-8.
func snippet(b []byte, max int) string {
	if len(b) > max {
		b = b[:max]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// cut shortens s to at most max bytes without splitting a UTF-8 sequence.
func cut(s string, max int) (string, bool) {
	if len(s) <= max {
		return s, false
	}
	i := max
	for i > 0 && i > max-utf8.UTFMax && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i], true
}

func (p *ccParser) finish(stderrLines, stderrLong int) Summary {
	sum := p.sum
	sum.StderrLines = stderrLines
	sum.Malformed += stderrLong
	sum.Usage = p.anonUsage
	for _, u := range p.usage {
		sum.Usage = sum.Usage.Add(u)
	}
	sum.Messages = len(p.usage) + p.anonMsgs
	if !p.result {
		sum.Status = NoResult
	}
	return sum
}
