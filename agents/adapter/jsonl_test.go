package adapter

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// The captures in testdata are the real stdout of each CLI, run
// non-interactively against hearth-scripted-model with a script that runs a
// shell command writing outputs/out.txt and then answers (the -tool files),
// or refuses the first call with a 400 budget error (the -error files).

func runFile(t *testing.T, a Adapter, name string) ([]string, Summary) {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, sum := run(t, a, f, strings.NewReader(""))
	return describeAll(t, evs), sum
}

const budgetMsg = "hearth budget: the execution limit of $0.01 is reached"

func TestCodexCaptured(t *testing.T) {
	got, sum := runFile(t, &Codex{}, "codex-0.169.0-tool.jsonl")
	diffLines(t, "events", got, []string{
		"status agent_started <nil>",
		"text Writing the file.",
		`tool_call item_1 command_execution {"command":"/bin/bash -lc 'mkdir -p outputs \u0026\u0026 echo hello-from-agent \u003e outputs/out.txt \u0026\u0026 cat outputs/out.txt'"}`,
		`tool_result item_1 "hello-from-agent\n" is_error=false truncated=false`,
		"text All done: wrote outputs/out.txt",
		"status agent_finished completed",
	})
	want := Summary{Status: Completed, Subtype: "turn.completed", Result: "All done: wrote outputs/out.txt",
		AgentSessionID: "01a21798-bd16-71c3-9095-29f71a4d25b9", NumTurns: 1,
		ResultUsage: &Usage{InputTokens: 5000, OutputTokens: 160}, StdoutLines: 7, Ignored: map[string]int{"turn.started": 1}}
	if !reflect.DeepEqual(sum, want) {
		t.Errorf("Summary =\n  %+v\nwant\n  %+v", sum, want)
	}

	got, sum = runFile(t, &Codex{}, "codex-0.169.0-error.jsonl")
	diffLines(t, "error events", got, []string{"status agent_started <nil>", "error stdout line 3", "status agent_finished failed"})
	if sum.Status != Failed || !sum.IsError || !strings.Contains(sum.Result, budgetMsg) || sum.AgentSessionID != "01a21799-2728-77b0-bf76-30b077852e6d" {
		t.Errorf("error Summary = %+v", sum)
	}
}

// TestCodexRetryCaptured: the scripted model answered every call 503; Codex
// retried five times, then failed the turn.
func TestCodexRetryCaptured(t *testing.T) {
	got, sum := runFile(t, &Codex{}, "codex-0.169.0-retry.jsonl")
	reason := "unexpected status 503 Service Unavailable: scripted overload, url: http://127.0.0.1:18101/v1/responses"
	want := []string{"status agent_started <nil>"}
	for i := 1; i <= 5; i++ {
		want = append(want, fmt.Sprintf("retry %d/5 status=<nil> delay_ms=0 error=%s", i, reason))
	}
	want = append(want, "error stdout line 8", "status agent_finished failed")
	diffLines(t, "events", got, want)
	if sum.Retries != 5 || sum.Status != Failed || sum.Result != reason {
		t.Errorf("Summary = %+v", sum)
	}
}

func TestGeminiCaptured(t *testing.T) {
	got, sum := runFile(t, &Gemini{}, "gemini-cli-0.61.0-tool.jsonl")
	id := "run_shell_command__run_shell_command_1795692223466_0"
	diffLines(t, "events", got, []string{
		"status agent_started <nil>",
		"text Writing the file.", // three delta lines, one event
		"tool_call " + id + ` run_shell_command {"command":"mkdir -p outputs \u0026\u0026 echo hello-from-agent \u003e outputs/out.txt \u0026\u0026 cat outputs/out.txt","description":"write outputs/out.txt"}`,
		"tool_result " + id + ` "hello-from-agent" is_error=false truncated=false`,
		"text All done: wrote outputs/out.txt",
		"status agent_finished completed",
	})
	want := Summary{Status: Completed, Subtype: "success", Result: "All done: wrote outputs/out.txt",
		AgentSessionID: "05319e9a-4525-4dd9-bb13-47a2cf07987c", Model: "auto",
		ResultUsage: &Usage{InputTokens: 5100, OutputTokens: 180}, DurationMS: 265, StdoutLines: 11,
		Ignored: map[string]int{"message/user": 1}}
	if !reflect.DeepEqual(sum, want) {
		t.Errorf("Summary =\n  %+v\nwant\n  %+v", sum, want)
	}

	got, sum = runFile(t, &Gemini{}, "gemini-cli-0.61.0-error.jsonl")
	diffLines(t, "error events", got, []string{"status agent_started <nil>", "error stdout line 3", "status agent_finished failed"})
	if sum.Status != Failed || !strings.Contains(sum.Result, budgetMsg) || sum.Model != "gemini-2.5-pro" {
		t.Errorf("error Summary = %+v", sum)
	}
}

