package inside

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/agents/channel"
)

// recorder is a Platform that records the calls it gets and answers
// from its fields: the tests here are of admission, argument checks and
// the tools' wording, not of what the appliance does behind them.
type recorder struct {
	mu       sync.Mutex
	callers  []Caller
	delegs   []Delegation
	waitCtx  []time.Time // deadlines the Wait calls had
	children map[string]Status
}

func (p *recorder) seen(c Caller) {
	p.mu.Lock()
	p.callers = append(p.callers, c)
	p.mu.Unlock()
}

func (p *recorder) Delegate(_ context.Context, c Caller, d Delegation) (Status, error) {
	p.seen(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delegs = append(p.delegs, d)
	return Status{Execution: "exec-child", Session: "session-child", Agent: d.Agent, Status: "pending"}, nil
}

func (p *recorder) Execution(_ context.Context, c Caller, id string) (Status, error) {
	p.seen(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	st, ok := p.children[c.Execution+"/"+id]
	if !ok {
		return Status{}, ErrNotFound
	}
	return st, nil
}

func (p *recorder) Wait(ctx context.Context, c Caller, id string) (Status, error) {
	dl, _ := ctx.Deadline()
	p.mu.Lock()
	p.waitCtx = append(p.waitCtx, dl)
	p.mu.Unlock()
	return p.Execution(ctx, c, id)
}

func (p *recorder) Agents(_ context.Context, c Caller) ([]Agent, error) {
	p.seen(c)
	return []Agent{{Name: "writer", Description: "writes", Model: "claude-sonnet-4-5", Limits: LimitsJSON{USD: 2, WallTime: "10m0s"}}}, nil
}

func (p *recorder) Sessions(_ context.Context, c Caller) ([]Session, error) {
	p.seen(c)
	return nil, nil
}

func (p *recorder) WaitForFiles(_ context.Context, c Caller, session, pattern string, changes bool, timeout time.Duration) ([]string, error) {
	p.seen(c)
	return []string{pattern}, nil
}

func (p *recorder) ClaimPath(_ context.Context, c Caller, path string, ttl time.Duration) (Claim, error) {
	p.seen(c)
	return Claim{Path: path, Holder: c.Execution, Session: c.Session}, nil
}

func (p *recorder) ReleasePath(_ context.Context, c Caller, path string) error {
	p.seen(c)
	return nil
}

func (p *recorder) Claims(_ context.Context, c Caller, prefix string) ([]Claim, error) {
	p.seen(c)
	return nil, nil
}

// serve serves s as the appliance does: on a unix socket, through
// channel.Listener.
func serve(t *testing.T, s *Server) (sock string) {
	sock = filepath.Join(t.TempDir(), "inside.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s, ConnContext: channel.ConnContext}
	go srv.Serve(channel.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return sock
}

// machine is an HTTP client whose connections come through the channel
// of one machine and carry token.
func machine(sock, name, token string) *http.Client {
	dial := channel.Dial(func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }, name)
	return &http.Client{Timeout: 30 * time.Second, Transport: &bearerTransport{token: token, base: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }}}}
}

type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (b *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.base.RoundTrip(r)
}

// connect opens an MCP session as an agent would.
func connect(t *testing.T, hc *http.Client) (*mcpsdk.ClientSession, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcpsdk.StreamableClientTransport{Endpoint: "http://hearth/mcp", HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

// call calls a tool and returns its text and whether it is a tool error.
func call(t *testing.T, cs *mcpsdk.ClientSession, name string, args any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcpsdk.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	return text.String(), res.IsError
}

// post sends one raw MCP request and returns the status and body.
func post(t *testing.T, hc *http.Client) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://hearth/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHostileInsideAdmission: the agent inside a machine holds its own
// token only, and may have stolen another's (leaked through outputs).
// A request without a token, with a token no execution holds, with a
// registered token through another machine's channel, or through no
// channel at all (served without the channel listener) is refused with
// the same 401 and the same body, so the refusal says nothing of why;
// no tool runs. The right token on its own channel works and acts as its
// execution; after Unregister it is refused too.
func TestHostileInsideAdmission(t *testing.T) {
	p := &recorder{}
	s := New(p)
	sock := serve(t, s)
	tokA := s.Register(Execution{ID: "exec-a", Session: "session-a", Channel: "exec-a"})
	tokB := s.Register(Execution{ID: "exec-b", Session: "session-b", Channel: "exec-b"})
	noChan := s.Register(Execution{ID: "exec-c", Session: "session-c"}) // no channel: never admitted
	plain := httptest.NewServer(s)                                      // no channel listener: channel.Of is ""
	defer plain.Close()
	plainClient := func(token string) *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: &bearerTransport{token: token, base: &rewriteHost{plain.URL}}}
	}

	var bodies []string
	for _, c := range []struct {
		name string
		hc   *http.Client
	}{
		{"no token", machine(sock, "exec-a", "")},
		{"a token nobody holds", machine(sock, "exec-a", "hearth-NOTATOKEN")},
		{"A's token through B's channel", machine(sock, "exec-b", tokA)},
		{"B's token through A's channel", machine(sock, "exec-a", tokB)},
		{"A's token through no channel", plainClient(tokA)},
		{"a token registered without a channel", machine(sock, "exec-c", noChan)},
		{"a token registered without a channel, through no channel", plainClient(noChan)},
	} {
		status, body := post(t, c.hc)
		if status != http.StatusUnauthorized {
			t.Errorf("%s: %d %q, want 401", c.name, status, body)
		}
		bodies = append(bodies, body)
		if _, err := connect(t, c.hc); err == nil {
			t.Errorf("%s: an MCP session was opened", c.name)
		}
	}
	for _, b := range bodies[1:] {
		if b != bodies[0] {
			t.Errorf("refusals differ, so they tell why: %q and %q", bodies[0], b)
		}
	}
	if len(p.callers) != 0 {
		t.Fatalf("refused requests reached the platform: %+v", p.callers)
	}

	cs, err := connect(t, machine(sock, "exec-a", tokA))
	if err != nil {
		t.Fatalf("A on its own channel: %v", err)
	}
	text, isErr := call(t, cs, "list_agents", map[string]any{})
	if isErr || !strings.Contains(text, `"name":"writer"`) {
		t.Errorf("list_agents: error %v, %s", isErr, text)
	}
	if len(p.callers) != 1 || p.callers[0].Execution != "exec-a" || p.callers[0].Session != "session-a" {
		t.Errorf("the tool acted as %+v, want exec-a in session-a", p.callers)
	}

	s.Unregister(tokA)
	if status, body := post(t, machine(sock, "exec-a", tokA)); status != http.StatusUnauthorized || body != bodies[0] {
		t.Errorf("after Unregister: %d %q, want the same 401", status, body)
	}
}

// rewriteHost sends every request to base (an httptest server).
type rewriteHost struct{ base string }

func (r *rewriteHost) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host = "http", strings.TrimPrefix(r.base, "http://")
	return http.DefaultTransport.RoundTrip(req)
}

