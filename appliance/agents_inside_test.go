package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/inside"
	"hearth/agents/modeltest"
	"hearth/agents/store"
	"hearth/fs"
)

// mcpTurn is a turn calling a hearth MCP tool, as claude names it.
func mcpTurn(tool string, args any, usage modeltest.Usage) modeltest.Turn {
	return modeltest.Turn{Blocks: []modeltest.Block{modeltest.ToolUse("mcp__hearth__"+tool, args)}, Usage: usage}
}

// requestWith is the first model request whose last user message
// contains s, and whether there is one.
func requestWith(env *agentEnv, s string) (modeltest.Request, bool) {
	for _, r := range env.model.MessageRequests() {
		if strings.Contains(r.LastUserText(), s) {
			return r, true
		}
	}
	return modeltest.Request{}, false
}

// toolNames are the names of the tools a model request offered.
func toolNames(r modeltest.Request) []string {
	var out []string
	for _, raw := range r.Messages.Tools {
		var tl struct{ Name string }
		if json.Unmarshal(raw, &tl) == nil {
			out = append(out, tl.Name)
		}
	}
	return out
}

// TestAgentsInsideListAgents: the real claude CLI in its machine is
// started with the hearth MCP server (its init line lists it, connected),
// offers its tools to the model, and
// calls list_agents over MCP when the model asks; the tool's answer (the
// agents the daemon has) is in the next request.
func TestAgentsInsideListAgents(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		mcpTurn("list_agents", map[string]any{}, modeltest.Usage{InputTokens: 1000, OutputTokens: 100}),
		textTurn("The analyst can do it."),
	}}, nil)
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "Who can analyse data?", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, env.c, e.Id)
	if e.Status != "completed" || e.Result != "The analyst can do it." {
		t.Fatalf("execution %+v\nevents:\n%s", e, eventDump(evs))
	}
	first := env.model.MessageRequests()
	var offered []string
	for _, r := range first {
		if names := toolNames(r); len(names) > 0 {
			offered = names
			break
		}
	}
	for _, want := range []string{"mcp__hearth__delegate_task", "mcp__hearth__list_agents", "mcp__hearth__wait_execution", "mcp__hearth__claim_path"} {
		if !strings.Contains(strings.Join(offered, " "), want) {
			t.Errorf("the model was not offered %s: %q", want, offered)
		}
	}
	r, ok := requestWith(env, "Analyses data files and writes a report.")
	if !ok || !strings.Contains(r.LastUserText(), `"name":"analyst"`) || !strings.Contains(r.LastUserText(), `"model":"claude-sonnet-4-5"`) {
		t.Errorf("no request carried list_agents' answer; last user texts:\n%s", lastUserTexts(env))
	}
	// The CLI's init line lists the server, connected.
	if countEvents(evs, "status", `{"name":"hearth","status":"connected"}`) != 1 {
		t.Errorf("the agent_started event does not list the hearth MCP server as connected:\n%s", eventDump(evs))
	}
	if countEvents(evs, "tool_call", "mcp__hearth__list_agents") != 1 || countEvents(evs, "tool_result", "analyst") == 0 {
		t.Errorf("the stream lacks the MCP tool call and its result:\n%s", eventDump(evs))
	}
}

func lastUserTexts(env *agentEnv) string {
	var b strings.Builder
	for _, r := range env.model.MessageRequests() {
		b.WriteString(r.LastUserText())
		b.WriteString("\n---\n")
	}
	return b.String()
}

// matches finds every distinct match of re's first group in s, in order.
func matches(re *regexp.Regexp, s string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	return out
}

var (
	execRe    = regexp.MustCompile(`"execution":"(exec-[0-9a-f]+)"`)
	sessionRe = regexp.MustCompile(`"session":"(session-[0-9a-f]+)"`)
)

