package main

import (
	"regexp"
	"testing"

	"hearth/agents/modeltest"
)

// TestAgentsRewindCommands: a two-call run, then hearth agents branch
// and rewind at call 1 (with what to do next in their output), --undo,
// a missing --call refused at the door, and sessions showing the branch.
func TestAgentsRewindCommands(t *testing.T) {
	c, _ := agentDaemon(t, modeltest.Config{Turns: []modeltest.Turn{
		bash("mkdir -p outputs && echo one > outputs/a.txt"),
		say("done"),
	}}, false)
	out, errOut, code := hearthIn(t, "", "agents", "run", "analyst", "write a file", c)
	if code != 0 {
		t.Fatalf("agents run = %d, %q", code, errOut)
	}
	session := regexp.MustCompile(`session-[0-9a-f]{6}`).FindString(out)
	runSteps(t, []step{
		{args: []string{"agents", "rewind", session, c}, wantCode: exitUsage, wantErr: "--call N"},
		{args: []string{"agents", "branch", session, "--call", "1", "cli-branch", c}, wantOut: "branched session cli-branch from " + session + " at call 1"},
		{args: []string{"agents", "rewind", session, "--call", "1", c}, wantOut: "hearth agents rewind " + session + " --undo"},
		{args: []string{"agents", "rewind", session, "--undo", c}, wantOut: "is back at snapshot rewind-"},
		{args: []string{"agents", "rewind", session, "--call", "7", c}, wantCode: exitNotFound, wantErr: "no call 7"},
		{args: []string{"agents", "sessions", c}, wantOut: "branch of " + session},
	})
}
