package mcp

import (
	"context"
	"fmt"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxForks is the daemon's bound on one fork request, checked here too.
const maxForks = 16

const forkDescription = "Fork a sandbox: make count (1 to 16, default 1) new sandboxes that start with a copy of its files as they are now " +
	"(outside and, with a session, inside its workspace, each fork's session a branch of its). " +
	"Memory is not carried over: each fork starts with no process running and an empty /tmp (a tmpfs). The source is paused only while its files are captured."

type forkArgs struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox id to fork"`
	Count   int    `json:"count,omitempty" jsonschema:"how many forks, 1 to 16; default 1"`
}

type forked struct {
	Sandboxes []sandboxInfo `json:"sandboxes"`
	Reflinked bool          `json:"reflinked" jsonschema:"the files were captured as reflinks (shared extents), not copied"`
}

func (h *handlers) sandboxFork(ctx context.Context, _ *mcpsdk.CallToolRequest, in forkArgs) (*mcpsdk.CallToolResult, forked, error) {
	if err := checkSandbox(in.Sandbox); err != nil {
		return nil, forked{}, err
	}
	if in.Count == 0 {
		in.Count = 1
	}
	if in.Count < 1 || in.Count > maxForks {
		return nil, forked{}, fmt.Errorf("count %d: give 1 to %d forks", in.Count, maxForks)
	}
	res, err := h.d.ForkSandbox(ctx, in.Sandbox, in.Count)
	if err != nil {
		return nil, forked{}, err
	}
	out := forked{Sandboxes: []sandboxInfo{}, Reflinked: res.Reflinked}
	for _, s := range res.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, fromSandbox(s))
	}
	return nil, out, nil
}