// micros is a dollar amount in whole micro-dollars, as the store keeps it.
func micros(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// TestAgentsInsideDelegateTree is the main case, with the real
// claude CLI in every machine: a parent delegates to two children at
// once through delegate_task (wait false), waits for both with
// wait_execution, reads both children's outputs under
// /workspace/agents/<child session>/outputs with Bash and writes a
// combined report. Every figure is checked exactly: each execution's
// tokens and dollars (as the store has them and as wait_execution told
// the parent), the parent's total including its children, and the
// credit ledger.
func TestAgentsInsideDelegateTree(t *testing.T) {
	usage := func(in, out int) modeltest.Usage { return modeltest.Usage{InputTokens: in, OutputTokens: out} }
	// The parent's second and third turns name the children's ids and
	// sessions, known only once it has started them: their blocks are
	// filled in by the Match of the turn before, which the scripted
	// model calls (under its lock) just before it plays a turn.
	waitBlocks := []modeltest.Block{{}, {}}
	catBlocks := []modeltest.Block{{}}
	var children, sessions []string
	script := modeltest.Config{Turns: []modeltest.Turn{
		{Match: modeltest.LastUserContains("PARENT-TASK"), Usage: usage(1000, 100), Blocks: []modeltest.Block{
			modeltest.ToolUse("mcp__hearth__delegate_task", map[string]any{"agent": "analyst", "prompt": "CHILD-A: write your part", "limits": map[string]any{"usd": 1}}),
			modeltest.ToolUse("mcp__hearth__delegate_task", map[string]any{"agent": "analyst", "prompt": "CHILD-B: write your part", "limits": map[string]any{"usd": 1}}),
		}},
		{Match: modeltest.LastUserContains("CHILD-A"), Usage: usage(2000, 200), Blocks: []modeltest.Block{
			modeltest.ToolUse("Bash", map[string]string{"command": "echo alpha-content > outputs/a.md && echo wrote-a", "description": "a"})}},
		{Match: modeltest.LastUserContains("wrote-a"), Usage: usage(500, 50), Blocks: []modeltest.Block{modeltest.Text("A done")}},
		{Match: modeltest.LastUserContains("CHILD-B"), Usage: usage(3000, 300), Blocks: []modeltest.Block{
			modeltest.ToolUse("Bash", map[string]string{"command": "echo beta-content > outputs/b.md && echo wrote-b", "description": "b"})}},
		{Match: modeltest.LastUserContains("wrote-b"), Usage: usage(700, 70), Blocks: []modeltest.Block{modeltest.Text("B done")}},
		{Usage: usage(1500, 150), Blocks: waitBlocks, Match: func(r *modeltest.Request) bool {
			text := r.LastUserText()
			children, sessions = matches(execRe, text), matches(sessionRe, text)
			if len(children) != 2 || len(sessions) != 2 {
				return false
			}
			for i, id := range children {
				waitBlocks[i] = modeltest.ToolUse("mcp__hearth__wait_execution", map[string]any{"execution": id, "timeout": "5m"})
			}
			catBlocks[0] = modeltest.ToolUse("Bash", map[string]string{"description": "combine", "command": fmt.Sprintf(
				"cat /workspace/agents/%s/outputs/*.md /workspace/agents/%s/outputs/*.md | sort > outputs/report.md && cat outputs/report.md",
				sessions[0], sessions[1])})
			return true
		}},
		{Usage: usage(2500, 250), Blocks: catBlocks, Match: func(r *modeltest.Request) bool {
			return strings.Count(r.LastUserText(), `"ended":true`) == 2
		}},
		{Match: modeltest.LastUserContains("alpha-content\nbeta-content"), Usage: usage(800, 80), Blocks: []modeltest.Block{modeltest.Text("Combined report written.")}},
	}}
	env := startAgentDaemon(t, script, func(cfg *Config) { cfg.Credits.Enabled = true })
	ctx := context.Background()
	c := env.c
	if _, err := c.AddCredits(ctx, 10, "tree"); err != nil {
		t.Fatal(err)
	}
	parent, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "PARENT-TASK: have two analysts write parts and combine them", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, c, parent.Id)
	if parent.Status != "completed" || parent.Result != "Combined report written." {
		t.Fatalf("parent %+v\nevents:\n%s\nrequests:\n%s", parent, eventDump(evs), lastUserTexts(env))
	}
	if len(children) != 2 {
		t.Fatalf("children %q", children)
	}
	// Both children were started before either was waited for: the one
	// turn that started them came before the turn that waited.
	if countEvents(evs, "tool_call", "mcp__hearth__delegate_task") != 2 || countEvents(evs, "tool_call", "mcp__hearth__wait_execution") != 2 {
		t.Errorf("the parent's stream lacks its two delegations and waits:\n%s", eventDump(evs))
	}
	var report bytes.Buffer
	if _, err := c.DownloadOutput(ctx, parent.Id, "report.md", &report); err != nil || report.String() != "alpha-content\nbeta-content\n" {
		t.Errorf("report %q, %v", report.String(), err)
	}

	// $3 a million input tokens, $15 output.
	price := func(in, out int64) int64 { return in*3 + out*15 }
	type figures struct {
		id      string
		in, out int64
		turns   int
		output  string
	}
	st := env.d.agents.store
	want := []figures{{parent.Id, 1000 + 1500 + 2500 + 800, 100 + 150 + 250 + 80, 4, "report.md"}}
	for _, id := range children {
		e, err := st.GetExecution(ctx, id)
		switch {
		case err != nil:
			t.Fatal(err)
		case strings.Contains(e.Prompt, "CHILD-A"):
			want = append(want, figures{id, 2000 + 500, 200 + 50, 2, "a.md"})
		default:
			want = append(want, figures{id, 3000 + 700, 300 + 70, 2, "b.md"})
		}
	}
	// What wait_execution told the parent of each child, exactly.
	told := map[string]inside.Status{}
	if r, ok := requestWith(env, `"ended":true`); ok {
		for _, line := range strings.Split(r.LastUserText(), "\n") {
			var s inside.Status
			if json.Unmarshal([]byte(line), &s) == nil {
				told[s.Execution] = s
			}
		}
	}
	var all int64
	for i, w := range want {
		e, err := st.GetExecution(ctx, w.id)
		if err != nil {
			t.Fatal(err)
		}
		usd := price(w.in, w.out)
		if e.Tokens.Input != w.in || e.Tokens.Output != w.out || e.Turns != w.turns || micros(e.USD) != usd || e.Status != "completed" {
			t.Errorf("%s: %d in, %d out, %d turns, $%v %s; want %d, %d, %d, $%v", w.id, e.Tokens.Input, e.Tokens.Output, e.Turns, e.USD, e.Status,
				w.in, w.out, w.turns, float64(usd)/1e6)
		}
		all += usd
		if i == 0 {
			continue
		}
		if e.Parent != parent.Id || e.Depth != 1 || micros(e.TotalUSD) != usd {
			t.Errorf("%s: parent %q depth %d total $%v, want %s, 1 and its own $%v", w.id, e.Parent, e.Depth, e.TotalUSD, parent.Id, float64(usd)/1e6)
		}
		got := told[w.id]
		if !got.Ended || got.Status != "completed" || got.Tokens.Input != w.in || got.Tokens.Output != w.out || micros(got.USD) != usd ||
			micros(got.TotalUSD) != usd || got.Turns != w.turns || len(got.Outputs) != 1 || got.Outputs[0] != e.Session+"/outputs/"+w.output {
			t.Errorf("wait_execution told the parent %+v of %s; want %d in, %d out, $%v, %s/outputs/%s", got, w.id, w.in, w.out, float64(usd)/1e6, e.Session, w.output)
		}
	}
	pe, _ := st.GetExecution(ctx, parent.Id)
	if micros(pe.TotalUSD) != all || pe.TotalTokens.Input != want[0].in+want[1].in+want[2].in || pe.TotalTokens.Output != want[0].out+want[1].out+want[2].out {
		t.Errorf("parent totals $%v, %+v; want $%v and every execution's tokens", pe.TotalUSD, pe.TotalTokens, float64(all)/1e6)
	}
	cr, err := env.d.agents.Credits(ctx)
	if err != nil || micros(cr.Spent) != all || micros(cr.Reserved) != 0 || micros(cr.Available) != 10e6-all {
		t.Errorf("credits %+v, %v; want $%v spent, none reserved", cr, err, float64(all)/1e6)
	}
}

