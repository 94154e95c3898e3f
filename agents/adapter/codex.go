package adapter

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"

	"hearth/agents/stream"
)

// Codex reads `codex exec --json` output (Codex CLI 0.169.0): thread, turn
// and item events, one JSON object per line. The zero value is ready to use;
// one value may run any number of executions, concurrently too.
type Codex struct {
	MaxLine       int // longest stdout or stderr line accepted; 0 means DefaultMaxLine
	MaxToolOutput int // bytes of tool output per tool_result event; 0 means DefaultMaxToolOutput
	// Thinking makes reasoning items text events with kind "thinking"; by
	// default they are skipped (and counted in Summary.Ignored).
	Thinking bool
}

var _ Adapter = (*Codex)(nil)

// Run implements Adapter. Events, in stdout order:
//
//	thread.started                          status {status: agent_started, cli: codex, agent_session_id: thread_id}
//	item agent_message (completed)          text {text}
//	item reasoning (completed)              text {text, kind: thinking} if c.Thinking
//	item command_execution (started)        tool_call {id, name: command_execution, input: {command}}
//	item command_execution (completed)      tool_result {id, output: aggregated_output, is_error: exit code not 0 or status not completed}
//	item mcp_tool_call (started/completed)  tool_call {id, name: mcp__SERVER__TOOL, input: arguments}, tool_result {output: result content or error}
//	item file_change (completed)            tool_call {id, name: file_change, input: {changes}}, tool_result {output: "KIND PATH" lines}
//	item web_search (completed)             tool_call {id, name: web_search, input: {query}}
//	error "Reconnecting... N/M (REASON)"    retry {attempt: N, max_retries: M, error: REASON} (Summary.Retries counts them)
//	item error, other error line            error {message, stream: stdout, line}
//	turn.completed                          status {status: agent_finished, outcome: completed, cli_usage}
//	turn.failed                             status {status: agent_finished, outcome: failed, error}
//	bad or long line                        error {message, stream, line, snippet | bytes}
//	stderr line                             output {stream: stderr, line}
//
// A tool call is reported once, when its item starts or, if no start was
// seen, when it completes. turn.started, item.updated, and items of other
// types (todo_list, plan, collab_tool_call, ...) are skipped and counted.
// The session id for `codex exec resume ID` is thread.started's thread_id.
func (c *Codex) Run(ids IDs, stdout, stderr io.Reader, emit func(stream.Event)) (Summary, error) {
	return runJSONL(ids, c.MaxLine, stdout, stderr, emit, func(s *sink) (*jsonl, func(int, []byte), func()) {
		p := &codexParser{j: newJSONL(s, c.MaxToolOutput), thinking: c.Thinking, called: make(map[string]bool)}
		return p.j, p.line, func() {}
	})
}

type codexParser struct {
	j        *jsonl
	thinking bool
	called   map[string]bool // item ids whose tool_call was sent
}

