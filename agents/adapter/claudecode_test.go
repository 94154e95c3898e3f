package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"hearth/agents/stream"
)

const sessionID = "ac130a7a-3854-44aa-b1e1-8eaab58a3a64"

// TestClaudeCodeSample reads real CLI output (see
// ../../../shared/reference/claude-code/README.md).
func TestClaudeCodeSample(t *testing.T) {
	f, err := os.Open("testdata/stream-json-sample.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, sum := run(t, &ClaudeCode{}, f, strings.NewReader(""))

	diffLines(t, "events", describeAll(t, evs), []string{
		"status agent_started <nil>",
		`tool_call toolu_01 Bash {"command":"echo hello-from-agent \u003e out.txt \u0026\u0026 cat out.txt","description":"write file"}`,
		`tool_result toolu_01 "hello-from-agent" is_error=false truncated=false`,
		"text All done: wrote out.txt",
		"status agent_finished completed",
	})
	wantPayloads := []map[string]any{
		{"status": "agent_started", "agent_session_id": sessionID, "model": "claude-opus-4-8[1m]",
			"cwd": "/workspace/agents/session-demo", "tools": 24.0, "claude_code_version": "2.1.197", "permission_mode": "bypassPermissions",
			"skills": []any{"deep-research", "update-config", "verify", "debug", "code-review", "simplify", "batch",
				"fewer-permission-prompts", "loop", "claude-api", "run", "run-skill-generator"}},
		{"id": "toolu_01", "name": "Bash", "message_id": "msg_0",
			"input": map[string]any{"command": "echo hello-from-agent > out.txt && cat out.txt", "description": "write file"}},
		{"id": "toolu_01", "output": "hello-from-agent", "is_error": false, "truncated": false},
		{"text": "All done: wrote out.txt", "message_id": "msg_1"},
		{"status": "agent_finished", "outcome": "completed", "subtype": "success", "is_error": false,
			"num_turns": 2.0, "terminal_reason": "completed", "cli_estimate_usd": 0.016},
	}
	for i := range min(len(evs), len(wantPayloads)) {
		if got := payload(t, evs[i]); !reflect.DeepEqual(got, wantPayloads[i]) {
			t.Errorf("event %d (%s) payload = %v, want %v", i, evs[i].Type, got, wantPayloads[i])
		}
	}

	usd := 0.016
	want := Summary{
		Status: Completed, Subtype: "success", Result: "All done: wrote out.txt", TerminalReason: "completed",
		AgentSessionID: sessionID, Model: "claude-opus-4-8[1m]", NumTurns: 2, Messages: 2,
		// Each assistant line carries message_start's usage: output_tokens 1.
		Usage:          Usage{InputTokens: 2400, OutputTokens: 2},
		ResultUsage:    &Usage{InputTokens: 2400, OutputTokens: 160},
		CLIEstimateUSD: &usd, DurationMS: 212, StdoutLines: 5,
	}
	if !reflect.DeepEqual(sum, want) {
		t.Errorf("Summary =\n  %+v\nwant\n  %+v", sum, want)
	}
}

const (
	initLine   = `{"type":"system","subtype":"init","session_id":"s1","model":"m","cwd":"/w","tools":["Bash"],"claude_code_version":"9"}`
	resultLine = `{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"ok","session_id":"s1","total_cost_usd":0.5,"usage":{"input_tokens":300,"output_tokens":50}}`
)

func TestClaudeCodeSynthetic(t *testing.T) {
	tests := []struct {
		name   string
		a      ClaudeCode
		stdout string
		want   []string
		check  func(t *testing.T, s Summary)
	}{{
		name: "repeated message ids count usage once, blocks once",
		stdout: lines(initLine,
			`{"type":"assistant","message":{"id":"msg_a","content":[{"type":"text","text":"a"}],"usage":{"input_tokens":100,"output_tokens":1,"cache_read_input_tokens":50,"cache_creation_input_tokens":10}}}`,
			`{"type":"assistant","message":{"id":"msg_a","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}],"usage":{"input_tokens":100,"output_tokens":1,"cache_read_input_tokens":50,"cache_creation_input_tokens":10}}}`,
			`{"type":"assistant","message":{"id":"msg_a","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}],"usage":{"input_tokens":100,"output_tokens":42,"cache_read_input_tokens":50,"cache_creation_input_tokens":10}}}`,
			`{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"x"}]}}`,
			`{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"x"}]}}`,
			`{"type":"assistant","message":{"id":"msg_b","content":[{"type":"text","text":"a"}],"usage":{"input_tokens":200,"output_tokens":5}}}`,
			resultLine),
		want: []string{"status agent_started <nil>", "text a", `tool_call t1 Bash {"command":"ls"}`,
			`tool_result t1 "x" is_error=false truncated=false`, "text a", "status agent_finished completed"},
		check: func(t *testing.T, s Summary) {
			want := Usage{InputTokens: 300, OutputTokens: 47, CacheReadTokens: 50, CacheCreationTokens: 10}
			if s.Usage != want || s.Messages != 2 {
				t.Errorf("Usage, Messages = %+v, %d; want %+v, 2", s.Usage, s.Messages, want)
			}
			if s.ResultUsage == nil || *s.ResultUsage != (Usage{InputTokens: 300, OutputTokens: 50}) {
				t.Errorf("ResultUsage = %+v, want 300/50", s.ResultUsage)
			}
		},
	}, {
		name:   "is_error with subtype success is a failure",
		stdout: lines(`{"type":"result","subtype":"success","is_error":true,"result":"API Error: 500","num_turns":1}`),
		want:   []string{"status agent_finished failed"},
		check: func(t *testing.T, s Summary) {
			if s.Status != Failed || !s.IsError || s.Subtype != "success" || s.Result != "API Error: 500" {
				t.Errorf("Summary = %+v, want failed, is_error, success, the error text", s)
			}
		},
	}, {
		name: "error subtypes fail, with permission denials",
		stdout: lines(`{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":5,"total_cost_usd":1.25,` +
			`"permission_denials":[{"tool_name":"Write","tool_use_id":"t9","tool_input":{"file_path":"/etc/x"}},"junk"]}`),
		want: []string{"status agent_finished failed"},
		check: func(t *testing.T, s Summary) {
			if s.Status != Failed || s.Subtype != "error_max_turns" || s.NumTurns != 5 || s.CLIEstimateUSD == nil || *s.CLIEstimateUSD != 1.25 {
				t.Errorf("Summary = %+v, want failed error_max_turns, 5 turns, 1.25", s)
			}
			want := []PermissionDenial{{ToolName: "Write", ToolUseID: "t9", ToolInput: []byte(`{"file_path":"/etc/x"}`)}}
			if !reflect.DeepEqual(s.PermissionDenials, want) {
				t.Errorf("PermissionDenials = %+v, want %+v", s.PermissionDenials, want)
			}
		},
	}, {
		name: "no result line still accounts",
		stdout: lines(initLine,
			`{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"working"}],"usage":{"input_tokens":10,"output_tokens":3}}}`,
			`{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","id":"t1","name":"Read","input":{}}],"usage":{"input_tokens":10,"output_tokens":9}}}`,
			`{"type":"assistant","message":{"id":"m2","content":[],"usage":{"input_tokens":20,"output_tokens":1}}}`),
		want: []string{"status agent_started <nil>", "text working", "tool_call t1 Read {}"},
		check: func(t *testing.T, s Summary) {
			if s.Status != NoResult || s.AgentSessionID != "s1" || s.Messages != 2 || s.Usage != (Usage{InputTokens: 30, OutputTokens: 10}) || s.ResultUsage != nil {
				t.Errorf("Summary = %+v, want no_result, s1, 2 messages, 30/10", s)
			}
		},
	}, {
		name: "malformed line in the middle",
		stdout: lines(initLine, `{"type":"assistant","message":{"id":"m1","content":[{"type":"text",`,
			`[1,2]`, `{"type":"assistant","message":"oops"}`, `{"type":"assistant"}`,
			`{"type":"assistant","message":{"id":"m2","content":[{"type":"text","text":1},{"type":"text","text":"kept"}]}}`,
			resultLine),
		want: []string{"status agent_started <nil>", "error stdout line 2", "error stdout line 3", "error stdout line 4",
			"error stdout line 5", "error stdout line 6", "text kept", "status agent_finished completed"},
		check: func(t *testing.T, s Summary) {
			if s.Status != Completed || s.Malformed != 5 || s.StdoutLines != 7 {
				t.Errorf("Status, Malformed, StdoutLines = %s, %d, %d; want completed, 5, 7", s.Status, s.Malformed, s.StdoutLines)
			}
		},
	}, {
		name: "unknown types and subtypes are ignored and counted",
		stdout: lines(`{"type":"stream_event","event":{"type":"content_block_delta"}}`,
			`{"type":"rate_limit_event","rate_limit_info":{}}`, `{"type":"brand_new"}`, `{}`, `null`,
			"", "   ",
			`{"type":"assistant","message":{"id":"m1","content":[{"type":"redacted_thinking","data":"x"},{"type":"thinking","thinking":"hm"}]}}`,
			`{"type":"user","message":{"role":"user","content":"the prompt"}}`),
		want: nil,
		check: func(t *testing.T, s Summary) {
			want := map[string]int{"stream_event": 1, "rate_limit_event": 1, "brand_new": 1, "untyped": 2,
				"block/redacted_thinking": 1, "block/thinking": 1, "user/text": 1}
			if !reflect.DeepEqual(s.Ignored, want) || s.Malformed != 0 || s.Status != NoResult {
				t.Errorf("Ignored, Malformed, Status = %v, %d, %s; want %v, 0, no_result", s.Ignored, s.Malformed, s.Status, want)
			}
		},
	}, {
		// Every system line is kept: api_retry as a retry event, any
		// other subtype as a system event carrying the line, less the
		// members every line has, cut past maxSystemPayload.
		name: "system lines are kept: retries, other subtypes, long payloads",
		stdout: lines(initLine,
			`{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":512,"error_status":529,"error":"server_error","session_id":"s1","uuid":"u1"}`,
			`{"type":"system","subtype":"api_retry","attempt":2,"max_retries":10,"retry_delay_ms":1100,"error_status":null,"error":{"code":"ECONNRESET"}}`,
			`{"type":"system","subtype":"hook_response","hook_name":"h","exit_code":0,"session_id":"s1","uuid":"u2"}`,
			`{"type":"system","subtype":"compact_boundary","compact_metadata":{"trigger":"auto","pre_tokens":170000}}`,
			`{"type":"system","subtype":"status","status":"`+strings.Repeat("x", maxSystemPayload)+`"}`,
			`{"type":"system","subtype":"api_retry","attempt":"one","retry_delay_ms":-4}`,
			`{"type":"system"}`,
			resultLine),
		want: []string{"status agent_started <nil>",
			"retry 1/10 status=529 delay_ms=512 error=server_error",
			`retry 2/10 status=<nil> delay_ms=1100 error={"code":"ECONNRESET"}`,
			`system hook_response {"exit_code":0,"hook_name":"h"} truncated=<nil>`,
			`system compact_boundary {"compact_metadata":{"pre_tokens":170000,"trigger":"auto"}} truncated=<nil>`,
			"system status null truncated=true",
			"retry 0/0 status=<nil> delay_ms=0 error=<nil>",
			"system  {} truncated=<nil>",
			"status agent_finished completed"},
		check: func(t *testing.T, s Summary) {
			if s.Retries != 3 || len(s.Ignored) != 0 || s.Malformed != 0 {
				t.Errorf("Retries, Ignored, Malformed = %d, %v, %d; want 3, none, 0", s.Retries, s.Ignored, s.Malformed)
			}
		},
	}, {
		name: "thinking as text when asked, subagent parent kept",
		a:    ClaudeCode{Thinking: true},
		stdout: lines(`{"type":"assistant","message":{"id":"m1","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"hi"}]},"parent_tool_use_id":"task_1"}`,
			`{"type":"assistant","message":{"id":"m1","content":[{"type":"thinking","thinking":"hm"}]}}`),
		want: []string{"text[thinking] hm", "text hi"},
	}, {
		name: "tool results: blocks, errors, truncation on a rune boundary",
		a:    ClaudeCode{MaxToolOutput: 9},
		stdout: lines(`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a"},{"type":"image","source":{}}],"is_error":true}]}}`,
			`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t2","content":"hhéhéhé"}]}}`,
			`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t3"}]}}`),
		want: []string{`tool_result t1 "a\n[image]" is_error=true truncated=false`,
			`tool_result t2 "hhéhéh" is_error=false truncated=true`,
			`tool_result t3 "" is_error=false truncated=false`},
	}, {
		name:   "CRLF and a last line without newline",
		stdout: initLine + "\r\n" + `{"type":"assistant","message":{"id":"m","content":"plain"}}`,
		want:   []string{"status agent_started <nil>", "text plain"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			evs, sum := run(t, &tc.a, strings.NewReader(tc.stdout), nil)
			diffLines(t, "events", describeAll(t, evs), tc.want)
			if tc.check != nil {
				tc.check(t, sum)
			}
		})
	}
}

func TestClaudeCodeParentAndTruncationFields(t *testing.T) {
	in := lines(`{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"hi"}]},"parent_tool_use_id":"task_1"}`,
		`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t2","content":"0123456789"}]}}`)
	evs, _ := run(t, &ClaudeCode{MaxToolOutput: 4}, strings.NewReader(in), nil)
	if len(evs) != 2 {
		t.Fatalf("got %d events, want 2", len(evs))
	}
	if p := payload(t, evs[0]); p["parent_tool_use_id"] != "task_1" {
		t.Errorf("text payload = %v, want parent_tool_use_id task_1", p)
	}
	if p := payload(t, evs[1]); p["output"] != "0123" || p["output_bytes"] != 10.0 {
		t.Errorf("tool_result payload = %v, want output 0123, output_bytes 10", p)
	}
}

func TestClaudeCodeErrorPayload(t *testing.T) {
	bad := "not json " + strings.Repeat("x", 500)
	evs, _ := run(t, &ClaudeCode{}, strings.NewReader(lines(initLine, bad)), nil)
	p := payload(t, evs[len(evs)-1])
	if p["line"] != 2.0 || p["stream"] != "stdout" || p["snippet"] != bad[:snippetSize] || !strings.Contains(p["message"].(string), "stdout line 2") {
		t.Errorf("error payload = %v, want line 2, stdout, a %d-byte snippet", p, snippetSize)
	}
}

func TestClaudeCodeHugeLine(t *testing.T) {
	tests := []struct {
		name    string
		maxLine int
		size    int
	}{
		{"over a small limit", 1024, 5000},
		{"over the default limit", 0, DefaultMaxLine + 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			huge := `{"type":"assistant","message":{"content":"` + strings.Repeat("y", tc.size) + `"}}`
			in := lines(initLine, huge, resultLine)
			evs, sum := run(t, &ClaudeCode{MaxLine: tc.maxLine}, strings.NewReader(in), nil)
			diffLines(t, "events", describeAll(t, evs), []string{"status agent_started <nil>", "error stdout line 2", "status agent_finished completed"})
			if p := payload(t, evs[1]); p["bytes"] != float64(len(huge)) {
				t.Errorf("error payload bytes = %v, want %d", p["bytes"], len(huge))
			}
			if sum.Malformed != 1 || sum.Status != Completed {
				t.Errorf("Malformed, Status = %d, %s; want 1, completed", sum.Malformed, sum.Status)
			}
		})
	}
}