// TestAgentsInsideClaimRace: two agents (the real claude CLI, each in its
// machine) race claim_path for the same path through the hearth MCP
// server: exactly one wins and the other is told who holds it. The loser
// waits out the lease (10s) while the winner still runs, claims again
// and takes the expired lease over; both streams say so.
func TestAgentsInsideClaimRace(t *testing.T) {
	const path = "race/job-1"
	claimed := func(r *modeltest.Request) bool {
		return strings.Contains(r.LastUserText(), `"path":"`+path+`"`) && strings.Contains(r.LastUserText(), `"holder":"exec-`)
	}
	refused := modeltest.LastUserContains("path is claimed by another holder")
	script := modeltest.Config{Turns: []modeltest.Turn{
		// Each agent's first answer claims the path, whatever its prompt.
		{Match: modeltest.LastUserContains("RACE"), Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}, Blocks: []modeltest.Block{
			modeltest.ToolUse("mcp__hearth__claim_path", map[string]any{"path": path, "ttl": "10s"})}},
		{Match: modeltest.LastUserContains("RACE"), Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}, Blocks: []modeltest.Block{
			modeltest.ToolUse("mcp__hearth__claim_path", map[string]any{"path": path, "ttl": "10s"})}},
		// The winner (the first claim that succeeded) stays running well
		// past the lease's expiry and the loser's second claim.
		{Match: claimed, Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}, Blocks: []modeltest.Block{
			modeltest.ToolUse("Bash", map[string]string{"command": "echo busy; sleep 40; echo winner-slept", "description": "work"})}},
		{Match: refused, Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}, Blocks: []modeltest.Block{
			modeltest.ToolUse("Bash", map[string]string{"command": "sleep 12; echo loser-slept", "description": "wait"})}},
		{Match: modeltest.LastUserContains("loser-slept"), Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}, Blocks: []modeltest.Block{
			modeltest.ToolUse("mcp__hearth__claim_path", map[string]any{"path": path, "ttl": "1m"})}},
		{Match: claimed, Blocks: []modeltest.Block{modeltest.Text("loser took over")}},
		{Match: modeltest.LastUserContains("winner-slept"), Blocks: []modeltest.Block{modeltest.Text("winner done")}},
	}}
	env := startAgentDaemon(t, script, nil)
	ctx := context.Background()
	var ids []string
	for _, who := range []string{"one", "two"} {
		e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "RACE " + who})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.Id)
	}
	ended := map[string]string{}
	for _, id := range ids {
		ended[id] = waitEnded(t, env, id).Result
	}
	var winner, loser string
	for id, res := range ended {
		switch res {
		case "winner done":
			winner = id
		case "loser took over":
			loser = id
		}
	}
	if winner == "" || loser == "" {
		t.Fatalf("results %v, want one winner and one loser\nrequests:\n%s", ended, lastUserTexts(env))
	}
	if r, ok := requestWith(env, "path is claimed by another holder"); !ok || !strings.Contains(r.LastUserText(), "held by execution "+winner) {
		t.Errorf("the loser was not told the winner %s holds it:\n%s", winner, r.LastUserText())
	}
	wins := 0
	for _, r := range env.model.MessageRequests() {
		if claimed(&r) && strings.Contains(r.LastUserText(), `"holder":"`+winner+`"`) {
			wins++
		}
	}
	if wins != 1 {
		t.Errorf("%d answers gave the winner the lease, want 1\n%s", wins, lastUserTexts(env))
	}
	for _, id := range []string{loser, winner} {
		evs := allEvents(t, env.c, id)
		if countEvents(evs, "claim", `"op":"taken_over"`) != 1 || countEvents(evs, "claim", `"previous":"`+winner+`"`) != 1 {
			t.Errorf("%s's stream lacks the takeover:\n%s", id, eventDump(evs))
		}
	}
	if n := countEvents(allEvents(t, env.c, winner), "claim", `"op":"claimed"`); n != 1 {
		t.Errorf("the winner's stream has %d claimed events, want 1", n)
	}
}