// twoExecutions serves s, registers executions A and B, each with its
// own channel, and connects an MCP session as each; it returns A's token.
func twoExecutions(t *testing.T, s *Server) (tokA string, csA, csB *mcpsdk.ClientSession) {
	t.Helper()
	sock := serve(t, s)
	tokA = s.Register(Execution{ID: "exec-a", Session: "session-a", Channel: "exec-a"})
	tokB := s.Register(Execution{ID: "exec-b", Session: "session-b", Channel: "exec-b"})
	var err error
	if csA, err = connect(t, machine(sock, "exec-a", tokA)); err != nil {
		t.Fatal(err)
	}
	if csB, err = connect(t, machine(sock, "exec-b", tokB)); err != nil {
		t.Fatal(err)
	}
	return tokA, csA, csB
}

// TestHostileInsideExecutionScope: an execution of another tree is "not
// found", worded the same as one that does not exist; the caller's own
// child is found.
func TestHostileInsideExecutionScope(t *testing.T) {
	p := &recorder{children: map[string]Status{"exec-a/exec-child": {Execution: "exec-child", Session: "session-child", Status: "running", USD: 0.5, TotalUSD: 0.5}}}
	_, csA, csB := twoExecutions(t, New(p))
	if text, isErr := call(t, csA, "get_execution", map[string]any{"execution": "exec-child"}); isErr || !strings.Contains(text, `"total_usd":0.5`) {
		t.Errorf("A's own child: error %v, %s", isErr, text)
	}
	other, isErr := call(t, csB, "get_execution", map[string]any{"execution": "exec-child"})
	if !isErr || !strings.Contains(other, "not found") {
		t.Errorf("B asking for A's child: error %v, %q, want a not-found tool error", isErr, other)
	}
	missing, _ := call(t, csB, "get_execution", map[string]any{"execution": "exec-nonesuch"})
	if strings.ReplaceAll(other, "exec-child", "X") != strings.ReplaceAll(missing, "exec-nonesuch", "X") {
		t.Errorf("another tree's execution (%q) is told apart from a missing one (%q)", other, missing)
	}
	if text, isErr := call(t, csB, "wait_execution", map[string]any{"execution": "exec-child", "timeout": "1s"}); !isErr || !strings.Contains(text, "not found") {
		t.Errorf("B waiting for A's child: error %v, %q", isErr, text)
	}
}

