package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	flag "github.com/spf13/pflag"

	"hearth/appliance/mcp"
	"hearth/client"
)

// cmdMCP serves Hearth's MCP server over stdin and stdout until the
// client closes stdin or a signal stops it. It reaches the daemon through
// the API like every other command; a daemon that is not running is said
// on stderr, and each tool call fails until it answers.
func mcpCmd() *command {
	return &command{name: "mcp", setup: cmdMCP,
		summary: "serve MCP on stdin/stdout (delegate tasks to agents,\nread their outputs); the daemon also serves it at /mcp",
		example: "claude mcp add hearth -- hearth mcp --config /etc/hearth/hearth.toml"}
}

func cmdMCP(*flag.FlagSet) action { return serveMCP }

func serveMCP(inv *env) error {
	stdin, stdout, stderr := inv.stdin, inv.stdout, inv.stderr
	c, err := inv.client()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := c.Agents(ctx); errors.Is(err, client.ErrDaemonDown) {
		fmt.Fprintf(stderr, "hearth mcp: %v; serving anyway, tools fail until it answers\n", err)
	}
	t := &mcpsdk.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}
	err = mcp.New(c).Run(ctx, t)
	if err == nil || ctx.Err() != nil || errors.Is(err, io.EOF) || errors.Is(err, mcpsdk.ErrConnectionClosed) {
		return nil // stopped, or the client went away: both are how it ends
	}
	return fmt.Errorf("mcp over stdio: %w", err)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
