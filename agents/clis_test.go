package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// cliCase is one agent CLI other than Claude Code, as the tests drive it:
// its image, a model its provider serves, and the scripted model's call of
// its shell tool.
type cliCase struct {
	image, model string
	shell        func(command string) modeltest.Block
}

var cliCases = []cliCase{
	{"codex", "gpt-5.5", func(c string) modeltest.Block {
		return modeltest.ToolUse("exec_command", map[string]string{"cmd": c})
	}},
	{"opencode", "gpt-5.5", func(c string) modeltest.Block {
		return modeltest.ToolUse("bash", map[string]string{"command": c, "description": "step"})
	}},
	{"gemini", "gemini-2.5-pro", func(c string) modeltest.Block {
		return modeltest.ToolUse("run_shell_command", map[string]string{"command": c, "description": "step"})
	}},
}

// sideCall answers the calls a CLI makes besides its turns (Gemini CLI's
// model router, OpenCode's title), without usage: they are metered, but
// cost nothing, so that the totals are the script's.
var sideCall = &modeltest.Turn{Blocks: []modeltest.Block{
	modeltest.Text(`{"complexity_reasoning": "simple", "complexity_score": 5}`)}}

func newCLIHarness(t *testing.T, c cliCase, turns []modeltest.Turn, limits Limits) *harness {
	t.Helper()
	return newHarnessWith(t, harnessOptions{image: c.image, agentModel: c.model, limits: limits,
		model: modeltest.Config{Turns: turns, SideCall: sideCall}})
}

// TestRunCLIs: each real CLI (Codex, OpenCode, Gemini CLI) does a
// two-call task in a jail, its tool writing outputs/report.md; the
// execution ends completed with the tokens and dollars the gateway
// metered from the provider's bytes, the same event kinds as Claude
// Code's, and the provider's key nowhere but upstream.
func TestRunCLIs(t *testing.T) {
	for _, c := range cliCases {
		t.Run(c.image, func(t *testing.T) {
			h := newCLIHarness(t, c, []modeltest.Turn{
				{Blocks: []modeltest.Block{c.shell("mkdir -p outputs && printf '# Q2\\n' > outputs/report.md && cat inputs/q2.csv")},
					Usage: modeltest.Usage{InputTokens: 300, OutputTokens: 40}},
				{Blocks: []modeltest.Block{modeltest.Text("Wrote outputs/report.md")}, Usage: modeltest.Usage{InputTokens: 400, OutputTokens: 20}},
			}, Limits{USD: 1000, Turns: 10})
			res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "Analyze Q2 sales",
				Inputs: map[string][]byte{"q2.csv": []byte("region,revenue\nnorth,10\n")}})
			evs := h.eventsOf(t, res.Execution.ID)
			defer func() {
				if t.Failed() {
					t.Logf("events:\n%s", dump(evs))
				}
			}()
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
			e := res.Execution
			calls := len(h.model.Requests())
			if e.Status != store.Completed || e.Turns != calls || e.Tokens.Input != 700 || e.Tokens.Output != 60 ||
				e.USD < 0.6999 || e.USD > 0.7001 {
				t.Errorf("execution = %+v (the model served %d calls)", e, calls)
			}
			if strings.Join(res.Outputs, ",") != "outputs/report.md" {
				t.Errorf("outputs = %q, want outputs/report.md", res.Outputs)
			}
			for _, want := range []struct {
				typ      stream.Type
				contains string
			}{
				{stream.ModelCall, `"status":200`},
				{stream.ToolCall, `outputs/report.md`},
				{stream.ToolResult, "north,10"},
				{stream.Text, "Wrote outputs/report.md"},
				{stream.File, `"path":"outputs/report.md"`},
				{stream.Status, `"agent_session_id"`},
				{stream.Status, `"status":"completed"`},
			} {
				if countType(evs, want.typ, want.contains) == 0 {
					t.Errorf("no %s event with %s", want.typ, want.contains)
				}
			}
			// Per call: the script's two turns, each at its own tokens
			// and dollars; the side calls (router, title) at none.
			var got []string
			for _, ev := range evs {
				var p gateway.ModelCallPayload
				if ev.Type == stream.ModelCall && json.Unmarshal(ev.Payload, &p) == nil && p.Status == 200 && p.InputTokens > 0 {
					got = append(got, fmt.Sprintf("%d/%d $%.4f", p.InputTokens, p.OutputTokens, p.USD))
				}
			}
			if strings.Join(got, ", ") != "300/40 $0.3000, 400/20 $0.4000" {
				t.Errorf("metered calls %q, want 300/40 $0.3000, 400/20 $0.4000", got)
			}
			if n := countType(evs, stream.Error, ""); n > 0 {
				t.Errorf("%d error events", n)
			}
			for _, r := range h.model.Requests() {
				if k := r.Header.Get("Authorization") + r.Header.Get("x-goog-api-key") + r.Header.Get("x-api-key"); !strings.Contains(k, h.model.Key()) {
					t.Errorf("upstream request %s with key %q, want the real key", r.Path, k)
				}
			}
		})
	}
}

