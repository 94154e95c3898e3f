package adapter

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strings"

	"hearth/agents/stream"
)

// fields decodes a line as an object whose members are read one by one, so
// that a member of an unexpected type costs that member, not the line.
type fields map[string]json.RawMessage

func (f fields) str(k string) string {
	var s string
	_ = json.Unmarshal(f[k], &s)
	return s
}

func (f fields) boolean(k string) bool {
	var b bool
	_ = json.Unmarshal(f[k], &b)
	return b
}

func (f fields) number(k string) (float64, bool) {
	var x *float64
	if json.Unmarshal(f[k], &x) != nil || x == nil {
		return 0, false
	}
	return *x, true
}

// integer reads a count: negative or absurd values read as 0.
func (f fields) integer(k string) int64 {
	x, _ := f.number(k)
	if !(x >= 0 && x < 1<<40) { // sums of many stay far from overflow
		return 0
	}
	return int64(x)
}

func (f fields) count(k string) int {
	var xs []json.RawMessage
	_ = json.Unmarshal(f[k], &xs)
	return len(xs)
}

// maxSystemPayload bounds the payload a system event carries: the
// CLI's line, less what every line has, as JSON.
const maxSystemPayload = 4 << 10

// system reads a system line: init starts the run, api_retry is a retry
// event, and every other subtype is kept as a system event with its
// payload (bounded), so nothing the CLI says is dropped.
func (p *ccParser) system(b []byte, subtype string) error {
	var f fields
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	switch subtype {
	case "init":
		p.systemInit(f)
	case "api_retry":
		p.sum.Retries++
		p.s.send(stream.Retry, retryPayload{
			Attempt: f.integer("attempt"), MaxRetries: f.integer("max_retries"), Status: f.integer("error_status"),
			DelayMS: f.integer("retry_delay_ms"), Error: bounded(f, "error", 500),
		})
	default:
		ev := systemPayload{Subtype: subtype}
		rest := make(fields, len(f))
		for k, v := range f {
			if k != "type" && k != "subtype" && k != "session_id" && k != "uuid" {
				rest[k] = v
			}
		}
		payload, _ := json.Marshal(rest)
		if len(payload) <= maxSystemPayload {
			ev.Payload = payload
		} else {
			ev.Truncated, ev.PayloadBytes = true, len(payload)
			ev.Snippet = snippet(payload, maxSystemPayload)
		}
		p.s.send(stream.System, ev)
	}
	return nil
}

// retryPayload is a retry event's: the CLI's api_retry line.
type retryPayload struct {
	Attempt    int64  `json:"attempt"`
	MaxRetries int64  `json:"max_retries"`
	Status     int64  `json:"status,omitempty"` // the HTTP status that failed; absent for a connection error
	DelayMS    int64  `json:"delay_ms"`         // before the next attempt
	Error      string `json:"error,omitempty"`  // the CLI's name for the failure
}

// systemPayload is a system event's: a system line of another subtype.
type systemPayload struct {
	Subtype string `json:"subtype"`
	// Payload is the line's other members as JSON (no type, subtype,
	// session_id or uuid); a longer one is cut to Snippet, not valid JSON.
	Payload      json.RawMessage `json:"payload,omitempty"`
	Truncated    bool            `json:"truncated,omitempty"`
	PayloadBytes int             `json:"payload_bytes,omitempty"`
	Snippet      string          `json:"snippet,omitempty"`
}

// bounded is member k as text, at most max bytes: a string as it is, any
// other JSON value as its JSON.
func bounded(f fields, k string, max int) string {
	s := f.str(k)
	if s == "" && len(f[k]) > 0 && string(f[k]) != "null" && string(f[k]) != `""` {
		s = string(f[k])
	}
	s, _ = cut(strings.ToValidUTF8(s, "\uFFFD"), max)
	return s
}