// waitEnded waits (at most 5 minutes) for an execution this daemon runs
// to end, and returns it.
func waitEnded(t *testing.T, env *agentEnv, id string) store.Execution {
	t.Helper()
	if done, ok := env.d.agents.liveDone(id); ok {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			t.Fatalf("%s has not ended after 5 minutes", id)
		}
	}
	e, err := env.d.agents.Execution(context.Background(), id)
	if err != nil || !e.Status.Terminal() {
		t.Fatalf("%s: %+v, %v", id, e, err)
	}
	return e
}

// TestHostileInsideInputSymlinks: an agent hands a child "its own" file
// that is a symbolic link, or lies under one, pointing at another
// session's private .home or its inputs: delegate_task refuses it (the
// store's tree is read without following links), and never copies what
// is behind it. A plain file of its own goes through the same path and
// is read (the delegation then fails for another reason: the caller here
// is not a running execution).
func TestHostileInsideInputSymlinks(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{}, nil)
	a := env.d.agents
	ws := a.ws.store
	owner := fs.Owner{UID: 0, GID: 0}
	for _, s := range []string{"session-aaaaaa", "session-bbbbbb"} {
		if err := ws.CreateSession(s, owner); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ws.WriteFile("session-bbbbbb", ".home/secret", strings.NewReader("the victim's secret"), 0, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.WriteFile("session-aaaaaa", "notes.md", strings.NewReader("mine"), 0, owner); err != nil {
		t.Fatal(err)
	}
	host := env.cfg.Workspace.Mount
	for link, target := range map[string]string{
		"session-aaaaaa/outputs/leak.md": "../../session-bbbbbb/.home/secret",
		"session-aaaaaa/dir":             "../session-bbbbbb/.home",
		"session-aaaaaa/outputs/in":      "../../session-bbbbbb/inputs",
	} {
		if err := os.Symlink(target, filepath.Join(host, link)); err != nil {
			t.Fatal(err)
		}
	}
	caller := inside.Caller{Execution: "exec-00000000", Session: "session-aaaaaa"}
	for _, p := range []string{"session-aaaaaa/outputs/leak.md", "session-aaaaaa/dir/secret", "session-aaaaaa/outputs/in/x"} {
		in, err := inside.ParseInputs(caller.Session, []string{p})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		_, err = insidePlatform{a}.Delegate(context.Background(), caller, inside.Delegation{Agent: "analyst", Prompt: "x", Inputs: in})
		if err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("input %s through a link: %v, want a refusal naming the link", p, err)
		}
	}
	in, _ := inside.ParseInputs(caller.Session, []string{"session-aaaaaa/notes.md"})
	_, err := insidePlatform{a}.Delegate(context.Background(), caller, inside.Delegation{Agent: "analyst", Prompt: "x", Inputs: in})
	if err == nil || strings.Contains(err.Error(), "input") {
		t.Errorf("a plain file of its own: %v, want it read and the start refused for the caller", err)
	}
	if n := len(env.model.MessageRequests()); n != 0 {
		t.Errorf("%d model requests: nothing should have run", n)
	}
}