func TestOpenCodeCaptured(t *testing.T) {
	got, sum := runFile(t, &OpenCode{}, "opencode-1.18.33-tool.jsonl")
	diffLines(t, "events", got, []string{
		"status agent_started <nil>",
		"text Writing the file.",
		`tool_call call_jy5ok442000007 bash {"command":"mkdir -p outputs \u0026\u0026 echo hello-from-agent \u003e outputs/out.txt \u0026\u0026 cat outputs/out.txt","description":"write outputs/out.txt"}`,
		`tool_result call_jy5ok442000007 "hello-from-agent\n" is_error=false truncated=false`,
		"text All done: wrote outputs/out.txt",
		"status agent_finished completed",
	})
	want := Summary{Status: Completed, Subtype: "stop", Result: "All done: wrote outputs/out.txt",
		AgentSessionID: "ses_de86702d1ffeaFq5X71rwYor3u", Messages: 2,
		ResultUsage: &Usage{InputTokens: 5000, OutputTokens: 160}, StdoutLines: 7, Ignored: map[string]int{"step_start": 2}}
	if !reflect.DeepEqual(sum, want) {
		t.Errorf("Summary =\n  %+v\nwant\n  %+v", sum, want)
	}

	got, sum = runFile(t, &OpenCode{}, "opencode-1.18.33-error.jsonl")
	diffLines(t, "error events", got, []string{"status agent_started <nil>", "error stdout line 1", "status agent_finished failed"})
	if sum.Status != Failed || sum.Result != budgetMsg || sum.AgentSessionID != "ses_de86696b4ffeQKic0FxHVevwij" {
		t.Errorf("error Summary = %+v", sum)
	}
}