// TestRunCLIsBudget: each CLI is stopped by the dollar limit: the call
// that could overshoot it is refused before it is made, the execution
// ends budget_exceeded with the dollars of the calls made, and the file
// the agent wrote stays.
func TestRunCLIsBudget(t *testing.T) {
	for _, c := range cliCases {
		t.Run(c.image, func(t *testing.T) {
			// $70 of a $100 limit on the first call; the second's
			// bound (its request's size at a token a byte, at the toy
			// $1000 a million) is more than the $30 left.
			h := newCLIHarness(t, c, []modeltest.Turn{
				{Blocks: []modeltest.Block{c.shell("mkdir -p outputs && echo partial > outputs/report.md")},
					Usage: modeltest.Usage{InputTokens: 70000, OutputTokens: 40}},
				{Blocks: []modeltest.Block{modeltest.Text("never")}, Usage: modeltest.Usage{InputTokens: 400}},
			}, Limits{USD: 100})
			res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "go"})
			evs := h.eventsOf(t, res.Execution.ID)
			defer func() {
				if t.Failed() {
					t.Logf("events:\n%s", dump(evs))
				}
			}()
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
			e := res.Execution
			if e.Status != store.BudgetExceeded || e.USD < 69.999 || e.USD > 70.001 || e.Tokens.Input != 70000 {
				t.Errorf("execution = %+v, want budget_exceeded at $70", e)
			}
			if strings.Join(res.Outputs, ",") != "outputs/report.md" {
				t.Errorf("outputs = %q, want the partial outputs/report.md kept", res.Outputs)
			}
			if countType(evs, stream.Budget, `"level":"exceeded"`) == 0 {
				t.Errorf("no budget event at the limit")
			}
		})
	}
}

// TestRunCLIsProviderError: the provider is overloaded for the first
// call; each CLI retries it on its own and completes, the failed call
// metered as a model call with its status and no tokens.
func TestRunCLIsProviderError(t *testing.T) {
	for _, c := range cliCases {
		t.Run(c.image, func(t *testing.T) {
			h := newCLIHarness(t, c, []modeltest.Turn{
				{Error: modeltest.Overloaded()},
				{Blocks: []modeltest.Block{modeltest.Text("done after a retry")}, Usage: modeltest.Usage{InputTokens: 400, OutputTokens: 20}},
			}, Limits{USD: 1000})
			res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "go"})
			evs := h.eventsOf(t, res.Execution.ID)
			defer func() {
				if t.Failed() {
					t.Logf("events:\n%s", dump(evs))
				}
			}()
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
			e := res.Execution
			if e.Status != store.Completed || e.Tokens.Input != 400 || e.USD < 0.3999 || e.USD > 0.4001 {
				t.Errorf("execution = %+v, want completed with the retried call's $0.40", e)
			}
			if countType(evs, stream.ModelCall, `"status":503`)+countType(evs, stream.ModelCall, `"status":529`) != 1 {
				t.Errorf("want one model call answered 503 or 529")
			}
			if countType(evs, stream.Text, "done after a retry") == 0 {
				t.Errorf("no text from the retried call")
			}
		})
	}
}

// TestRunCLIsResume: each CLI continues its own conversation when a
// task resumes the session: the resumed execution's call carries the
// first execution's prompt, tool call and answer.
func TestRunCLIsResume(t *testing.T) {
	for _, c := range cliCases {
		t.Run(c.image, func(t *testing.T) {
			h := newCLIHarness(t, c, []modeltest.Turn{
				{Blocks: []modeltest.Block{c.shell("mkdir -p outputs && echo one > outputs/report.md")}, Usage: modeltest.Usage{InputTokens: 100}},
				{Blocks: []modeltest.Block{modeltest.Text("first done")}, Usage: modeltest.Usage{InputTokens: 100}},
				{Blocks: []modeltest.Block{modeltest.Text("resumed done")}, Usage: modeltest.Usage{InputTokens: 100}},
			}, Limits{USD: 1000})
			ctx := context.Background()
			first, err := h.runner.Run(ctx, TaskRequest{Agent: "analyst", Prompt: "Write the first report"})
			if err != nil || first.Execution.Status != store.Completed {
				t.Fatalf("first run: %+v, %v\n%s", first.Execution, err, dump(h.eventsOf(t, first.Execution.ID)))
			}
			before := len(h.model.Requests())
			resumed, err := h.runner.Run(ctx, TaskRequest{Session: first.Execution.Session, Prompt: "Now add a summary"})
			if err != nil || resumed.Execution.Status != store.Completed || resumed.Execution.Kind != store.Resume {
				t.Fatalf("resume: %+v, %v\n%s", resumed.Execution, err, dump(h.eventsOf(t, resumed.Execution.ID)))
			}
			var carried bool
			for _, r := range h.model.Requests()[before:] {
				body := string(r.Body)
				carried = carried || strings.Contains(body, "Write the first report") && strings.Contains(body, "first done") && strings.Contains(body, "Now add a summary")
			}
			if !carried {
				t.Errorf("no call of the resumed execution carries the first conversation\n%s", dump(h.eventsOf(t, resumed.Execution.ID)))
			}
		})
	}
}