func (p *ccParser) systemInit(f fields) {
	p.sum.AgentSessionID = f.str("session_id")
	p.sum.Model = f.str("model")
	p.s.send(stream.Status, startedPayload{
		Status: "agent_started", AgentSessionID: p.sum.AgentSessionID, Model: p.sum.Model,
		Cwd: f.str("cwd"), Tools: f.count("tools"),
		ClaudeCodeVersion: f.str("claude_code_version"), PermissionMode: f.str("permissionMode"),
		MCPServers: f.mcpServers("mcp_servers"), Skills: f.strs("skills"),
	})
}

// maxListed bounds the MCP servers and skills an agent_started event
// lists, and each name's length: the line comes from inside the machine.
const maxListed, maxName = 64, 128

func clip(s string) string {
	if len(s) > maxName {
		return strings.ToValidUTF8(s[:maxName], "")
	}
	return s
}

// strs reads a list of strings, bounded.
func (f fields) strs(k string) []string {
	var xs []string
	_ = json.Unmarshal(f[k], &xs)
	xs = xs[:min(len(xs), maxListed)]
	for i := range xs {
		xs[i] = clip(xs[i])
	}
	return xs
}

// mcpServer is an MCP server of the CLI's and whether it connected.
type mcpServer struct {
	Name   string `json:"name"`
	Status string `json:"status"`
}

func (f fields) mcpServers(k string) []mcpServer {
	var xs []mcpServer
	_ = json.Unmarshal(f[k], &xs)
	xs = xs[:min(len(xs), maxListed)]
	for i := range xs {
		xs[i] = mcpServer{clip(xs[i].Name), clip(xs[i].Status)}
	}
	return xs
}

type startedPayload struct {
	Status            string `json:"status"`
	AgentSessionID    string `json:"agent_session_id"`
	Model             string `json:"model"`
	Cwd               string `json:"cwd"`
	Tools             int    `json:"tools"`
	ClaudeCodeVersion string `json:"claude_code_version"`
	PermissionMode    string `json:"permission_mode,omitempty"`
	// MCPServers are the CLI's MCP servers and their status
	// ("connected", "failed", ...); Skills the skills it loaded.
	MCPServers []mcpServer `json:"mcp_servers,omitempty"`
	Skills     []string    `json:"skills,omitempty"`
}

// messageLine is an assistant or user line.
type messageLine struct {
	Message *struct {
		ID      string          `json:"id"`
		Content json.RawMessage `json:"content"`
		Usage   json.RawMessage `json:"usage"`
	} `json:"message"`
	ParentToolUseID *string `json:"parent_tool_use_id"`
}

// block is one content block of a message.
type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

var errNoMessage = errors.New("no message object")

func decodeMessage(b []byte) (messageLine, error) {
	var m messageLine
	if err := json.Unmarshal(b, &m); err != nil {
		return m, err
	}
	if m.Message == nil {
		return m, errNoMessage
	}
	return m, nil
}

// contentBlocks splits a message's content; a plain string content comes
// back as text. A block that does not decode is reported and skipped.
func (p *ccParser) contentBlocks(n int, raw json.RawMessage) ([]block, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []block{{Type: "text", Text: s}}, nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(raw, &raws); err != nil {
		return nil, err
	}
	out := make([]block, 0, len(raws))
	for _, r := range raws {
		var bl block
		if err := json.Unmarshal(r, &bl); err != nil {
			p.malformed(n, r, "has a content block of an unexpected shape", err)
			continue
		}
		out = append(out, bl)
	}
	return out, nil
}

func (p *ccParser) assistant(n int, b []byte) error {
	m, err := decodeMessage(b)
	if err != nil {
		return err
	}
	id := m.Message.ID
	p.addUsage(n, id, m.Message.Usage)
	blocks, err := p.contentBlocks(n, m.Message.Content)
	if err != nil {
		return err
	}
	parent := deref(m.ParentToolUseID)
	for _, bl := range blocks {
		p.assistantBlock(id, parent, bl)
	}
	return nil
}