// TestAgentsInsideAfterReattach: an agent left running by a daemon that
// stopped (agents.on_shutdown = "leave") keeps its hearth MCP server
// through the next daemon: its token is derived again, its channel
// forwarded again, and its next tool call is answered.
func TestAgentsInsideAfterReattach(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{
		bashTurn("sleep 3; echo slept", modeltest.Usage{InputTokens: 100}),
		mcpTurn("list_agents", map[string]any{}, modeltest.Usage{InputTokens: 100}),
		textTurn("finished")}},
		func(c *Config) { c.Agents.OnShutdown = OnShutdownLeave })
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "work"})
	if err != nil {
		t.Fatal(err)
	}
	waitForEvent(t, env.c, e.Id, "tool_call")
	if err := env.d.Close(); err != nil {
		t.Fatal(err)
	}
	_, c := startSandboxDaemon(t, env.cfg)
	var got Execution
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if got, err = c.Execution(ctx, e.Id); err != nil || Ended(got) || time.Now().After(deadline) {
			break
		}
	}
	evs := allEvents(t, c, e.Id)
	if err != nil || got.Status != "completed" || got.Result != "finished" || countEvents(evs, "status", `"reattached":true`) != 1 {
		t.Fatalf("after the next start: %+v, %v\n%s", got, err, eventDump(evs))
	}
	var reattached, called int64
	for _, ev := range evs {
		switch {
		case ev.Type == "status" && strings.Contains(string(ev.Payload), `"reattached":true`):
			reattached = ev.Seq
		case ev.Type == "tool_call" && strings.Contains(string(ev.Payload), "mcp__hearth__list_agents"):
			called = ev.Seq
		}
	}
	if called < reattached {
		t.Errorf("list_agents was called (event %d) before the take-up (event %d)", called, reattached)
	}
	if r, ok := requestWith(env, "Analyses data files and writes a report."); !ok || !strings.Contains(r.LastUserText(), `"name":"analyst"`) {
		t.Errorf("list_agents after the take-up was not answered; last user texts:\n%s", lastUserTexts(env))
	}
}

// TestAgentsInsideDelegationRefused: a parent with $0.50 left asks
// delegate_task for a child of $1: the refusal reaches the model as a
// tool error saying why, no child is made, and the parent goes on to
// complete.
func TestAgentsInsideDelegationRefused(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		{Match: modeltest.LastUserContains("REFUSE-TASK"), Usage: modeltest.Usage{InputTokens: 100, OutputTokens: 10}, Blocks: []modeltest.Block{
			modeltest.ToolUse("mcp__hearth__delegate_task", map[string]any{"agent": "analyst", "prompt": "CHILD", "limits": map[string]any{"usd": 1}})}},
		{Match: modeltest.LastUserContains("delegate to analyst"), Blocks: []modeltest.Block{modeltest.Text("told no")}},
	}}, nil)
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "REFUSE-TASK", Limits: Limits{Usd: 0.5}, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != "completed" || e.Result != "told no" {
		t.Fatalf("parent %+v\n%s", e, lastUserTexts(env))
	}
	r, _ := requestWith(env, "delegate to analyst")
	if text := r.LastUserText(); !strings.Contains(text, "delegation refused") || !strings.Contains(text, "$1") {
		t.Errorf("the tool error does not say why: %q", text)
	}
	kids, err := env.d.agents.store.ListExecutions(ctx, store.ExecutionFilter{Parent: e.Id})
	if err != nil || len(kids) != 0 {
		t.Errorf("children %+v, %v; want none", kids, err)
	}
	if _, ok := requestWith(env, "CHILD"); ok {
		t.Error("the refused child reached the model")
	}
}

