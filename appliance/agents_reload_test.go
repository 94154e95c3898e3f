package appliance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestAgentsReload: a reload adds a new agent (and its schedule), keeps
// the previous definition of a file broken while editing and says so,
// and removes an agent whose file is gone; the runner takes new tasks
// for the agents as they are now.
func TestAgentsReload(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{PerConversation: true, Turns: []modeltest.Turn{textTurn("done")}}, nil)
	ctx := context.Background()
	dir := env.cfg.AgentsDir()
	writer := "image = \"claude-code\"\nmodel = \"claude-sonnet-4-5\"\nschedule = \"@daily\"\n[limits]\nusd = 1.0\n"
	if err := os.WriteFile(filepath.Join(dir, "writer.toml"), []byte(writer), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "analyst.toml"), []byte("image = \n"), 0o644) // a typo mid-edit

	r, err := env.c.ReloadAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(r.Agents, ",") != "analyst,writer" || len(r.Problems) != 1 ||
		!strings.Contains(r.Problems[0], "analyst.toml") || !strings.Contains(r.Problems[0], "keeps the definition loaded before") {
		t.Fatalf("reload = %+v; want analyst (kept) and writer, and one problem naming analyst.toml", r)
	}
	scheds, _ := env.c.Schedules(ctx)
	if !slices.ContainsFunc(scheds, func(s Schedule) bool { return s.Id == "agent-writer" }) {
		t.Errorf("schedules after the reload = %+v, want agent-writer", scheds)
	}
	e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "writer", Prompt: "go", Wait: true})
	if err != nil || e.Status != "completed" {
		t.Fatalf("a task for the new agent: %+v, %v", e, err)
	}
	if e, err := env.c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "go", Wait: true}); err != nil || e.Status != "completed" {
		t.Fatalf("a task for the kept agent: %+v, %v", e, err)
	}

	os.Remove(filepath.Join(dir, "writer.toml"))
	if r, err = env.c.ReloadAgents(ctx); err != nil || strings.Join(r.Agents, ",") != "analyst" {
		t.Fatalf("reload after removing writer = %+v, %v", r, err)
	}
	scheds, _ = env.c.Schedules(ctx)
	if slices.ContainsFunc(scheds, func(s Schedule) bool { return s.Id == "agent-writer" }) {
		t.Error("agent-writer's schedule outlived its definition")
	}
	var ae *client.APIError
	if _, err := env.c.Delegate(ctx, DelegateRequest{Agent: "writer", Prompt: "go"}); !errors.As(err, &ae) || ae.Code != codeNotFound {
		t.Errorf("a task for the removed agent = %v, want not_found", err)
	}
}
