package appliance

import (
	"bytes"
	"context"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/agents/modeltest"
)

// TestDoorRefusals: numbers, sizes and ids the daemon used to take and
// misread are refused at the API with 4xx errors that say what to give:
// money under the ledger's unit (recorded as $0, or a budget that was no
// limit), "@every" under a minute (fired every second), a schedule id in
// use (silently replaced), prompts over 1 MiB or with NUL; and an agent
// file with usd = nan is refused at reload instead of breaking the list
// of agents.
func TestDoorRefusals(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{textTurn("done")}}, nil)
	ctx := context.Background()
	c := env.c
	if _, err := c.AddSchedule(ctx, ScheduleRequest{Id: "daily", Spec: "@daily", Agent: "analyst", Prompt: "first"}); err != nil {
		t.Fatalf("AddSchedule(daily) = %v", err)
	}
	runErrorCases(t, []errorCase{
		{"credits under a micro-dollar", func() error { _, err := c.AddCredits(ctx, 1e-9, "dust"); return err }, "bad_request", 400, "ledger's unit"},
		{"budget under a micro-dollar", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Limits: Limits{Usd: 1e-7}})
			return err
		}, "bad_request", 400, "limits.usd"},
		{"schedule budget under a micro-dollar", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "tiny", Spec: "@daily", Agent: "analyst", Prompt: "go", Limits: Limits{Usd: 1e-7}})
			return err
		}, "bad_request", 400, "limits.usd"},
		{"every 0s", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "fast", Spec: "@every 0s", Agent: "analyst", Prompt: "go"})
			return err
		}, "bad_request", 400, "at least 1m0s apart"},
		{"every -5s", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "fast", Spec: "@every -5s", Agent: "analyst", Prompt: "go"})
			return err
		}, "bad_request", 400, "at least 1m0s apart"},
		{"every 1ns", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "fast", Spec: "@every 1ns", Agent: "analyst", Prompt: "go"})
			return err
		}, "bad_request", 400, "at least 1m0s apart"},
		{"schedule id in use", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "daily", Spec: "@hourly", Agent: "analyst", Prompt: "second"})
			return err
		}, "conflict", 409, "hearth schedules rm daily"},
		{"prompt over 1 MiB", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: strings.Repeat("a", maxPrompt+1)})
			return err
		}, "too_large", 413, "1 MiB"},
		{"resume prompt over 1 MiB", func() error {
			_, err := c.Resume(ctx, "session-00000000", ResumeRequest{Prompt: strings.Repeat("a", maxPrompt+1)})
			return err
		}, "too_large", 413, "1 MiB"},
		{"schedule prompt over 1 MiB", func() error {
			_, err := c.AddSchedule(ctx, ScheduleRequest{Id: "big", Spec: "@daily", Agent: "analyst", Prompt: strings.Repeat("a", maxPrompt+1)})
			return err
		}, "too_large", 413, "1 MiB"},
		{"inputs over 16 MiB", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go",
				Inputs: map[string][]byte{"a.bin": make([]byte, maxInputs/2), "b.bin": make([]byte, maxInputs/2+1)}})
			return err
		}, "too_large", 413, "16 MiB"},
		{"prompt with NUL", func() error {
			_, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go\x00on"})
			return err
		}, "bad_request", 400, "NUL byte at offset 2"},
	})
	list, err := c.Schedules(ctx)
	if err != nil || len(list) != 1 || list[0].Id != "daily" || list[0].Spec != "@daily" || list[0].Prompt != "first" {
		t.Errorf("Schedules after the refusals = %+v, %v; want daily alone, unchanged", list, err)
	}
	if cr, err := c.Credits(ctx); err != nil || len(cr.Entries) != 0 {
		t.Errorf("Credits after the refusals = %+v, %v; want no entry", cr, err)
	}

	if err := os.WriteFile(filepath.Join(env.cfg.AgentsDir(), "nan.toml"), []byte("image = \"claude-code\"\nmodel = \"m\"\n[limits]\nusd = nan\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rl, err := c.ReloadAgents(ctx)
	if err != nil || len(rl.Problems) != 1 || !strings.Contains(rl.Problems[0], "nan.toml") || !strings.Contains(rl.Problems[0], "limits.usd = NaN") {
		t.Errorf("ReloadAgents with usd = nan = %+v, %v; want the file and key named as a problem", rl, err)
	}
	if defs, err := c.Agents(ctx); err != nil || len(defs) != 1 || defs[0].Name != "analyst" {
		t.Errorf("Agents after a NaN file = %+v, %v; want analyst listed", defs, err)
	}
}

// TestLongPrompt: a prompt over the kernel's 128 KiB bound on one
// argument reaches the model whole (the agent CLI reads it on stdin), and
// a list of executions shows only its first 200 characters.
func TestLongPrompt(t *testing.T) {
	const end = "END-OF-THE-LONG-PROMPT"
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		{Match: modeltest.LastUserContains(end), Blocks: []modeltest.Block{modeltest.Text("read it all")}, Usage: modeltest.Usage{InputTokens: 10, OutputTokens: 10}},
		textTurn("the prompt was cut"),
	}}, nil)
	ctx := context.Background()
	prompt := strings.Repeat("Summarise this line of the report.\n", 200<<10/35) + end
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: prompt, Wait: true})
	if err != nil {
		t.Fatalf("Delegate(%d bytes) = %v", len(prompt), err)
	}
	if e.Status != "completed" || e.Result != "read it all" || e.Prompt != prompt {
		t.Errorf("execution of a %d-byte prompt = %s, result %q, error %q; want completed with the whole prompt read",
			len(prompt), e.Status, e.Result, e.Error)
	}
	list, err := env.c.Executions(ctx, ExecutionFilter{})
	if err != nil || len(list) != 1 || list[0].Prompt != prompt[:200] || !list[0].PromptTruncated {
		t.Errorf("Executions = %d, %v; want one with a 200-character preview marked truncated", len(list), err)
	}
	if got, err := env.c.Execution(ctx, e.Id); err != nil || got.Prompt != prompt || got.PromptTruncated {
		t.Errorf("Execution(%s) = %d bytes, %v; want the whole prompt", e.Id, len(got.Prompt), err)
	}
}

