// Package stream is the execution stream's vocabulary: the Event every
// part of an execution reports (status changes, agent text, tool calls
// and results, model calls with tokens and dollars, file writes, budget
// warnings, errors). Packages under agents import it; so does appliance.
package stream

import (
	"encoding/json"
	"time"
)

// Type says what an event reports.
type Type string

const (
	Status     Type = "status"      // the execution's status changed: payload {"status": ..., "reason": ...}
	Text       Type = "text"        // text the agent wrote: {"text": ...}
	ToolCall   Type = "tool_call"   // {"id", "name", "input"}
	ToolResult Type = "tool_result" // {"id", "output", "is_error"}
	ModelCall  Type = "model_call"  // {"model", "message_id", "input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens", "usd", "latency_ms", "status"}
	File       Type = "file"        // {"op": created|written|removed|renamed, "path"}
	Budget     Type = "budget"      // {"limit": usd|turns|wall_time|credits, "used", "max", "level": warn|exceeded}
	Error      Type = "error"       // {"message", ...}
	Output     Type = "output"      // a plain command's line: {"stream": stdout|stderr, "line"}
	Claim      Type = "claim"       // a lease on a workspace path: {"op": claimed|renewed|released|taken_over|expired, "path", "holder", "expires", "previous", "by"}
	Network    Type = "network"     // one request through the egress proxy, when it ends: {"host", "port", "method", "allowed", "rule", "reason", "status", "bytes_up", "bytes_down", ...}
	Warning    Type = "warning"     // something the execution goes on with that its owner should know: {"message", "model", "price_used", "pattern"}
	Retry      Type = "retry"       // the agent's CLI retries a failed model call: {"attempt", "max_retries", "status", "delay_ms", "error"}
	System     Type = "system"      // another notice the agent's CLI printed: {"subtype", "payload", "truncated"}
	Rewind     Type = "rewind"      // the session was rewound, its rewind undone, or a branch made from it: {"op": rewound|undone|branched, "execution", "call", "session_call", "snapshot", "undo", "branch"}
	Child      Type = "child"       // a child this execution delegated to started (status pending) or ended: {"execution", "session", "agent", "status", "usd", "tokens", "error"}; usd and tokens include its descendants
)

// Event is one entry of an execution's stream. Seq numbers the events of
// one execution from 1, in the order the store accepted them; it is 0
// until then.
type Event struct {
	Seq       int64           `json:"seq"`
	Time      time.Time       `json:"time"`
	Session   string          `json:"session"`
	Execution string          `json:"execution"`
	Type      Type            `json:"type"`
	Payload   json.RawMessage `json:"payload"`
}

// New makes an event of type t for an execution, with payload encoded as
// JSON and the time now.
func New(session, execution string, t Type, payload any) Event {
	b, err := json.Marshal(payload)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"unencodable_payload": err.Error()})
	}
	return Event{Time: time.Now().UTC(), Session: session, Execution: execution, Type: t, Payload: b}
}
