package agents

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"hearth/agents/channel"
	"hearth/agents/inside"
	"hearth/vmm/guest"
)

// insideConfigFile is where the agent CLI's configuration of the hearth
// MCP server is written, relative to the session: in its private home,
// for it holds the execution's token, next to the agent's own MCP
// configuration (agentctx_place.go), owned by the machine's root and
// read-only.
const insideConfigFile = hearthDir + "/mcp-hearth.json"

// inside admits the execution to the hearth MCP server (package
// agents/inside), if the runner has one, and forwards it into the
// machine; it returns how to revoke the token. The token is derived like
// the gateway's, so a re-attached agent keeps the one its CLI holds.
func (ru *run) inside(ctx context.Context, gc *guest.Client) (revoke func(), err error) {
	cfg := ru.r.cfg
	if cfg.Inside == nil {
		return func() {}, nil
	}
	var deadline time.Time
	if wall := time.Duration(ru.limits.WallTime); wall > 0 {
		start := ru.exec.Started
		if start.IsZero() {
			start = time.Now()
		}
		deadline = start.Add(wall)
	}
	token := cfg.Inside.Register(inside.Execution{ID: ru.exec.ID, Session: ru.exec.Session,
		Token: ru.r.token("hearth", ru.exec.ID), Channel: ru.exec.ID, Deadline: deadline})
	gc.Serve("hearth", channel.Dial(cfg.InsideDial, ru.exec.ID))
	listen := "127.0.0.1:" + strconv.Itoa(cfg.InsidePort)
	if _, err := gc.Forward(ctx, listen, "hearth"); err != nil {
		cfg.Inside.Unregister(token)
		return nil, fmt.Errorf("forward the hearth MCP server into the machine: %w", err)
	}
	ru.insideToken = token
	return func() { cfg.Inside.Unregister(token) }, nil
}

// insideServer is the hearth MCP server as the CLI reaches it: on the
// machine's loopback, with the execution's token. ok is false without it.
func (ru *run) insideServer() (s MCPServer, ok bool) {
	if ru.r.cfg.Inside == nil || ru.insideToken == "" {
		return MCPServer{}, false
	}
	return MCPServer{Name: "hearth", URL: "http://127.0.0.1:" + strconv.Itoa(ru.r.cfg.InsidePort) + "/mcp",
		Headers: map[string]string{"Authorization": "Bearer " + ru.insideToken}}, true
}

// insideConfig writes Claude Code's MCP configuration of the hearth
// server into the session's private home and returns the arguments that
// give it to the CLI (none without the server). Other --mcp-config files
// may follow: the CLI merges them.
func (ru *run) insideConfig() ([]string, error) {
	cfg := ru.r.cfg
	s, ok := ru.insideServer()
	if !ok {
		return nil, nil
	}
	conf, err := MCPConfig([]MCPServer{s})
	if err != nil {
		return nil, err
	}
	ws, sess := cfg.Workspace, ru.exec.Session
	root := cfg.Driver.Capabilities().HostIDOffset // the machine's uid 0
	err = ws.MkdirAll(sess, hearthDir, root, root)
	if err == nil {
		err = ws.WriteFile(sess, insideConfigFile, bytes.NewReader(conf), root, root)
	}
	if err == nil {
		err = ws.Chmod(sess, insideConfigFile, 0o444)
	}
	if err != nil {
		return nil, fmt.Errorf("write the hearth MCP configuration: %w", err)
	}
	return []string{"--mcp-config", "/workspace/agents/" + ru.exec.Session + "/" + insideConfigFile}, nil
}