// TestAgentsInsideWaitForFiles: one agent blocks in wait_for_files on
// another's session until that one writes its report; the answer names
// the file, and a wait for what never comes times out as timed_out.
func TestAgentsInsideWaitForFiles(t *testing.T) {
	waitBlocks, timeoutBlocks := []modeltest.Block{{}}, []modeltest.Block{{}}
	script := modeltest.Config{Turns: []modeltest.Turn{
		{Match: modeltest.LastUserContains("WRITER"), Blocks: []modeltest.Block{
			modeltest.ToolUse("Bash", map[string]string{"command": "sleep 8; mkdir -p outputs; echo ready > outputs/ready.md; echo written", "description": "w"})}},
		{Match: modeltest.LastUserContains("written"), Blocks: []modeltest.Block{modeltest.Text("writer done")}},
		{Blocks: waitBlocks, Match: func(r *modeltest.Request) bool {
			sess := matches(regexp.MustCompile(`WAITER (session-[0-9a-f]+)`), r.LastUserText())
			if len(sess) != 1 {
				return false
			}
			waitBlocks[0] = modeltest.ToolUse("mcp__hearth__wait_for_files", map[string]any{"session": sess[0], "pattern": "outputs/*.md", "timeout": "2m"})
			timeoutBlocks[0] = modeltest.ToolUse("mcp__hearth__wait_for_files", map[string]any{"session": sess[0], "pattern": "outputs/never-*.md", "timeout": "1s"})
			return true
		}},
		{Match: modeltest.LastUserContains("outputs/ready.md"), Blocks: timeoutBlocks},
		{Match: modeltest.LastUserContains(`"timed_out":true`), Blocks: []modeltest.Block{modeltest.Text("waiter done")}},
	}}
	env := startAgentDaemon(t, script, nil)
	ctx := context.Background()
	writer, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "WRITER"})
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "WAITER " + writer.Session})
	if err != nil {
		t.Fatal(err)
	}
	if w := waitEnded(t, env, waiter.Id); w.Status != "completed" || w.Result != "waiter done" {
		t.Fatalf("waiter %+v\n%s", w, lastUserTexts(env))
	}
	waitEnded(t, env, writer.Id)
	r, ok := requestWith(env, "outputs/ready.md")
	if !ok || !strings.Contains(r.LastUserText(), `"files":["outputs/ready.md"]`) || !strings.Contains(r.LastUserText(), `"timed_out":false`) {
		t.Errorf("the wait's answer: %q", r.LastUserText())
	}
	// The waiter was blocked before the writer wrote: its call came
	// before the file's creation, its answer after.
	var called, written time.Time
	for _, ev := range allEvents(t, env.c, waiter.Id) {
		if ev.Type == "tool_call" && strings.Contains(string(ev.Payload), "mcp__hearth__wait_for_files") && called.IsZero() {
			called = ev.Time
		}
	}
	for _, ev := range allEvents(t, env.c, writer.Id) {
		if ev.Type == "file" && strings.Contains(string(ev.Payload), "outputs/ready.md") && written.IsZero() {
			written = ev.Time
		}
	}
	if called.IsZero() || written.IsZero() || !called.Before(written) {
		t.Errorf("the wait began %v, the file was written %v: the wait did not block", called, written)
	}
	r, _ = requestWith(env, `"timed_out":true`)
	if !strings.Contains(r.LastUserText(), `"files":[]`) {
		t.Errorf("the wait that timed out: %q", r.LastUserText())
	}
}