func (p *ccParser) assistantBlock(msgID, parent string, bl block) {
	switch bl.Type {
	case "text":
		if p.first(msgID, "text", bl.Text) {
			p.s.send(stream.Text, textPayload{Text: bl.Text, MessageID: msgID, ParentToolUseID: parent})
		}
	case "thinking":
		if !p.thinking {
			p.sum.ignore("block/thinking")
			return
		}
		if p.first(msgID, "thinking", bl.Thinking) {
			p.s.send(stream.Text, textPayload{Text: bl.Thinking, Kind: "thinking", MessageID: msgID, ParentToolUseID: parent})
		}
	case "tool_use":
		key := bl.ID
		if key == "" {
			key = msgID + "\x00" + bl.Name + "\x00" + string(bl.Input)
		}
		if p.first("", "tool_use", key) {
			p.s.send(stream.ToolCall, toolCallPayload{ID: bl.ID, Name: bl.Name, Input: input(bl.Input), MessageID: msgID, ParentToolUseID: parent})
		}
	default: // redacted_thinking, server_tool_use, ...
		p.sum.ignore("block/" + bl.Type)
	}
}

func input(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

type textPayload struct {
	Text            string `json:"text"`
	Kind            string `json:"kind,omitempty"`
	MessageID       string `json:"message_id,omitempty"`
	ParentToolUseID string `json:"parent_tool_use_id,omitempty"`
}

type toolCallPayload struct {
	ID              string          `json:"id"`
	Name            string          `json:"name"`
	Input           json.RawMessage `json:"input"`
	MessageID       string          `json:"message_id,omitempty"`
	ParentToolUseID string          `json:"parent_tool_use_id,omitempty"`
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// first reports whether a block is new. Without a message id a text block
// cannot be told from a repeat, so it always counts as new.
func (p *ccParser) first(msgID, kind, content string) bool {
	if msgID == "" && kind != "tool_use" && kind != "tool_result" {
		return true
	}
	key := sha256.Sum256([]byte(msgID + "\x00" + kind + "\x00" + content))
	if _, ok := p.seen[key]; ok {
		return false
	}
	p.seen[key] = struct{}{}
	return true
}

// addUsage records a message's usage once per id, keeping each field's
// largest value: the CLI repeats an id as content streams in, and later
// lines may carry grown counts.
func (p *ccParser) addUsage(n int, msgID string, raw json.RawMessage) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		if msgID != "" {
			if _, ok := p.usage[msgID]; !ok {
				p.usage[msgID] = Usage{}
			}
		}
		return
	}
	var f fields
	if err := json.Unmarshal(raw, &f); err != nil {
		p.malformed(n, raw, "has an unreadable usage", err)
		return
	}
	u := usageOf(f)
	if msgID == "" {
		p.anonUsage = p.anonUsage.Add(u)
		p.anonMsgs++
		return
	}
	old := p.usage[msgID]
	p.usage[msgID] = Usage{
		InputTokens:         max(old.InputTokens, u.InputTokens),
		OutputTokens:        max(old.OutputTokens, u.OutputTokens),
		CacheReadTokens:     max(old.CacheReadTokens, u.CacheReadTokens),
		CacheCreationTokens: max(old.CacheCreationTokens, u.CacheCreationTokens),
	}
}

func usageOf(f fields) Usage {
	return Usage{
		InputTokens:         f.integer("input_tokens"),
		OutputTokens:        f.integer("output_tokens"),
		CacheReadTokens:     f.integer("cache_read_input_tokens"),
		CacheCreationTokens: f.integer("cache_creation_input_tokens"),
	}
}

func (p *ccParser) user(n int, b []byte) error {
	m, err := decodeMessage(b)
	if err != nil {
		return err
	}
	blocks, err := p.contentBlocks(n, m.Message.Content)
	if err != nil {
		return err
	}
	parent := deref(m.ParentToolUseID)
	for _, bl := range blocks {
		if bl.Type != "tool_result" {
			p.sum.ignore("user/" + bl.Type) // the prompt, replayed
			continue
		}
		out := toolOutput(bl.Content)
		if !p.first("", "tool_result", bl.ToolUseID+"\x00"+out) {
			continue
		}
		ev := toolResultPayload{ID: bl.ToolUseID, IsError: bl.IsError, ParentToolUseID: parent}
		ev.Output, ev.Truncated = cut(out, p.maxOutput)
		if ev.Truncated {
			ev.OutputBytes = len(out)
		}
		p.s.send(stream.ToolResult, ev)
	}
	return nil
}