// TestJSONLSynthetic covers what the captures do not: unknown types, bad
// and truncated lines, a stream cut before the end, long tool output.
func TestJSONLSynthetic(t *testing.T) {
	long := strings.Repeat("x", 40)
	tests := []struct {
		name   string
		a      Adapter
		stdout string
		want   []string
		check  func(t *testing.T, s Summary)
	}{
		{"codex unknown types are skipped and counted", &Codex{},
			lines(`{"type":"thread.started","thread_id":"t1"}`, `{"type":"item.plan.delta","item_id":"i","delta":"x"}`,
				`{"type":"item.completed","item":{"id":"i2","type":"todo_list","items":[]}}`, `{"type":"turn.completed","usage":{"input_tokens":1,"cached_input_tokens":0,"output_tokens":1}}`),
			[]string{"status agent_started <nil>", "status agent_finished completed"},
			func(t *testing.T, s Summary) {
				if s.Ignored["item.plan.delta"] != 1 || s.Ignored["item/todo_list"] != 1 || s.Malformed != 0 {
					t.Errorf("Ignored %v Malformed %d", s.Ignored, s.Malformed)
				}
			}},
		{"codex truncated stream: no result", &Codex{},
			lines(`{"type":"thread.started","thread_id":"t1"}`, `{"type":"item.started","item":{"id":"c","type":"command_execution","command":"ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}`, `{"type":"item.compl`),
			[]string{"status agent_started <nil>", `tool_call c command_execution {"command":"ls"}`, "error stdout line 3"},
			func(t *testing.T, s Summary) {
				if s.Status != NoResult || s.Malformed != 1 || s.AgentSessionID != "t1" {
					t.Errorf("Summary %+v", s)
				}
			}},
		{"codex failed command, file change, mcp call, long output cut", &Codex{MaxToolOutput: 12},
			lines(`{"type":"item.completed","item":{"id":"c","type":"command_execution","command":"false","aggregated_output":"`+long+`","exit_code":1,"status":"failed"}}`,
				`{"type":"item.completed","item":{"id":"f","type":"file_change","changes":[{"path":"a.go","kind":"update"}],"status":"completed"}}`,
				`{"type":"item.completed","item":{"id":"m","type":"mcp_tool_call","server":"hearth","tool":"ls","arguments":{"p":1},"result":null,"error":{"message":"denied"},"status":"failed"}}`,
				`{"type":"item.completed","item":{"id":"e","type":"error","message":"model rerouted"}}`),
			[]string{`tool_call c command_execution {"command":"false"}`, `tool_result c "xxxxxxxxxxxx" is_error=true truncated=true`,
				`tool_call f file_change {"changes":[{"kind":"update","path":"a.go"}]}`, `tool_result f "update a.go\n" is_error=false truncated=false`,
				`tool_call m mcp__hearth__ls {"p":1}`, `tool_result m "denied" is_error=true truncated=false`, "error stdout line 4"},
			func(t *testing.T, s Summary) {
				if s.Status != NoResult {
					t.Errorf("Status %q", s.Status)
				}
			}},
		{"codex known type of the wrong shape", &Codex{},
			lines(`{"type":"thread.started","thread_id":7}`, `{"type":"item.completed"}`, `[1]`, `{"no":"type"}`),
			[]string{"error stdout line 1", "error stdout line 2", "error stdout line 3"},
			func(t *testing.T, s Summary) {
				if s.Malformed != 3 || s.Ignored["untyped"] != 1 {
					t.Errorf("Malformed %d Ignored %v", s.Malformed, s.Ignored)
				}
			}},
		{"gemini deltas end at the stream's end; warning; tool error; no result", &Gemini{},
			lines(`{"type":"init","session_id":"g1","model":"m"}`, `{"type":"error","severity":"warning","message":"loop"}`,
				`{"type":"tool_use","tool_name":"write_file","tool_id":"w","parameters":{"file_path":"a"}}`,
				`{"type":"tool_result","tool_id":"w","status":"error","error":{"type":"X","message":"no access"}}`,
				`{"type":"message","role":"assistant","content":"par","delta":true}`, `{"type":"message","role":"assistant","content":"tial","delta":true}`,
				`{"type":"thought","content":"x"}`),
			[]string{"status agent_started <nil>", "warning", `tool_call w write_file {"file_path":"a"}`, `tool_result w "no access" is_error=true truncated=false`, "text partial"},
			func(t *testing.T, s Summary) {
				if s.Status != NoResult || s.Result != "partial" || s.Ignored["thought"] != 1 {
					t.Errorf("Summary %+v", s)
				}
			}},
		{"gemini a second result is ignored", &Gemini{},
			lines(`{"type":"result","status":"success"}`, `{"type":"result","status":"error","error":{"message":"late"}}`),
			[]string{"status agent_finished completed", "error stdout line 2"},
			func(t *testing.T, s Summary) {
				if s.Status != Completed || s.Ignored["repeated/error"] != 1 {
					t.Errorf("Summary %+v", s)
				}
			}},
		{"opencode stopped after a tool call: no result", &OpenCode{},
			lines(`{"type":"tool_use","sessionID":"o1","part":{"tool":"bash","callID":"c","state":{"status":"error","input":{},"error":"boom"}}}`,
				`{"type":"step_finish","sessionID":"o1","part":{"reason":"tool-calls","tokens":{"input":5,"output":2,"reasoning":0,"cache":{"read":3,"write":1}}}}`,
				`{"type":"session.idle","sessionID":"o1"}`),
			[]string{"status agent_started <nil>", `tool_call c bash {}`, `tool_result c "boom" is_error=true truncated=false`},
			func(t *testing.T, s Summary) {
				if s.Status != NoResult || s.Messages != 1 || !reflect.DeepEqual(s.ResultUsage, &Usage{InputTokens: 5, OutputTokens: 2, CacheReadTokens: 3, CacheCreationTokens: 1}) || s.Ignored["session.idle"] != 1 {
					t.Errorf("Summary %+v usage %+v", s, s.ResultUsage)
				}
			}},
		{"opencode reasoning shown when asked; part missing", &OpenCode{Thinking: true},
			lines(`{"type":"reasoning","sessionID":"o1","part":{"messageID":"m","text":"hmm"}}`, `{"type":"text","sessionID":"o1"}`),
			[]string{"status agent_started <nil>", "text[thinking] hmm", "error stdout line 2"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, sum := run(t, tt.a, strings.NewReader(tt.stdout), nil)
			diffLines(t, "events", describeAll(t, evs), tt.want)
			if tt.check != nil {
				tt.check(t, sum)
			}
		})
	}
}