// TestAgentsInsideDelegateWait: delegate_task with wait answers when the
// child has ended, with its result and cost; get_execution of the
// caller itself then lists the child and counts its dollars in
// total_usd.
func TestAgentsInsideDelegateWait(t *testing.T) {
	selfBlocks := []modeltest.Block{{}}
	usage := modeltest.Usage{InputTokens: 1000, OutputTokens: 100} // $0.0045
	script := modeltest.Config{Turns: []modeltest.Turn{
		{Match: modeltest.LastUserContains("WT-PARENT"), Usage: usage, Blocks: []modeltest.Block{
			modeltest.ToolUse("mcp__hearth__delegate_task", map[string]any{"agent": "analyst", "prompt": "WT-CHILD", "wait": true, "limits": map[string]any{"usd": 0.5}})}},
		{Match: modeltest.LastUserContains("WT-CHILD"), Usage: usage, Blocks: []modeltest.Block{modeltest.Text("child answer 42")}},
		{Usage: usage, Blocks: selfBlocks, Match: func(r *modeltest.Request) bool {
			parent := matches(regexp.MustCompile(`"parent":"(exec-[0-9a-f]+)"`), r.LastUserText())
			if len(parent) != 1 || !strings.Contains(r.LastUserText(), "child answer 42") {
				return false
			}
			selfBlocks[0] = modeltest.ToolUse("mcp__hearth__get_execution", map[string]any{"execution": parent[0]})
			return true
		}},
		{Match: modeltest.LastUserContains(`"children":["`), Usage: usage, Blocks: []modeltest.Block{modeltest.Text("parent done")}},
	}}
	env := startAgentDaemon(t, script, nil)
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "WT-PARENT", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != "completed" || e.Result != "parent done" {
		t.Fatalf("parent %+v\n%s", e, lastUserTexts(env))
	}
	kids, err := env.d.agents.store.ListExecutions(ctx, store.ExecutionFilter{Parent: e.Id})
	if err != nil || len(kids) != 1 {
		t.Fatalf("children %+v, %v", kids, err)
	}
	child := kids[0]
	var waited, self inside.Status
	r, _ := requestWith(env, "child answer 42")
	// The tool's answer is the result's first value: claude 2.1.332
	// appends a <system-reminder> of the tokens left after it.
	json.NewDecoder(strings.NewReader(r.LastUserText())).Decode(&waited)
	if waited.Execution != child.ID || !waited.Ended || waited.Status != "completed" || waited.Result != "child answer 42" ||
		micros(waited.USD) != 4500 || waited.Parent != e.Id || waited.Depth != 1 {
		t.Errorf("delegate_task with wait answered %+v, want the ended child %s with $0.0045", waited, child.ID)
	}
	r, _ = requestWith(env, `"children":["`)
	json.NewDecoder(strings.NewReader(r.LastUserText())).Decode(&self)
	// The parent, asked mid-run: its own two answers so far, and its child's.
	if self.Execution != e.Id || self.Ended || len(self.Children) != 1 || self.Children[0] != child.ID ||
		micros(self.USD) != 9000 || micros(self.TotalUSD) != 13500 {
		t.Errorf("get_execution of itself %+v, want running, child %s, usd $0.009, total $0.0135", self, child.ID)
	}
}

// TestHostileInsideTreeScope: through the hearth tools an execution sees
// itself and its descendants, never its parent, a sibling, or another
// tree; what it may not see is "not found", as a missing one is.
func TestHostileInsideTreeScope(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{}, nil)
	ctx := context.Background()
	st := env.d.agents.store
	exec := func(parent string) store.Execution {
		s, err := st.CreateSession(ctx, store.Session{Agent: "analyst"})
		if err != nil {
			t.Fatal(err)
		}
		e, err := st.CreateExecution(ctx, store.Execution{Session: s.ID, Agent: "analyst", Prompt: "x", Parent: parent})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	root := exec("")
	child, sibling := exec(root.ID), exec(root.ID)
	grandchild := exec(child.ID)
	other := exec("")
	p := insidePlatform{env.d.agents}
	as := func(e store.Execution) inside.Caller { return inside.Caller{Execution: e.ID, Session: e.Session} }
	for _, c := range []struct {
		caller, target store.Execution
		visible        bool
	}{
		{root, root, true}, {root, child, true}, {root, grandchild, true}, {child, grandchild, true}, {child, child, true},
		{child, root, false}, {child, sibling, false}, {grandchild, child, false}, {other, child, false}, {other, grandchild, false}, {child, other, false},
	} {
		got, err := p.Execution(ctx, as(c.caller), c.target.ID)
		switch {
		case c.visible && (err != nil || got.Execution != c.target.ID):
			t.Errorf("%s asking for %s: %+v, %v; want it", c.caller.ID, c.target.ID, got, err)
		case !c.visible && !errors.Is(err, inside.ErrNotFound):
			t.Errorf("%s asking for %s: %+v, %v; want not found", c.caller.ID, c.target.ID, got, err)
		}
	}
	if _, err := p.Execution(ctx, as(root), "exec-00000000"); !errors.Is(err, inside.ErrNotFound) {
		t.Errorf("a missing execution: %v, want not found", err)
	}
	// A wait is scoped the same way, and answers at once.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := p.Wait(wctx, as(child), root.ID); !errors.Is(err, inside.ErrNotFound) {
		t.Errorf("a child waiting for its parent: %v, want not found", err)
	}
	if got, _ := p.Execution(ctx, as(root), root.ID); len(got.Children) != 2 || got.Children[0] != child.ID || got.Children[1] != sibling.ID {
		t.Errorf("root's children %q, want %s and %s", got.Children, child.ID, sibling.ID)
	}
}