type codexLine struct {
	ThreadID string     `json:"thread_id"`
	Message  string     `json:"message"`
	Item     *codexItem `json:"item"`
	Usage    *struct {
		InputTokens       int64 `json:"input_tokens"`
		CachedInputTokens int64 `json:"cached_input_tokens"`
		OutputTokens      int64 `json:"output_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

type codexItem struct {
	ID               string          `json:"id"`
	Type             string          `json:"type"`
	Text             string          `json:"text"`
	Message          string          `json:"message"`
	Command          string          `json:"command"`
	AggregatedOutput string          `json:"aggregated_output"`
	ExitCode         *int64          `json:"exit_code"`
	Status           string          `json:"status"`
	Changes          json.RawMessage `json:"changes"`
	Server           string          `json:"server"`
	Tool             string          `json:"tool"`
	Arguments        json.RawMessage `json:"arguments"`
	Result           *struct {
		Content           []json.RawMessage `json:"content"`
		StructuredContent json.RawMessage   `json:"structured_content"`
	} `json:"result"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
	Query string `json:"query"`
}

func (p *codexParser) line(n int, b []byte) {
	typ, ok := p.j.typeOf(n, b)
	if !ok {
		return
	}
	var l codexLine
	known := true
	switch typ {
	case "thread.started", "turn.completed", "turn.failed", "error", "item.started", "item.completed":
	default:
		known = false
	}
	if !known {
		p.j.sum.ignore(typ)
		return
	}
	if err := json.Unmarshal(b, &l); err != nil {
		p.j.malformed(n, b, "has an unexpected "+typ+" shape", err)
		return
	}
	switch typ {
	case "thread.started":
		p.j.start("codex", l.ThreadID, "")
	case "turn.completed":
		var u *Usage
		if l.Usage != nil {
			u = &Usage{InputTokens: nonNeg(l.Usage.InputTokens), OutputTokens: nonNeg(l.Usage.OutputTokens), CacheReadTokens: nonNeg(l.Usage.CachedInputTokens)}
		}
		p.j.sum.NumTurns++
		p.j.finish(Completed, "turn.completed", "", u, 0)
	case "turn.failed":
		msg := "the turn failed"
		if l.Error != nil && l.Error.Message != "" {
			msg = l.Error.Message
		}
		p.j.sum.NumTurns++
		p.j.finish(Failed, "turn.failed", msg, nil, 0)
	case "error":
		if r, ok := codexRetry(l.Message); ok {
			p.j.sum.Retries++
			p.j.s.send(stream.Retry, r)
			return
		}
		p.j.agentError(n, l.Message)
	case "item.started", "item.completed":
		if l.Item == nil {
			p.j.malformed(n, b, "has no item", errMissing)
			return
		}
		p.item(n, l.Item, typ == "item.completed")
	}
}

func (p *codexParser) item(n int, it *codexItem, completed bool) {
	kind := "item/" + it.Type
	switch it.Type {
	case "agent_message":
		if completed {
			p.j.text(it.Text, "", it.ID)
			return
		}
	case "reasoning":
		if completed && p.thinking {
			p.j.text(it.Text, "thinking", it.ID)
			return
		}
	case "command_execution":
		in, _ := json.Marshal(map[string]string{"command": it.Command})
		p.call(it.ID, "command_execution", in)
		if completed {
			failed := it.Status != "completed" || (it.ExitCode != nil && *it.ExitCode != 0)
			p.j.toolResult(it.ID, it.AggregatedOutput, failed)
		}
		return
	case "mcp_tool_call":
		p.call(it.ID, "mcp__"+it.Server+"__"+it.Tool, it.Arguments)
		if completed {
			switch {
			case it.Error != nil:
				p.j.toolResult(it.ID, it.Error.Message, true)
			case it.Result != nil:
				out, _ := json.Marshal(it.Result.Content)
				p.j.toolResult(it.ID, string(out), it.Status == "failed")
			default:
				p.j.toolResult(it.ID, "", it.Status == "failed")
			}
		}
		return
	case "file_change":
		if completed {
			var changes []struct {
				Path string `json:"path"`
				Kind string `json:"kind"`
			}
			_ = json.Unmarshal(it.Changes, &changes) // a shape we do not know still shows as the input
			in, _ := json.Marshal(map[string]json.RawMessage{"changes": orNull(it.Changes)})
			p.call(it.ID, "file_change", in)
			var out strings.Builder
			for _, c := range changes {
				out.WriteString(c.Kind + " " + c.Path + "\n")
			}
			p.j.toolResult(it.ID, out.String(), it.Status != "completed")
			return
		}
	case "web_search":
		if completed {
			in, _ := json.Marshal(map[string]string{"query": it.Query})
			p.call(it.ID, "web_search", in)
			return
		}
	case "error":
		if completed {
			p.j.agentError(n, it.Message)
			return
		}
	}
	if !completed {
		kind = "item.started/" + it.Type
	}
	p.j.sum.ignore(kind)
}

func (p *codexParser) call(id, name string, input json.RawMessage) {
	if p.called[id] {
		return
	}
	p.called[id] = true
	p.j.toolCall(id, name, input)
}

func orNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return r
}

func nonNeg(n int64) int64 {
	if n < 0 {
		return 0
	}
	return n
}

type missingError struct{}

func (missingError) Error() string { return "a required member is missing" }

var errMissing error = missingError{}

// codexRetry reads the error line Codex prints before it retries a model
// call: "Reconnecting... 2/5 (unexpected status 503 ...)".
func codexRetry(msg string) (retryPayload, bool) {
	rest, ok := strings.CutPrefix(msg, "Reconnecting... ")
	if !ok {
		return retryPayload{}, false
	}
	counts, reason, _ := strings.Cut(rest, " ")
	a, m, ok := strings.Cut(counts, "/")
	if !ok {
		return retryPayload{}, false
	}
	attempt, err1 := strconv.ParseInt(a, 10, 64)
	max, err2 := strconv.ParseInt(m, 10, 64)
	if err1 != nil || err2 != nil || attempt < 0 || max < 0 {
		return retryPayload{}, false
	}
	reason = strings.TrimSuffix(strings.TrimPrefix(reason, "("), ")")
	return retryPayload{Attempt: attempt, MaxRetries: max, Error: reason}, true
}