// TestInsideWaitBoundedByCallerWallTime: a wait never outlasts the
// caller's own wall time, whatever timeout it asks for.
func TestInsideWaitBoundedByCallerWallTime(t *testing.T) {
	p := &recorder{children: map[string]Status{"exec-a/exec-child": {Execution: "exec-child", Status: "running"}}}
	s := New(p)
	sock := serve(t, s)
	deadline := time.Now().Add(90 * time.Second).Truncate(time.Second)
	tok := s.Register(Execution{ID: "exec-a", Session: "session-a", Channel: "exec-a", Deadline: deadline})
	cs, err := connect(t, machine(sock, "exec-a", tok))
	if err != nil {
		t.Fatal(err)
	}
	call(t, cs, "wait_execution", map[string]any{"execution": "exec-child", "timeout": "20h"})
	call(t, cs, "delegate_task", map[string]any{"agent": "writer", "prompt": "go", "wait": true})
	call(t, cs, "wait_execution", map[string]any{"execution": "exec-child", "timeout": "5s"})
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waitCtx) != 3 || !p.waitCtx[0].Equal(deadline) || !p.waitCtx[1].Equal(deadline) || !p.waitCtx[2].Before(deadline.Add(-60*time.Second)) {
		t.Errorf("wait deadlines %v, want %v, %v and about now+5s", p.waitCtx, deadline, deadline)
	}
}