type toolResultPayload struct {
	ID              string `json:"id"`
	Output          string `json:"output"`
	IsError         bool   `json:"is_error"`
	Truncated       bool   `json:"truncated"`
	OutputBytes     int    `json:"output_bytes,omitempty"` // the whole output's size, when truncated
	ParentToolUseID string `json:"parent_tool_use_id,omitempty"`
}

// toolOutput flattens a tool_result's content (a string, or text and image
// blocks) to text.
func toolOutput(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return string(raw)
	}
	texts := make([]string, 0, len(parts))
	for _, part := range parts {
		if part.Type == "text" {
			texts = append(texts, part.Text)
		} else {
			texts = append(texts, "["+part.Type+"]")
		}
	}
	return strings.Join(texts, "\n")
}

// resultLine ends the run as the CLI sees it. With more than one result
// line (stream-json input keeps a session open) the last one wins.
func (p *ccParser) resultLine(b []byte) error {
	var f fields
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	p.result = true
	s := &p.sum
	s.Subtype, s.IsError, s.Result = f.str("subtype"), f.boolean("is_error"), f.str("result")
	s.NumTurns, s.TerminalReason, s.DurationMS = int(f.integer("num_turns")), f.str("terminal_reason"), f.integer("duration_ms")
	if id := f.str("session_id"); id != "" {
		s.AgentSessionID = id
	}
	s.CLIEstimateUSD = nil
	if usd, ok := f.number("total_cost_usd"); ok {
		s.CLIEstimateUSD = &usd
	}
	s.ResultUsage = nil
	var uf fields
	if json.Unmarshal(f["usage"], &uf) == nil && uf != nil {
		u := usageOf(uf)
		s.ResultUsage = &u
	}
	s.PermissionDenials = denials(f["permission_denials"])
	s.Status = outcome(s.Subtype, s.IsError)
	p.s.send(stream.Status, finishedPayload{
		Status: "agent_finished", Outcome: s.Status, Reason: reason(s), Subtype: s.Subtype, IsError: s.IsError,
		NumTurns: s.NumTurns, TerminalReason: s.TerminalReason, CLIEstimateUSD: s.CLIEstimateUSD,
		PermissionDenials: len(s.PermissionDenials),
	})
	return nil
}

// outcome: is_error wins over a success subtype, and only success (or no
// subtype at all, from an older CLI) without is_error completes.
func outcome(subtype string, isError bool) Status {
	if isError || (subtype != "success" && subtype != "") {
		return Failed
	}
	return Completed
}

func reason(s *Summary) string {
	switch {
	case s.Status != Failed:
		return ""
	case s.Subtype != "success" && s.Subtype != "":
		return s.Subtype
	default:
		r, _ := cut(s.Result, 500)
		return "is_error: " + r
	}
}

func denials(raw json.RawMessage) []PermissionDenial {
	var raws []json.RawMessage
	if json.Unmarshal(raw, &raws) != nil {
		return nil
	}
	var out []PermissionDenial
	for _, r := range raws {
		var f fields
		if json.Unmarshal(r, &f) != nil {
			continue
		}
		out = append(out, PermissionDenial{ToolName: f.str("tool_name"), ToolUseID: f.str("tool_use_id"), ToolInput: f["tool_input"]})
	}
	return out
}

type finishedPayload struct {
	Status            string   `json:"status"`
	Outcome           Status   `json:"outcome"`
	Reason            string   `json:"reason,omitempty"`
	Subtype           string   `json:"subtype,omitempty"`
	IsError           bool     `json:"is_error"`
	NumTurns          int      `json:"num_turns"`
	TerminalReason    string   `json:"terminal_reason,omitempty"`
	CLIEstimateUSD    *float64 `json:"cli_estimate_usd,omitempty"`
	PermissionDenials int      `json:"permission_denials,omitempty"`
}