// TestRunCLIsPause: with on_budget = "pause", each CLI's call that would
// overshoot the limit is held while the execution awaits budget; a
// top-up lets it go on, the CLI never sees an error, and the execution
// completes with the dollars of every call.
func TestRunCLIsPause(t *testing.T) {
	for _, c := range cliCases {
		t.Run(c.image, func(t *testing.T) {
			h := newCLIHarness(t, c, []modeltest.Turn{
				{Blocks: []modeltest.Block{c.shell("mkdir -p outputs && echo partial > outputs/report.md")},
					Usage: modeltest.Usage{InputTokens: 70000, OutputTokens: 40}},
				{Blocks: []modeltest.Block{modeltest.Text("done after the top-up")}, Usage: modeltest.Usage{InputTokens: 400}},
			}, Limits{USD: 100, OnBudget: OnBudgetPause, WallTime: Duration(10 * time.Minute)})
			ctx := context.Background()
			accepted := make(chan store.Execution, 1)
			type outcome struct {
				res Result
				err error
			}
			out := make(chan outcome, 1)
			go func() {
				res, err := h.runner.Run(WithAccepted(ctx, func(e store.Execution) { accepted <- e }), TaskRequest{Agent: "analyst", Prompt: "go"})
				out <- outcome{res, err}
			}()
			paused := awaitStatus(t, h, accepted, store.AwaitingBudget)
			if _, err := h.runner.TopUp(ctx, paused.ID, 100); err != nil {
				t.Fatal(err)
			}
			var o outcome
			select {
			case o = <-out:
			case <-time.After(5 * time.Minute):
				t.Fatal("the execution did not end within 5 minutes of the top-up")
			}
			evs := h.eventsOf(t, paused.ID)
			e := o.res.Execution
			if o.err != nil || e.Status != store.Completed || e.USD < 70.3999 || e.USD > 70.4001 {
				t.Fatalf("after the top-up: %+v, %v; want completed at $70.40\n%s", e, o.err, dump(evs))
			}
			if countType(evs, stream.Text, "done after the top-up") != 1 || countType(evs, stream.Error, "") != 0 {
				t.Errorf("want the held call's answer and no error\n%s", dump(evs))
			}
		})
	}
}

// TestRunCLIsWrapUp: past 90% of the dollar limit, each CLI's next call
// carries the wrap-up text in its protocol's own message format, and the
// CLI goes on with it to the end.
func TestRunCLIsWrapUp(t *testing.T) {
	for _, c := range cliCases {
		t.Run(c.image, func(t *testing.T) {
			h := newCLIHarness(t, c, []modeltest.Turn{
				{Blocks: []modeltest.Block{c.shell("echo step")}, Usage: modeltest.Usage{InputTokens: 900_000}}, // $900 of $1000
				{Blocks: []modeltest.Block{modeltest.Text("wrapped up")}, Usage: modeltest.Usage{InputTokens: 400}},
			}, Limits{USD: 1000})
			res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "go"})
			evs := h.eventsOf(t, res.Execution.ID)
			if err != nil || res.Execution.Status != store.Completed {
				t.Fatalf("Run = %+v, %v\n%s", res.Execution, err, dump(evs))
			}
			var first, wrapped int
			for i, r := range h.model.Requests() {
				if strings.Contains(string(r.Body), gateway.DefaultWrapUp) {
					wrapped++
					if first == 0 {
						first = i + 1
					}
				}
			}
			if wrapped == 0 || first == 1 {
				t.Errorf("the wrap-up reached the provider in %d calls, first in call %d; want it after the first\n%s", wrapped, first, dump(evs))
			}
			if countType(evs, stream.Budget, `"level":"warn"`) != 1 {
				t.Errorf("want one warn budget event\n%s", dump(evs))
			}
		})
	}
}