// TestHostileInsideToolArguments: bad arguments (input paths with .., absolute,
// in a .home, another session's non-outputs, duplicate names; globs leaving
// the session; bad durations) are tool errors that say what
// to do, and never reach the platform; good ones arrive parsed.
func TestHostileInsideToolArguments(t *testing.T) {
	p := &recorder{}
	s := New(p)
	sock := serve(t, s)
	tok := s.Register(Execution{ID: "exec-a", Session: "session-a", Channel: "exec-a"})
	cs, err := connect(t, machine(sock, "exec-a", tok))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"delegate_task", map[string]any{"agent": "writer"}, "prompt"},
		{"delegate_task", map[string]any{"agent": " ", "prompt": "x"}, "needs an agent"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "inputs": []string{"/workspace/agents/session-a/notes.md"}}, "drop /workspace/agents/"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "inputs": []string{"session-a/../session-b/.home/x"}}, "not a plain path"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "inputs": []string{"session-a/.home/.claude.json"}}, "private .home"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "inputs": []string{"session-b/inputs/secret"}}, "not under outputs/"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "inputs": []string{"session-a/a/r.md", "session-b/outputs/r.md"}}, "same name"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "outputs": []string{"../x/*"}}, "output"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "outputs": []string{"*.md"}}, "under outputs/"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "limits": map[string]any{"wall_time": "forever"}}, "Go duration"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "limits": map[string]any{"usd": -1}}, "negative"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "skills": []string{"skills/review"}}, "not in a session"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "skills": []string{"session:session-b/skills/review"}}, "not under outputs/"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "skills": []string{"session:session-b/outputs/../inputs"}}, "plain path"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "skills": []string{"session:session-a/.home/skills/x"}}, "private .home"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "context": []map[string]any{{"file": "analyst.toml"}}}, "not yours to read"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "context": []map[string]any{{"to": "CLAUDE.md"}}}, "give the file's text"},
		{"delegate_task", map[string]any{"agent": "writer", "prompt": "x", "mcp_servers": []map[string]any{{"name": "x", "url": 7}}}, "url"},
		{"wait_execution", map[string]any{"execution": "exec-x", "timeout": "-1s"}, "positive"},
		{"wait_for_files", map[string]any{"session": "../x", "pattern": "outputs/*"}, "session id"},
		{"wait_for_files", map[string]any{"session": "session-b", "pattern": ".home/*"}, "private"},
		{"wait_for_files", map[string]any{"session": "session-b", "pattern": "outputs/[x"}, "syntax"},
		{"claim_path", map[string]any{"path": "/etc/passwd"}, "relative"},
		{"claim_path", map[string]any{"path": "a/../../b"}, "plain path"},
		{"release_path", map[string]any{"path": ""}, "plain path"},
		{"list_claims", map[string]any{"prefix": "/x"}, "prefix"},
	} {
		text, isErr := call(t, cs, c.tool, c.args)
		if !isErr || !strings.Contains(text, c.want) {
			t.Errorf("%s %v: error %v, %q, want a tool error with %q", c.tool, c.args, isErr, text, c.want)
		}
	}
	if len(p.callers) != 0 {
		t.Fatalf("bad arguments reached the platform: %+v", p.callers)
	}

	text, isErr := call(t, cs, "delegate_task", map[string]any{"agent": "writer", "prompt": "sum up",
		"inputs": []string{"session-a/notes/n.md", "session-b/outputs/deep/r.md"}, "outputs": []string{"outputs/*.md"},
		"limits":      map[string]any{"usd": 0.25, "turns": 3, "wall_time": "90s", "on_budget": "pause"},
		"mcp_servers": []map[string]any{{"name": "docs", "url": "https://mcp.example.com/mcp", "headers": map[string]string{"X-Team": "a"}}, {"name": "local", "command": []string{"srv", "--stdio"}}},
		"skills":      []string{"session:session-a/skills/review", "session:session-b/outputs/skills/theirs"},
		"context":     []map[string]any{{"text": "Be brief.", "to": "~/.claude/CLAUDE.md"}}})
	var st Status
	if isErr || json.Unmarshal([]byte(text), &st) != nil || st.Execution != "exec-child" || st.Session != "session-child" {
		t.Fatalf("delegate_task: error %v, %s", isErr, text)
	}
	want := Delegation{Agent: "writer", Prompt: "sum up", Outputs: []string{"outputs/*.md"},
		Inputs:     []Input{{Session: "session-a", Path: "notes/n.md", Name: "n.md"}, {Session: "session-b", Path: "outputs/deep/r.md", Name: "r.md"}},
		Limits:     Limits{USD: 0.25, Turns: 3, WallTime: 90 * time.Second, OnBudget: "pause"},
		MCPServers: []MCPServer{{Name: "docs", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"X-Team": "a"}}, {Name: "local", Command: []string{"srv", "--stdio"}}},
		Skills:     []string{"session:session-a/skills/review", "session:session-b/outputs/skills/theirs"},
		Context:    []ContextText{{Text: "Be brief.", To: "~/.claude/CLAUDE.md"}}}
	if got, _ := json.Marshal(p.delegs); string(got) != string(must(json.Marshal([]Delegation{want}))) {
		t.Errorf("delegation %s, want %s", got, must(json.Marshal([]Delegation{want})))
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestInsidePlatformErrorIsToolError: a platform's refusal reaches the
// model as a tool error with its text.
func TestInsidePlatformErrorIsToolError(t *testing.T) {
	s := New(refusing{&recorder{}})
	sock := serve(t, s)
	tok := s.Register(Execution{ID: "exec-a", Session: "session-a", Channel: "exec-a"})
	cs, err := connect(t, machine(sock, "exec-a", tok))
	if err != nil {
		t.Fatal(err)
	}
	text, isErr := call(t, cs, "delegate_task", map[string]any{"agent": "writer", "prompt": "x", "limits": map[string]any{"usd": 5}})
	if !isErr || !strings.Contains(text, "delegate to writer: you have $1 left") {
		t.Errorf("error %v, %q", isErr, text)
	}
}

type refusing struct{ *recorder }

func (refusing) Delegate(context.Context, Caller, Delegation) (Status, error) {
	return Status{}, errors.New("you have $1 left: ask for less")
}

// blocker waits until its context ends.
type blocker struct {
	*recorder
	entered chan struct{}
}

func (b blocker) Wait(ctx context.Context, c Caller, id string) (Status, error) {
	b.entered <- struct{}{}
	<-ctx.Done()
	return Status{Execution: id, Status: "running"}, nil
}

// TestInsideUnregisterEndsWaits: when an execution ends (its token is
// unregistered), its tool calls in flight end too, rather than waiting
// for an answer nobody reads.
func TestInsideUnregisterEndsWaits(t *testing.T) {
	b := blocker{&recorder{}, make(chan struct{}, 1)}
	s := New(b)
	sock := serve(t, s)
	tok := s.Register(Execution{ID: "exec-a", Session: "session-a", Channel: "exec-a"})
	cs, err := connect(t, machine(sock, "exec-a", tok))
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: "wait_execution", Arguments: map[string]any{"execution": "exec-child", "timeout": "20h"}})
		if err != nil {
			answered <- err.Error()
			return
		}
		answered <- res.Content[0].(*mcpsdk.TextContent).Text
	}()
	select {
	case <-b.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the wait never reached the platform")
	}
	s.Unregister(tok)
	select {
	case text := <-answered:
		if !strings.Contains(text, `"status":"running"`) {
			t.Errorf("the ended wait answered %q", text)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait went on after its execution was unregistered")
	}
}