// TestAgentsInsideDelegateAdditions: delegate_task from inside takes
// what a task through the API may add: its mcp_servers (checked as the
// API checks them: one outside the agent's network list is a tool error
// saying so, and nothing starts), skills from session files, context
// text, and on_budget in its limits. The real claude CLI of the child
// has the parent's CLAUDE.md and the skill, and the child's execution
// keeps on_budget = pause.
func TestAgentsInsideDelegateAdditions(t *testing.T) {
	const shared = "session-5c1115" // a session of the tree's files, made below
	skill := "session:" + shared + "/outputs/skills/review"
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		mcpTurn("delegate_task", map[string]any{"agent": "analyst", "prompt": "ADD-CHILD",
			"mcp_servers": []map[string]any{{"name": "web", "url": "https://mcp.example.com/mcp"}}}, modeltest.Usage{InputTokens: 100}),
		{Match: modeltest.LastUserContains("network list"), Usage: modeltest.Usage{InputTokens: 100}, Blocks: []modeltest.Block{
			modeltest.ToolUse("mcp__hearth__delegate_task", map[string]any{"agent": "analyst", "prompt": "ADD-CHILD", "wait": true,
				"limits": map[string]any{"usd": 1, "on_budget": "pause"}, "skills": []string{skill},
				"context": []map[string]any{{"text": "Rule from the parent.", "to": "CLAUDE.md"}}})}},
		{Match: modeltest.LastUserContains("ADD-CHILD"), Blocks: []modeltest.Block{
			modeltest.ToolUse("Bash", map[string]string{"command": "cat CLAUDE.md; ls ~/.claude/skills", "description": "look"})}},
		{Match: modeltest.LastUserContains("Rule from the parent."), Blocks: []modeltest.Block{modeltest.Text("child done")}},
		{Match: modeltest.LastUserContains("child done"), Blocks: []modeltest.Block{modeltest.Text("parent done")}},
	}}, nil)
	a := env.d.agents
	owner := fs.Owner{UID: 0, GID: 0}
	if err := a.ws.store.CreateSession(shared, owner); err != nil {
		t.Fatal(err)
	}
	if err := a.ws.store.MkdirAll(shared, "outputs/skills/review", owner); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ws.store.WriteFile(shared, "outputs/skills/review/SKILL.md",
		strings.NewReader("---\nname: parent-review\ndescription: Reviews as the parent asks.\n---\n"), 0, owner); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "ADD-PARENT", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != "completed" || e.Result != "parent done" {
		t.Fatalf("parent %+v\n%s\n%s", e, eventDump(allEvents(t, env.c, e.Id)), lastUserTexts(env))
	}
	r, _ := requestWith(env, "network list")
	if text := r.LastUserText(); !strings.Contains(text, `mcp_servers "web"`) || !strings.Contains(text, "add mcp.example.com to network") {
		t.Errorf("the refusal of the MCP server does not say why: %q", text)
	}
	kids, err := a.store.ListExecutions(ctx, store.ExecutionFilter{Parent: e.Id})
	if err != nil || len(kids) != 1 {
		t.Fatalf("children %+v, %v; want the one child (the refused one made none)", kids, err)
	}
	k := kids[0]
	evs := allEvents(t, env.c, k.ID)
	if k.Status != store.Completed || k.Limits.OnBudget != "pause" || k.Limits.USD != 1 {
		t.Errorf("child %+v; want completed, $1, on_budget pause\n%s", k, eventDump(evs))
	}
	if countEvents(evs, "tool_result", "Rule from the parent.") != 1 || countEvents(evs, "tool_result", "parent-review") != 1 {
		t.Errorf("the child lacks the parent's context or skill\n%s", eventDump(evs))
	}
}
