package appliance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/agents/modeltest"
	"hearth/client"
)

// TestAgentsContext: through the daemon, an agent whose definition lists
// a skill and a CLAUDE.md from the agents directory has them in its
// session, and a resume adds a skill from the session's own files and a
// context file of the task's.
func TestAgentsContext(t *testing.T) {
	env := startAgentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bashTurn(`cat CLAUDE.md; ls ~/.claude/skills; mkdir -p shared/ours && printf -- '---\nname: from-session\ndescription: Made in the session.\n---\n' > shared/ours/SKILL.md`, modeltest.Usage{}),
		textTurn("first"),
		bashTurn("ls ~/.claude/skills; cat ~/.claude/CLAUDE.md", modeltest.Usage{}),
		textTurn("second"),
	}}, func(cfg *Config) {
		dir := cfg.AgentsDir()
		os.MkdirAll(filepath.Join(dir, "skills", "probe"), 0o755)
		os.MkdirAll(filepath.Join(dir, "context"), 0o755)
		os.WriteFile(filepath.Join(dir, "skills", "probe", "SKILL.md"), []byte("---\nname: from-agents-dir\ndescription: Probes.\n---\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "context", "CLAUDE.md"), []byte("Rule from the agents directory.\n"), 0o644)
		toml := strings.Replace(analystTOML, "[limits]", "skills = [\"skills/probe\"]\n\n[limits]", 1) + "\n[[context]]\nfile = \"context/CLAUDE.md\"\n"
		os.WriteFile(filepath.Join(dir, "analyst.toml"), []byte(toml), 0o644)
	})
	c, ctx := env.c, context.Background()
	defs, err := c.Agents(ctx)
	if err != nil || len(defs) != 1 || strings.Join(defs[0].Skills, ",") != "skills/probe" || len(defs[0].Context) != 1 || defs[0].Context[0].File != "context/CLAUDE.md" {
		t.Errorf("Agents = %+v, %v; want the skill and the context file listed", defs, err)
	}
	e, err := c.Delegate(ctx, DelegateRequest{Agent: "analyst", Prompt: "first", Wait: true})
	evs := allEvents(t, c, e.Id)
	if err != nil || e.Status != "completed" {
		t.Fatalf("Delegate = %+v, %v\n%s", e, err, eventDump(evs))
	}
	if countEvents(evs, "tool_result", "Rule from the agents directory.") != 1 || countEvents(evs, "tool_result", "from-agents-dir") != 1 ||
		countEvents(evs, "status", `"from-agents-dir"`) != 1 {
		t.Errorf("the first execution lacks its context or skill\n%s", eventDump(evs))
	}
	r, err := c.Resume(ctx, e.Session, ResumeRequest{Prompt: "second", Wait: true,
		Skills:  []string{"session:" + e.Session + "/shared/ours"},
		Context: []client.ContextFile{{Text: "Rule from the task.", To: "~/.claude/CLAUDE.md"}}})
	evs = allEvents(t, c, r.Id)
	if err != nil || r.Status != "completed" {
		t.Fatalf("Resume = %+v, %v\n%s", r, err, eventDump(evs))
	}
	if countEvents(evs, "tool_result", "from-agents-dir\\nfrom-session") != 1 || countEvents(evs, "tool_result", "Rule from the task.") != 1 {
		t.Errorf("the resumed execution lacks the session's skill or the task's context\n%s", eventDump(evs))
	}
	// A session's skill that is not there fails the execution, saying so.
	f, err := c.Resume(ctx, e.Session, ResumeRequest{Prompt: "third", Wait: true, Skills: []string{"session:" + e.Session + "/shared/none"}})
	if err == nil && f.Status != "failed" || !strings.Contains(f.Error+errString(err), "shared/none") {
		t.Errorf("a missing session skill: %+v, %v; want failed naming it", f, err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