// TestHostileInsideWaitFlood: an agent that starts waits in a loop gets
// MaxInFlight of them and a tool error saying what to do for every call
// beyond; the bound is its own (another execution's calls go on), and a
// wait that ends gives its place back.
func TestHostileInsideWaitFlood(t *testing.T) {
	b := blocker{&recorder{}, make(chan struct{}, MaxInFlight+1)}
	s := New(b)
	tokA, csA, csB := twoExecutions(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, cancelFirst := context.WithCancel(ctx)
	ended := make(chan error, MaxInFlight)
	for i := range MaxInFlight {
		callCtx := ctx
		if i == 0 {
			callCtx = first
		}
		go func() {
			_, err := csA.CallTool(callCtx, &mcpsdk.CallToolParams{Name: "wait_execution", Arguments: map[string]any{"execution": "exec-child", "timeout": "20h"}})
			ended <- err
		}()
	}
	for i := range MaxInFlight {
		select {
		case <-b.entered:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d waits reached the platform", i, MaxInFlight)
		}
	}
	for tool, args := range map[string]map[string]any{
		"wait_execution": {"execution": "exec-child"},
		"wait_for_files": {"session": "session-b", "pattern": "outputs/*"},
		"list_agents":    nil,
	} {
		text, isErr := call(t, csA, tool, args)
		if !isErr || !strings.Contains(text, "in flight") || !strings.Contains(text, "wait for one to end") {
			t.Errorf("%s with %d calls in flight: error %v, %q; want a tool error saying to wait for one", tool, MaxInFlight, isErr, text)
		}
	}
	if text, isErr := call(t, csB, "list_agents", nil); isErr {
		t.Errorf("another execution's call while A has %d in flight: %q", MaxInFlight, text)
	}
	cancelFirst()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("a wait whose caller went away did not end")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		text, isErr := call(t, csA, "list_agents", nil)
		if !isErr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a call after one of %d waits ended: %q", MaxInFlight, text)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Unregister(tokA) // ends the rest
	for range MaxInFlight - 1 {
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Fatal("a wait went on after its execution was unregistered")
		}
	}
}