// TestRunCommand: an agent with cli = "command" runs its own program,
// its prompt on stdin and the gateway in its environment: a model call it
// makes with curl is metered like any CLI's, its output lines are output
// events, and its exit code decides the outcome.
func TestRunCommand(t *testing.T) {
	h := newHarness(t, []modeltest.Turn{
		{Blocks: []modeltest.Block{modeltest.Text("hello from the model")}, Usage: modeltest.Usage{InputTokens: 500, OutputTokens: 10}},
	}, Limits{USD: 1000})
	def := h.runner.agents["analyst"]
	def.CLI, def.Command = CLICommand, []string{"sh", "-c", `mkdir -p outputs && cat > outputs/prompt.md &&
curl -sS "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" -H "anthropic-version: 2023-06-01" \
  -H "content-type: application/json" \
  -d '{"model":"'"$HEARTH_MODEL"'","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}' && echo && echo finished`}
	res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "the task's prompt"})
	evs := h.eventsOf(t, res.Execution.ID)
	if err != nil {
		t.Fatalf("Run = %v\n%s", err, dump(evs))
	}
	e := res.Execution
	if e.Status != store.Completed || e.Turns != 1 || e.Tokens.Input != 500 || e.USD < 0.4999 || e.USD > 0.5001 {
		t.Errorf("execution = %+v\n%s", e, dump(evs))
	}
	if strings.Join(res.Outputs, ",") != "outputs/prompt.md" {
		t.Errorf("outputs = %q, want outputs/prompt.md", res.Outputs)
	}
	if countType(evs, stream.Output, "hello from the model") != 1 || countType(evs, stream.Output, "finished") != 1 {
		t.Errorf("the command's output is not in output events\n%s", dump(evs))
	}
	// A command has no conversation to resume.
	resumed, err := h.runner.Run(context.Background(), TaskRequest{Session: e.Session, Prompt: "more"})
	if err == nil || resumed.Execution.Status != store.Failed || !strings.Contains(resumed.Execution.Error, "no conversation to resume") {
		t.Errorf("resume of a command: %+v, %v; want failed, saying why", resumed.Execution, err)
	}
	// A command that fails fails its execution.
	def.Command = []string{"sh", "-c", "echo broken >&2; exit 3"}
	failed, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "go"})
	if err != nil || failed.Execution.Status != store.Failed || !strings.Contains(failed.Execution.Error, "status 3") {
		t.Errorf("a failing command: %+v, %v; want failed with its exit status", failed.Execution, err)
	}
}

// TestHostileCLIProviderKey: an agent of each CLI looks for the
// provider's key everywhere it can in its machine (its environment, its
// home with every configuration Hearth wrote, the session, the
// process's own environment) and finds only its own gateway token; a
// request with that token from outside its machine's channel is refused
// (TestRunClaudeCode and the gateway's tests cover the channel).
func TestHostileCLIProviderKey(t *testing.T) {
	for _, c := range cliCases {
		t.Run(c.image, func(t *testing.T) {
			key := modeltest.DefaultKey // the harness's scripted model's
			// The key split in two quoted halves: the probe's own text,
			// which the CLI keeps in its session files, does not hold it.
			probe := "if (env; cat /proc/self/environ; grep -rs . \"$HOME\" /workspace/agents 2>/dev/null) | grep -qF '" + key[:3] + "''" + key[3:] + "'; then echo KEY-LEAKED; else echo KEY-ABSENT; fi"
			h := newCLIHarness(t, c, []modeltest.Turn{
				{Blocks: []modeltest.Block{c.shell(probe)}, Usage: modeltest.Usage{InputTokens: 100}},
				{Blocks: []modeltest.Block{modeltest.Text("looked")}, Usage: modeltest.Usage{InputTokens: 100}},
			}, Limits{USD: 1000})
			if h.model.Key() != key {
				t.Fatalf("the harness's model key is %q, not the default the probe looks for", h.model.Key())
			}
			res, err := h.runner.Run(context.Background(), TaskRequest{Agent: "analyst", Prompt: "find the key"})
			evs := h.eventsOf(t, res.Execution.ID)
			if err != nil || res.Execution.Status != store.Completed {
				t.Fatalf("Run = %+v, %v\n%s", res.Execution, err, dump(evs))
			}
			if countType(evs, stream.ToolResult, "KEY-ABSENT") != 1 || countType(evs, stream.ToolResult, "KEY-LEAKED") != 0 {
				t.Errorf("the provider key is readable in the machine, or the probe did not run\n%s", dump(evs))
			}
		})
	}
}
