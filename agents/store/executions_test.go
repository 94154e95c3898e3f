package store

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"hearth/agents/stream"
)

func TestSessions(t *testing.T) {
	s := openTest(t)
	a, err := s.CreateSession(ctx, Session{Agent: "analyst"})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^session-[0-9a-f]{6}$`).MatchString(a.ID) {
		t.Errorf("session id %q, want session-xxxxxx", a.ID)
	}
	if _, err := s.CreateSession(ctx, Session{ID: a.ID, Agent: "analyst"}); !errors.Is(err, ErrExists) {
		t.Errorf("CreateSession(existing id) = %v, want ErrExists", err)
	}
	if _, err := s.CreateSession(ctx, Session{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("CreateSession(no agent) = %v, want ErrInvalid", err)
	}
	if err := s.SetAgentSessionID(ctx, a.ID, "9f0c-claude"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetAgentSessionID(ctx, "session-000000", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetAgentSessionID(unknown) = %v, want ErrNotFound", err)
	}
	e, err := s.CreateExecution(ctx, Execution{Session: a.ID, Prompt: "p"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSession(ctx, a.ID)
	if err != nil || got.AgentSessionID != "9f0c-claude" || got.LastExecution != e.ID || !got.Created.Equal(a.Created) {
		t.Errorf("GetSession = %+v, %v; want agent session id, last execution %s, created %v", got, err, e.ID, a.Created)
	}
	if _, err := s.GetSession(ctx, "session-000000"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSession(unknown) = %v, want ErrNotFound", err)
	}

	for i := range 5 {
		if _, err := s.CreateSession(ctx, Session{Agent: fmt.Sprint("agent", i%2)}); err != nil {
			t.Fatal(err)
		}
	}
	var pages [][]Session
	for before := ""; ; {
		page, err := s.ListSessions(ctx, SessionFilter{Limit: 4, Before: before})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		pages = append(pages, page)
		before = page[len(page)-1].ID
	}
	if len(pages) != 2 || len(pages[0]) != 4 || len(pages[1]) != 2 || pages[1][1].ID != a.ID {
		t.Errorf("ListSessions pages of 4 = %v, want 4 + 2 ending with the first session", pages)
	}
	if got, _ := s.ListSessions(ctx, SessionFilter{Agent: "agent1"}); len(got) != 2 {
		t.Errorf("ListSessions(agent1) = %d sessions, want 2", len(got))
	}
}

func TestCreateExecution(t *testing.T) {
	s := openTest(t)
	first := newExec(t, s)
	other, _ := s.CreateSession(ctx, Session{Agent: "writer"})
	if !regexp.MustCompile(`^exec-[0-9a-f]{8}$`).MatchString(first.ID) {
		t.Errorf("execution id %q, want exec-xxxxxxxx", first.ID)
	}
	if first.Agent != "analyst" || first.Status != Pending || first.Kind != Run || first.Created.IsZero() {
		t.Errorf("CreateExecution = %+v, want agent from session, pending run, created set", first)
	}
	for _, tc := range []struct {
		name string
		e    Execution
		want error
	}{
		{"resume", Execution{Session: first.Session, Kind: Resume, Previous: first.ID}, nil},
		{"retry in another session", Execution{Session: other.ID, Kind: Retry, Previous: first.ID}, nil},
		{"with limits", Execution{Session: first.Session, Limits: Limits{USD: 2.5, Turns: 10, WallTime: time.Minute}}, nil},
		{"unknown session", Execution{Session: "session-000000"}, ErrNotFound},
		{"unknown previous", Execution{Session: first.Session, Kind: Retry, Previous: "exec-00000000"}, ErrNotFound},
		{"resume in another session", Execution{Session: other.ID, Kind: Resume, Previous: first.ID}, ErrInvalid},
		{"resume without previous", Execution{Session: first.Session, Kind: Resume}, ErrInvalid},
		{"run with previous", Execution{Session: first.Session, Previous: first.ID}, ErrInvalid},
		{"other agent", Execution{Session: first.Session, Agent: "writer"}, ErrInvalid},
		{"not pending", Execution{Session: first.Session, Status: Running}, ErrInvalid},
		{"negative limit", Execution{Session: first.Session, Limits: Limits{USD: -1}}, ErrInvalid},
		{"existing id", Execution{ID: first.ID, Session: first.Session}, ErrExists},
		{"no session", Execution{}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.CreateExecution(ctx, tc.e)
			if !errors.Is(err, tc.want) {
				t.Fatalf("CreateExecution(%+v) = %v, want %v", tc.e, err, tc.want)
			}
			if err != nil {
				return
			}
			stored, err := s.GetExecution(ctx, got.ID)
			if err != nil {
				t.Fatal(err)
			}
			if stored.Limits != tc.e.Limits || stored.Previous != tc.e.Previous || !stored.Created.Equal(got.Created) {
				t.Errorf("GetExecution = %+v, want %+v", stored, got)
			}
		})
	}
	if _, err := s.GetExecution(ctx, "exec-00000000"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetExecution(unknown) = %v, want ErrNotFound", err)
	}
}

func TestStatusTransitions(t *testing.T) {
	s := openTest(t)
	for _, tc := range []struct {
		path []Status // from pending
		ok   bool
	}{
		{[]Status{Running, Completed}, true},
		{[]Status{Running, Running, BudgetExceeded}, true},
		{[]Status{Running, TimedOut}, true},
		{[]Status{Cancelled}, true},
		{[]Status{Running, Interrupted}, true},
		{[]Status{Running, Completed, Running}, false},
		{[]Status{Running, Failed, Completed}, false},
		{[]Status{Running, Pending}, false},
		{[]Status{Completed}, false},
		{[]Status{"exploded"}, false},
	} {
		t.Run(fmt.Sprint(tc.path), func(t *testing.T) {
			e := newExec(t, s)
			var err error
			for _, st := range tc.path {
				e, err = s.UpdateExecution(ctx, e.ID, func(e *Execution) error { e.Status = st; return nil })
				if err != nil {
					break
				}
			}
			if (err == nil) != tc.ok {
				t.Fatalf("pending -> %v: %v, want ok=%v", tc.path, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidTransition) && !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v, want ErrInvalidTransition or ErrInvalid", err)
			}
		})
	}
}

func TestUpdateExecution(t *testing.T) {
	s := openTest(t)
	e := newExec(t, s)
	run := setStatus(t, s, e.ID, Running)
	if run.Started.IsZero() || !run.Ended.IsZero() {
		t.Errorf("running: started %v ended %v, want started set only", run.Started, run.Ended)
	}
	done, err := s.UpdateExecution(ctx, e.ID, func(e *Execution) error {
		e.Status, e.Turns, e.USD, e.Result = Completed, 3, 0.123456, "wrote outputs/report.md"
		e.Tokens = Tokens{Input: 1200, Output: 340, CacheRead: 5000, CacheCreation: 800}
		e.Outputs = []string{"outputs/report.md"}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetExecution(ctx, e.ID)
	if got.Ended.IsZero() || !got.Started.Equal(run.Started) || got.Turns != 3 || got.USD != 0.123456 ||
		got.Tokens != done.Tokens || !slices.Equal(got.Outputs, done.Outputs) || got.Result != done.Result {
		t.Errorf("GetExecution = %+v, want %+v", got, done)
	}
	sentinel := errors.New("changed my mind")
	if _, err := s.UpdateExecution(ctx, e.ID, func(*Execution) error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("UpdateExecution with failing fn = %v, want its error", err)
	}
	for name, fn := range map[string]func(*Execution){
		"prompt":  func(e *Execution) { e.Prompt = "something else" },
		"session": func(e *Execution) { e.Session = "session-000000" },
		"tokens":  func(e *Execution) { e.Tokens.Input = -1 },
	} {
		if _, err := s.UpdateExecution(ctx, e.ID, func(e *Execution) error { fn(e); return nil }); !errors.Is(err, ErrInvalid) {
			t.Errorf("UpdateExecution changing %s = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := s.UpdateExecution(ctx, "exec-00000000", func(*Execution) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("UpdateExecution(unknown) = %v, want ErrNotFound", err)
	}
}

func TestListExecutions(t *testing.T) {
	s := openTest(t)
	sa, _ := s.CreateSession(ctx, Session{Agent: "analyst"})
	sw, _ := s.CreateSession(ctx, Session{Agent: "writer"})
	var all []string // oldest first
	for i := range 25 {
		sess := sa.ID
		if i%5 == 0 {
			sess = sw.ID
		}
		e, err := s.CreateExecution(ctx, Execution{Session: sess, Prompt: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			setStatus(t, s, e.ID, Running)
		}
		all = append(all, e.ID)
	}
	slices.Reverse(all)

	var paged []string
	for before := ""; ; {
		page, err := s.ListExecutions(ctx, ExecutionFilter{Limit: 10, Before: before})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			paged = append(paged, e.ID)
		}
		before = page[len(page)-1].ID
	}
	if !slices.Equal(paged, all) {
		t.Errorf("pages of 10 = %v, want newest first %v", paged, all)
	}
	for _, tc := range []struct {
		f    ExecutionFilter
		want int
	}{
		{ExecutionFilter{Session: sw.ID}, 5},
		{ExecutionFilter{Agent: "analyst"}, 20},
		{ExecutionFilter{Status: []Status{Running}}, 9},
		{ExecutionFilter{Status: []Status{Running, Pending}}, 25},
		{ExecutionFilter{Agent: "writer", Status: []Status{Running}}, 2}, // i = 0, 15
		{ExecutionFilter{Limit: 7}, 7},
		{ExecutionFilter{Before: all[20]}, 4},
	} {
		got, err := s.ListExecutions(ctx, tc.f)
		if err != nil || len(got) != tc.want {
			t.Errorf("ListExecutions(%+v) = %d executions, %v; want %d", tc.f, len(got), err, tc.want)
		}
	}
}

// TestInterruptRunningAfterCrash runs a daemon in a child process that
// starts executions, writes events and dies without closing the store.
func TestInterruptRunningAfterCrash(t *testing.T) {
	if path := os.Getenv("HEARTH_STORE_CRASH"); path != "" {
		crashingDaemon(path)
		return
	}
	path := filepath.Join(t.TempDir(), "hearth.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestInterruptRunningAfterCrash$")
	cmd.Env = append(os.Environ(), "HEARTH_STORE_CRASH="+path)
	out, err := cmd.CombinedOutput()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("crashing daemon: %v, want exit code 3; output:\n%s", err, out)
	}

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open after crash: %v", err)
	}
	defer s.Close()
	if avail, reserved, _, _ := s.Balance(ctx); reserved != 3 || avail != 7 {
		t.Errorf("balance after crash: available %v reserved %v, want 7 and 3", avail, reserved)
	}
	// One kept (its agent is taken up again), then the rest.
	running, _ := s.ListExecutions(ctx, ExecutionFilter{Status: []Status{Running}})
	first, err := s.InterruptRunning(ctx, running[0].ID)
	if err != nil || len(first) != 1 || first[0].Prompt != "pending" {
		t.Fatalf("InterruptRunning keeping the running one = %+v, %v; want only the pending one changed", first, err)
	}
	got, err := s.InterruptRunning(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, first...)
	var ids []string
	for _, e := range got {
		ids = append(ids, e.Prompt)
		if e.Status != Interrupted || e.Ended.IsZero() || e.Error == "" {
			t.Errorf("interrupted execution %+v: want status interrupted, ended and error set", e)
		}
	}
	if !slices.Equal(ids, []string{"running", "pending"}) {
		t.Errorf("InterruptRunning changed %v, want the running and the pending one", ids)
	}
	running, _ = s.ListExecutions(ctx, ExecutionFilter{Status: []Status{Running, Pending}})
	if len(running) != 0 {
		t.Errorf("still running after InterruptRunning: %v", running)
	}
	done, _ := s.ListExecutions(ctx, ExecutionFilter{Status: []Status{Completed}})
	if len(done) != 1 {
		t.Errorf("completed executions = %d, want the finished one kept", len(done))
	}
	evs, err := s.Events(ctx, got[0].ID, 0, 0)
	if err != nil || len(evs) != 100 {
		t.Errorf("events of interrupted execution = %d, %v; want 100 kept", len(evs), err)
	}
	if avail, reserved, _, _ := s.Balance(ctx); reserved != 0 || avail != 10 {
		t.Errorf("balance after InterruptRunning: available %v reserved %v, want 10 and 0", avail, reserved)
	}
	if again, err := s.InterruptRunning(ctx); err != nil || len(again) != 0 {
		t.Errorf("second InterruptRunning = %v, %v; want nothing", again, err)
	}
	// The stream continues after the crash without a gap.
	evs, err = s.Append(ctx, stream.New("", got[0].ID, stream.Status, map[string]string{"status": "interrupted"}))
	if err != nil || evs[0].Seq != 101 {
		t.Errorf("Append after crash = %v, %v; want seq 101", evs, err)
	}
}

// crashingDaemon is the child process of TestInterruptRunningAfterCrash.
func crashingDaemon(path string) {
	s, err := Open(path)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	must := func(err error) {
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
	}
	sess, err := s.CreateSession(ctx, Session{Agent: "analyst"})
	must(err)
	must(s.AddCredits(ctx, 10, "test"))
	for _, prompt := range []string{"finished", "running", "pending"} {
		e, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Prompt: prompt})
		must(err)
		if prompt == "pending" {
			continue
		}
		_, err = s.UpdateExecution(ctx, e.ID, func(e *Execution) error { e.Status = Running; return nil })
		must(err)
		if prompt == "finished" {
			_, err = s.UpdateExecution(ctx, e.ID, func(e *Execution) error { e.Status = Completed; return nil })
			must(err)
			continue
		}
		must(s.Reserve(ctx, e.ID, 3))
		for i := range 100 {
			_, err := s.Append(ctx, stream.New(sess.ID, e.ID, stream.Text, map[string]int{"i": i}))
			must(err)
		}
	}
	os.Exit(3) // no Close: the daemon dies
}

// TestListExecutionsPromptPreview: a list with PromptPreview cuts long
// prompts to that many characters (not bytes) and says so; one execution
// read alone keeps its whole prompt.
func TestListExecutionsPromptPreview(t *testing.T) {
	s := openTest(t)
	sess, _ := s.CreateSession(ctx, Session{Agent: "analyst"})
	long := strings.Repeat("é", 300) + "end"
	el, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Prompt: long})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Prompt: strings.Repeat("x", 200)}); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListExecutions(ctx, ExecutionFilter{PromptPreview: 200})
	if err != nil || len(list) != 2 {
		t.Fatalf("ListExecutions = %d, %v", len(list), err)
	}
	if got := list[0]; got.Prompt != strings.Repeat("x", 200) || got.PromptTruncated {
		t.Errorf("a 200-character prompt listed as %d bytes, truncated %v; want it whole", len(got.Prompt), got.PromptTruncated)
	}
	if got := list[1]; got.Prompt != strings.Repeat("é", 200) || !got.PromptTruncated {
		t.Errorf("a 303-character prompt listed as %q, truncated %v; want its first 200 characters", got.Prompt, got.PromptTruncated)
	}
	if e, err := s.GetExecution(ctx, el.ID); err != nil || e.Prompt != long || e.PromptTruncated {
		t.Errorf("GetExecution = %d bytes, %v; want the whole prompt", len(e.Prompt), err)
	}
}

// TestExecutionOnBudget: what reaching the dollar limit does is kept
// with the execution (so a daemon taking it up after a restart goes on
// with it), read back from a fresh open, kept by updates; a value that
// is neither stop nor pause is refused, by the store and by the schema.
func TestExecutionOnBudget(t *testing.T) {
	open := openSame(t)
	s, err := open()
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.CreateSession(ctx, Session{Agent: "analyst"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Prompt: "go", Limits: Limits{USD: 1, OnBudget: OnBudgetPause}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateExecution(ctx, e.ID, func(e *Execution) error { e.Status, e.Limits.USD = Running, 3; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Prompt: "go", Limits: Limits{OnBudget: "later"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("CreateExecution with on_budget later = %v, want ErrInvalid", err)
	}
	if _, err := s.UpdateExecution(ctx, e.ID, func(e *Execution) error { e.Limits.OnBudget = "later"; return nil }); !errors.Is(err, ErrInvalid) {
		t.Errorf("UpdateExecution to on_budget later = %v, want ErrInvalid", err)
	}
	if _, err := s.w.Exec("UPDATE executions SET on_budget = 'later' WHERE id = ?", e.ID); err == nil {
		t.Error("the schema took on_budget = 'later'")
	}
	s.Close()
	s, err = open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.GetExecution(ctx, e.ID)
	if err != nil || got.Limits != (Limits{USD: 3, OnBudget: OnBudgetPause}) {
		t.Errorf("after a reopen: limits %+v, %v; want $3 and pause", got.Limits, err)
	}
	list, err := s.ListExecutions(ctx, ExecutionFilter{Session: sess.ID})
	if err != nil || len(list) != 1 || list[0].Limits.OnBudget != OnBudgetPause {
		t.Errorf("ListExecutions = %+v, %v; want the one execution, pause", list, err)
	}
}