// TestClaudeCodeInterleaving feeds stdout and stderr through pipes in
// turns, waiting for each event, so the order is known.
func TestClaudeCodeInterleaving(t *testing.T) {
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	got := make(chan stream.Event, 16)
	done := make(chan Summary)
	go func() {
		sum, err := (&ClaudeCode{}).Run(testIDs, outR, errR, func(ev stream.Event) { got <- ev })
		if err != nil {
			t.Errorf("Run() error = %v", err)
		}
		done <- sum
	}()
	steps := []struct {
		w    io.Writer
		line string
		want string
	}{
		{outW, initLine, "status agent_started <nil>"},
		{errW, "warning: something", "output stderr warning: something"},
		{outW, `{"type":"assistant","message":{"id":"m","content":[{"type":"text","text":"hi"}]}}`, "text hi"},
		{errW, "more stderr", "output stderr more stderr"},
		{outW, resultLine, "status agent_finished completed"},
	}
	for _, st := range steps {
		if _, err := io.WriteString(st.w, st.line+"\n"); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-got:
			if d := describe(t, ev); d != st.want {
				t.Errorf("after writing %q got %q, want %q", st.line, d, st.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event after writing %q", st.line)
		}
	}
	outW.Close()
	errW.Close()
	sum := <-done
	if sum.StdoutLines != 3 || sum.StderrLines != 2 || sum.Status != Completed {
		t.Errorf("StdoutLines, StderrLines, Status = %d, %d, %s; want 3, 2, completed", sum.StdoutLines, sum.StderrLines, sum.Status)
	}
}

func TestClaudeCodeReadError(t *testing.T) {
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader(initLine+"\n"), iotest.ErrReader(boom))
	var evs []stream.Event
	sum, err := (&ClaudeCode{}).Run(testIDs, r, nil, func(ev stream.Event) { evs = append(evs, ev) })
	var re *ReadError
	if !errors.As(err, &re) || re.Stream != "stdout" || !errors.Is(err, boom) {
		t.Fatalf("Run() error = %v, want a stdout ReadError wrapping boom", err)
	}
	diffLines(t, "events", describeAll(t, evs), []string{"status agent_started <nil>", "error stdout line <nil>"})
	if sum.Status != NoResult || sum.AgentSessionID != "s1" {
		t.Errorf("Summary = %+v, want no_result with session s1", sum)
	}
}