// TestDoorMultipart: a streamed delegate whose parts are out of order,
// unnamed or twice the same file is a 400; one refused after its files
// were staged (an unknown agent) leaves nothing in <state_dir>/uploads.
func TestDoorMultipart(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{textTurn("done")}}, nil)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", env.cfg.SocketPath())
	}}}
	post := func(parts ...[3]string) (int, string) {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		for _, p := range parts {
			var w io.Writer
			if p[1] == "" {
				w, _ = mw.CreateFormField(p[0])
			} else {
				w, _ = mw.CreateFormFile(p[0], p[1])
			}
			io.WriteString(w, p[2])
		}
		mw.Close()
		resp, err := hc.Post("http://hearth/v1/executions", mw.FormDataContentType(), &body)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	request := func(agent string) [3]string {
		return [3]string{"request", "", `{"agent":"` + agent + `","prompt":"go"}`}
	}
	for _, tc := range []struct {
		name   string
		parts  [][3]string
		status int
		msg    string
	}{
		{"file first", [][3]string{{"input", "a.txt", "x"}, request("analyst")}, 400, `the first part must be \"request\"`},
		{"unknown field", [][3]string{{"request", "", `{"agent":"analyst","prompt":"go","budget":1}`}}, 400, "unknown field"},
		{"part not an input", [][3]string{request("analyst"), {"other", "a.txt", "x"}}, 400, "want parts named input"},
		{"input without a name", [][3]string{request("analyst"), {"input", "", "x"}}, 400, "want parts named input"},
		{"same file twice", [][3]string{request("analyst"), {"input", "a.txt", "x"}, {"input", "a.txt", "y"}}, 400, "once"},
		{"unknown agent", [][3]string{request("nobody"), {"input", "a.txt", "x"}}, 404, "no agent"},
	} {
		status, body := post(tc.parts...)
		if status != tc.status || !strings.Contains(body, tc.msg) {
			t.Errorf("%s: %d %s; want %d with %q", tc.name, status, body, tc.status, tc.msg)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(env.cfg.StateDir, "uploads", "*")); len(left) != 0 {
		t.Errorf("refused uploads left staged: %q", left)
	}
}
