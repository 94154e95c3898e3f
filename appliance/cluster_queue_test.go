package appliance

import (
	"testing"

	"hearth/cluster"
)

// TestSharedWorkspaceQueues: a node on a shared workspace lists a queue
// per image in it, the workspace is read back from what a node listed,
// and a node whose workspace is its own names none.
func TestSharedWorkspaceQueues(t *testing.T) {
	ws := "SHA256:abc/def+ghi" // fingerprints hold '/' and '+'
	n := cluster.Node{ID: "h2", Images: []string{nodeQueue("h2"), "base", sharedQueue(ws, "base"), "claude-code", sharedQueue(ws, "claude-code")}}
	if got := sharedWorkspace(n); got != ws {
		t.Fatalf("sharedWorkspace = %q, want %q", got, ws)
	}
	if got := sharedWorkspace(cluster.Node{ID: "h3", Images: []string{nodeQueue("h3"), "base"}}); got != "" {
		t.Fatalf("a node on its own workspace: sharedWorkspace = %q, want none", got)
	}
	if sharedQueue(ws, "base") == sharedQueue(ws, "claude-code") || sharedQueue(ws, "base") == sharedQueue("SHA256:other", "base") {
		t.Fatal("shared queues of different images or workspaces collide")
	}
}