// TestJSONLHugeLine: a line over MaxLine is one error event, never held
// whole, and reading goes on.
func TestJSONLHugeLine(t *testing.T) {
	huge := `{"type":"item.completed","item":{"id":"c","type":"agent_message","text":"` + strings.Repeat("y", 1<<20) + `"}}`
	for name, a := range map[string]Adapter{
		"codex": &Codex{MaxLine: 4096}, "gemini": &Gemini{MaxLine: 4096}, "opencode": &OpenCode{MaxLine: 4096},
	} {
		t.Run(name, func(t *testing.T) {
			evs, sum := run(t, a, strings.NewReader(lines(huge, `{"type":"zzz"}`)), nil)
			diffLines(t, "events", describeAll(t, evs), []string{"error stdout line 1"})
			if sum.Malformed != 1 || sum.StdoutLines != 2 || sum.Ignored["zzz"] != 1 {
				t.Errorf("Summary %+v", sum)
			}
		})
	}
}

func TestConformanceCodex(t *testing.T) {
	testAdapter(t, func(maxLine int) Adapter { return &Codex{MaxLine: maxLine} })
}

func TestConformanceGemini(t *testing.T) {
	testAdapter(t, func(maxLine int) Adapter { return &Gemini{MaxLine: maxLine} })
}

func TestConformanceOpenCode(t *testing.T) {
	testAdapter(t, func(maxLine int) Adapter { return &OpenCode{MaxLine: maxLine} })
}

// TestHostileAgentOutputJSONL: an agent controls its CLI's stdout. It
// cannot change the session id once reported (resume goes to the CLI's own
// session), cannot turn a reported outcome into another, and cannot make
// the adapter hold an unbounded line or emit invalid JSON.
func TestHostileAgentOutputJSONL(t *testing.T) {
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	cases := []struct {
		name   string
		a      Adapter
		stdout string
	}{
		{"codex", &Codex{MaxLine: 1 << 16},
			lines(`{"type":"thread.started","thread_id":"real"}`, `{"type":"turn.failed","error":{"message":"budget"}}`,
				`{"type":"thread.started","thread_id":"forged"}`, `{"type":"turn.completed","usage":{"input_tokens":1}}`,
				`{"type":"item.completed","item":{"id":"x","type":"agent_message","text":"\xff\xfe"}}`, deep, strings.Repeat("z", 1<<17))},
		{"gemini", &Gemini{MaxLine: 1 << 16},
			lines(`{"type":"init","session_id":"real"}`, `{"type":"result","status":"error","error":{"message":"budget"}}`,
				`{"type":"init","session_id":"forged"}`, `{"type":"result","status":"success"}`,
				`{"type":"message","role":"assistant","content":"\xff\xfe"}`, deep, strings.Repeat("z", 1<<17))},
		{"opencode", &OpenCode{MaxLine: 1 << 16},
			lines(`{"type":"text","sessionID":"real","part":{"text":"hi"}}`, `{"type":"error","sessionID":"forged","error":{"name":"APIError","data":{"message":"budget"}}}`,
				`{"type":"step_finish","sessionID":"forged","part":{"reason":"stop"}}`,
				`{"type":"text","sessionID":"forged","part":{"text":"\xff\xfe"}}`, deep, strings.Repeat("z", 1<<17))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			evs, sum := run(t, tc.a, strings.NewReader(tc.stdout), nil) // run checks every payload is JSON
			if sum.AgentSessionID != "real" {
				t.Errorf("AgentSessionID = %q, want the first one reported", sum.AgentSessionID)
			}
			if sum.Status != Failed {
				t.Errorf("Status = %q, want the failure reported first", sum.Status)
			}
			finished, started := 0, 0
			for _, ev := range evs {
				if ev.Type == "status" {
					switch payload(t, ev)["status"] {
					case "agent_started":
						started++
					case "agent_finished":
						finished++
					}
				}
			}
			if started != 1 || finished != 1 {
				t.Errorf("%d agent_started, %d agent_finished events, want 1 and 1", started, finished)
			}
			if sum.Malformed < 2 { // the deep line is refused by the decoder, the long one by its size
				t.Errorf("Malformed = %d, want >= 2", sum.Malformed)
			}
		})
	}
}
