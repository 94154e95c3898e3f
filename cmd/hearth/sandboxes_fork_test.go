package main

import (
	"encoding/json"
	"testing"

	"hearth/client"
)

// TestSandboxForkCommand: fork makes sandboxes with the source's files,
// says no process and nothing in /tmp is carried over, refuses a bad count before asking the
// daemon, and ls --json shows where a fork came from.
func TestSandboxForkCommand(t *testing.T) {
	c, _ := sandboxDaemon(t)
	runSteps(t, []step{
		{args: []string{"sandboxes", "create", "--idle-timeout", "0", "--disk", "64M", "box", c}, wantOut: "box\n", exactOut: true},
		{args: []string{"sandboxes", "exec", "box", c, "--", "sh", "-c", "echo before > /home/agent/state"}},
		{args: []string{"sandboxes", "fork", "box", "--count", "2", c}, wantOut: "; no process and nothing in /tmp carried over):"},
		{args: []string{"sandboxes", "fork", "box", "--count", "0", c}, wantCode: exitUsage, wantErr: "give 1 to 16"},
		{args: []string{"sandboxes", "fork", "box", "--count", "17", c}, wantCode: exitUsage, wantErr: "give 1 to 16"},
		{args: []string{"sandboxes", "fork", "nope", c}, wantCode: exitNotFound},
	})
	out, errOut, code := hearthIn(t, "", "sandboxes", "fork", "box", "--json", c)
	var res client.ForkResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Sandboxes) != 1 {
		t.Fatalf("sandboxes fork --json = %d %q %q, want one fork", code, out, errOut)
	}
	runSteps(t, []step{{args: []string{"sandboxes", "exec", res.Sandboxes[0].Id, c, "--", "cat", "/home/agent/state"}, wantOut: "before\n", exactOut: true}})
	out, _, _ = hearthIn(t, "", "sandboxes", "ls", "--json", c)
	var list []client.Sandbox
	forks := 0
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("sandboxes ls --json: %v: %q", err, out)
	}
	for _, s := range list {
		if s.ForkedFrom == "box" {
			forks++
		}
	}
	if forks != 3 {
		t.Errorf("sandboxes ls --json lists %d sandboxes forked from box, want 3", forks)
	}
}
