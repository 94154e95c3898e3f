package main

import (
	"bytes"
	"strings"
	"testing"

	"hearth/client"
)

// TestAgentsTree: list --tree puts each child under its parent (children
// oldest first, grandchildren deeper), roots keep the page's newest-first
// order, and a child whose parent is not on the page stands alone;
// show prints the parent, the totals and the children with their status
// and cost.
func TestAgentsTree(t *testing.T) {
	ex := func(id, parent string) client.Execution {
		return client.Execution{Id: id, Parent: parent, Agent: "analyst", Status: "completed"}
	}
	// Newest first, as the API lists them.
	page := []client.Execution{ex("e6", ""), ex("e5", "e2"), ex("e4", "e3"), ex("e3", "e1"), ex("e2", "e1"), ex("e1", ""), ex("e0", "gone")}
	list, indent := asTree(page)
	var got []string
	for _, e := range list {
		got = append(got, indent[e.Id]+e.Id)
	}
	want := []string{"e6", "e1", "└ e2", "  └ e5", "└ e3", "  └ e4", "e0"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("tree:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	var b bytes.Buffer
	e := client.Execution{Id: "exec-0000000b", Parent: "exec-0000000a", Depth: 1, Agent: "analyst", Kind: "run", Status: "completed",
		Usd: 0.25, TotalUsd: 0.75, TotalTokens: client.Tokens{Input: 1200, Output: 30}, Children: []string{"exec-0000000c", "exec-0000000d"}}
	kids := []client.Execution{ // newest first
		{Id: "exec-0000000d", Agent: "writer", Status: "budget_exceeded", TotalUsd: 0.3},
		{Id: "exec-0000000c", Agent: "writer\x1b[2J", Status: "completed", TotalUsd: 0.2},
	}
	printExecution(&b, e, kids)
	out := b.String()
	for _, w := range []string{
		"parent         exec-0000000a (depth 1)",
		"with children  1,200 in / 30 out tokens, $0.75",
		"children       exec-0000000c  writer\\x1b[2J  completed  $0.20",
		"               exec-0000000d  writer  budget_exceeded  $0.30",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("show lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("show printed an agent's escape sequence:\n%q", out)
	}
}
