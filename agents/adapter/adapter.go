package adapter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"hearth/agents/stream"
)

// DefaultMaxLine is the longest line an adapter accepts; a longer one
// becomes an error event. A tool result that reads a big file arrives as one
// line, hence the generous size.
const DefaultMaxLine = 16 << 20

// IDs names the execution the events belong to.
type IDs struct {
	Session   string
	Execution string
}

// Adapter reads one agent process's output.
type Adapter interface {
	// Run reads stdout and stderr concurrently, line by line, until both
	// reach EOF, calling emit once per event with ids set. emit is never
	// called concurrently, and not after Run returns. A nil stderr reads as
	// empty. Run does not stop on malformed input; it returns an error only
	// when a reader fails (other than io.EOF), after reporting it as an error
	// event, and the Summary is valid even then. To stop Run early, close
	// the readers (or kill the process that writes them): a blocked Read
	// cannot be interrupted, so Run takes no context.
	Run(ids IDs, stdout, stderr io.Reader, emit func(stream.Event)) (Summary, error)
}

// Status is how the agent said it ended: a hint for the caller, which also
// knows the exit code, the budgets and the wall clock.
type Status string

const (
	Unknown   Status = ""          // the adapter cannot tell (Plain: the exit code decides)
	Completed Status = "completed" // a result line with subtype success and is_error false
	Failed    Status = "failed"    // a result line with an error subtype or is_error true
	NoResult  Status = "no_result" // the stream ended without a result line (killed, crashed)
)

// Usage counts tokens.
type Usage struct {
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	CacheReadTokens     int64 `json:"cache_read_tokens"`
	CacheCreationTokens int64 `json:"cache_creation_tokens"`
}

// Add returns the field-wise sum of u and v.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:         u.InputTokens + v.InputTokens,
		OutputTokens:        u.OutputTokens + v.OutputTokens,
		CacheReadTokens:     u.CacheReadTokens + v.CacheReadTokens,
		CacheCreationTokens: u.CacheCreationTokens + v.CacheCreationTokens,
	}
}

// PermissionDenial is a tool call the CLI refused to run.
type PermissionDenial struct {
	ToolName  string          `json:"tool_name"`
	ToolUseID string          `json:"tool_use_id"`
	ToolInput json.RawMessage `json:"tool_input,omitempty"`
}

// Summary is what an adapter learned from a whole run. Fields the agent did
// not report are zero.
type Summary struct {
	Status         Status `json:"status"`
	Subtype        string `json:"subtype,omitempty"` // success, error_max_turns, error_max_budget_usd, error_during_execution, ...
	IsError        bool   `json:"is_error"`
	Result         string `json:"result,omitempty"`
	TerminalReason string `json:"terminal_reason,omitempty"`
	// AgentSessionID is the CLI's own session id, for `--resume`.
	AgentSessionID string `json:"agent_session_id,omitempty"`
	Model          string `json:"model,omitempty"`
	// NumTurns is num_turns as the CLI reported it; 0 without a result line.
	NumTurns int `json:"num_turns"`
	// Messages counts distinct assistant message ids (model responses) seen.
	Messages int `json:"messages"`
	// Retries counts the model calls the CLI said it retried (its
	// api_retry lines).
	Retries int `json:"retries,omitempty"`
	// Usage sums each assistant message's usage once per message id, taking
	// each field's largest value over the lines that repeat the id. The CLI
	// prints an assistant line as a content block completes, before the
	// final output count arrives, so OutputTokens can fall short of the
	// truth; input and cache counts are exact.
	Usage Usage `json:"usage"`
	// ResultUsage is the result line's usage as the CLI reported it (nil
	// without one); never add it to Usage, it counts the same calls.
	ResultUsage *Usage `json:"result_usage,omitempty"`
	// CLIEstimateUSD is the CLI's total_cost_usd: its own estimate from its
	// price list. The gateway's metering is authoritative. Nil if absent.
	CLIEstimateUSD    *float64           `json:"cli_estimate_usd,omitempty"`
	DurationMS        int64              `json:"duration_ms,omitempty"`
	PermissionDenials []PermissionDenial `json:"permission_denials,omitempty"`
	StdoutLines       int                `json:"stdout_lines"`
	StderrLines       int                `json:"stderr_lines"`
	// Malformed counts lines reported as error events: not JSON, not the
	// expected shape, or too long.
	Malformed int `json:"malformed"`
	// Ignored counts lines and content blocks skipped on purpose, by kind
	// ("stream_event", "system/hook_response", "block/redacted_thinking").
	Ignored map[string]int `json:"ignored,omitempty"`
}

func (s *Summary) ignore(kind string) {
	if s.Ignored == nil {
		s.Ignored = make(map[string]int)
	}
	s.Ignored[kind]++
}

// sink stamps events with the ids and serialises calls to emit.
type sink struct {
	mu   sync.Mutex
	ids  IDs
	emit func(stream.Event)
}

func (s *sink) send(t stream.Type, payload any) {
	ev := stream.New(s.ids.Session, s.ids.Execution, t, payload)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.emit(ev)
}

type outputPayload struct {
	Stream string `json:"stream"`
	Line   string `json:"line"`
}

type errorPayload struct {
	Message string `json:"message"`
	Stream  string `json:"stream"`
	Line    int    `json:"line,omitempty"`
	Bytes   int64  `json:"bytes,omitempty"`
	Snippet string `json:"snippet,omitempty"`
}

// lineFuncs receives one stream's lines; tooLong receives the number and
// size of a line over the limit instead.
type lineFuncs struct {
	line    func(n int, b []byte)
	tooLong func(n int, size int64)
}

// pump reads stdout and stderr concurrently, one goroutine each, and
// returns when both are done. A read failure becomes an error event and
// part of the returned error.
func pump(s *sink, maxLine int, stdout, stderr io.Reader, out, errs lineFuncs) error {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	var wg sync.WaitGroup
	var outErr, errErr error
	read := func(name string, r io.Reader, f lineFuncs, res *error) {
		defer wg.Done()
		if r == nil {
			return
		}
		if err := readLines(r, maxLine, f.line, f.tooLong); err != nil {
			*res = &ReadError{Stream: name, Err: err}
			s.send(stream.Error, errorPayload{Message: (*res).Error(), Stream: name})
		}
	}
	wg.Add(2)
	go read("stdout", stdout, out, &outErr)
	go read("stderr", stderr, errs, &errErr)
	wg.Wait()
	return errors.Join(outErr, errErr)
}

// ReadError reports that reading one of the process's streams failed.
type ReadError struct {
	Stream string // "stdout" or "stderr"
	Err    error
}

func (e *ReadError) Error() string { return "read " + e.Stream + ": " + e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

// tooLongEvent reports a line over the limit.
func tooLongEvent(s *sink, name string, maxLine, n int, size int64) {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	s.send(stream.Error, errorPayload{
		Message: fmt.Sprintf("%s line %d is %d bytes, over the %d-byte limit; skipped", name, n, size, maxLine),
		Stream:  name, Line: n, Bytes: size,
	})
}