func TestClaudeCodeOneByteReads(t *testing.T) {
	data, err := os.ReadFile("testdata/stream-json-sample.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	whole, wantSum := run(t, &ClaudeCode{}, bytes.NewReader(data), nil)
	slow, gotSum := run(t, &ClaudeCode{}, iotest.OneByteReader(bytes.NewReader(data)), nil)
	diffLines(t, "events", describeAll(t, slow), describeAll(t, whole))
	if !reflect.DeepEqual(gotSum, wantSum) {
		t.Errorf("Summary = %+v, want %+v", gotSum, wantSum)
	}
}

// TestClaudeCodeInitLists: the init line's MCP servers and skills reach
// the agent_started event, bounded (the line comes from the machine).
func TestClaudeCodeInitLists(t *testing.T) {
	skills := make([]string, 100)
	for i := range skills {
		skills[i] = strings.Repeat("s", 200)
	}
	b, _ := json.Marshal(map[string]any{"type": "system", "subtype": "init", "session_id": "x",
		"mcp_servers": []map[string]any{{"name": "facts", "status": "connected"}, {"name": "web", "status": "failed", "extra": 1}},
		"skills":      skills})
	evs, _ := run(t, &ClaudeCode{}, strings.NewReader(string(b)+"\n"), strings.NewReader(""))
	var p struct {
		MCPServers []map[string]any `json:"mcp_servers"`
		Skills     []string         `json:"skills"`
	}
	if len(evs) == 0 || json.Unmarshal(evs[0].Payload, &p) != nil {
		t.Fatalf("events = %v", evs)
	}
	if len(p.MCPServers) != 2 || p.MCPServers[0]["name"] != "facts" || p.MCPServers[0]["status"] != "connected" ||
		p.MCPServers[1]["status"] != "failed" || p.MCPServers[1]["extra"] != nil {
		t.Errorf("mcp_servers = %v", p.MCPServers)
	}
	if len(p.Skills) != maxListed || len(p.Skills[0]) != maxName {
		t.Errorf("%d skills of %d bytes, want %d of %d", len(p.Skills), len(p.Skills[0]), maxListed, maxName)
	}
}

// TestClaudeCodeRealRetry: the api_retry line claude 2.1.197 printed when
// the scripted provider answered its call 529 overloaded_error (captured
// by TestRunRetryShown's scenario; testdata/api-retry.jsonl) is a retry
// event with the figures the CLI gave, its fractional delay in whole ms.
func TestClaudeCodeRealRetry(t *testing.T) {
	f, err := os.Open("testdata/api-retry.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, sum := run(t, &ClaudeCode{}, f, nil)
	diffLines(t, "events", describeAll(t, evs), []string{"retry 1/10 status=529 delay_ms=609 error=overloaded"})
	if sum.Retries != 1 || sum.Malformed != 0 || len(sum.Ignored) != 0 {
		t.Errorf("Summary = %+v, want 1 retry, nothing malformed or ignored", sum)
	}
}

// TestClaudeCodeCaptured reads each real capture of the claude CLI
// (testdata/claude-code-VERSION-tool.jsonl: its stdout for a two-turn task
// with a Bash tool call, against hearth-scripted-model; docs/cli.md says
// how) into the events a run must give, the ids and figures the CLI
// printed, and nothing malformed or skipped. The pinned version's own
// output is checked live by agents' TestRunClaudeCode; a capture keeps
// what a version printed, so this test runs anywhere.
func TestClaudeCodeCaptured(t *testing.T) {
	files, err := filepath.Glob("testdata/claude-code-*-tool.jsonl")
	if err != nil || len(files) == 0 {
		t.Fatalf("no claude captures in testdata (%v)", err)
	}
	for _, name := range files {
		version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "claude-code-"), "-tool.jsonl")
		t.Run(version, func(t *testing.T) {
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			var init, result struct {
				SessionID string `json:"session_id"`
			}
			first, _, _ := bytes.Cut(data, []byte("\n"))
			last := data[bytes.LastIndexByte(bytes.TrimRight(data, "\n"), '\n')+1:]
			if json.Unmarshal(first, &init) != nil || json.Unmarshal(last, &result) != nil || init.SessionID == "" || init.SessionID != result.SessionID {
				t.Fatalf("init and result lines carry session ids %q and %q, want one", init.SessionID, result.SessionID)
			}
			evs, sum := run(t, &ClaudeCode{}, bytes.NewReader(data), strings.NewReader(""))
			got := describeAll(t, evs)
			if len(got) != 6 {
				t.Fatalf("events:\n%s\nwant 6: started, text, tool_call, tool_result, text, finished", strings.Join(got, "\n"))
			}
			toolID := payload(t, evs[2])["id"]
			diffLines(t, "events", got, []string{
				"status agent_started <nil>",
				"text Writing the file.",
				fmt.Sprintf(`tool_call %s Bash {"command":"mkdir -p outputs \u0026\u0026 echo hello-from-agent \u003e outputs/out.txt \u0026\u0026 cat outputs/out.txt","description":"write outputs/out.txt"}`, toolID),
				fmt.Sprintf(`tool_result %s "hello-from-agent" is_error=false truncated=false`, toolID),
				"text All done: wrote outputs/out.txt",
				"status agent_finished completed",
			})
			started, finished := payload(t, evs[0]), payload(t, evs[5])
			if started["agent_session_id"] != init.SessionID || started["claude_code_version"] != version || started["model"] != "claude-sonnet-4-5" {
				t.Errorf("agent_started payload = %v, want session %s, version %s, model claude-sonnet-4-5", started, init.SessionID, version)
			}
			if finished["outcome"] != "completed" || finished["num_turns"] != 2.0 || finished["terminal_reason"] != "completed" {
				t.Errorf("agent_finished payload = %v, want completed after 2 turns", finished)
			}
			// The script's usage: 2400 and 2600 input tokens, 80 output each.
			if sum.Status != Completed || sum.AgentSessionID != init.SessionID || sum.Result != "All done: wrote outputs/out.txt" ||
				sum.Messages != 2 || sum.Usage.InputTokens != 5000 || sum.ResultUsage == nil || *sum.ResultUsage != (Usage{InputTokens: 5000, OutputTokens: 160}) ||
				sum.Malformed != 0 || len(sum.Ignored) != 0 || sum.StdoutLines != bytes.Count(data, []byte("\n")) {
				t.Errorf("Summary = %+v, want completed, session %s, 2 messages, 5000/160 tokens, nothing malformed or ignored", sum, init.SessionID)
			}
		})
	}
}
