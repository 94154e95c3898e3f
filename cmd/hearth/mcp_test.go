package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMCPCommand runs hearth mcp in-process with no daemon: it answers
// the handshake and a tool call (with an error that says to start the
// daemon) and ends with status 0 when the client closes its stdin. The
// real binary against a real daemon is tested in appliance/mcp.
func TestMCPCommand(t *testing.T) {
	config := filepath.Join(t.TempDir(), "hearth.toml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("state_dir = %q\n", filepath.Dir(config))), 0o644); err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var errOut bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"mcp", "--config", config}, inR, outW, &errOut)
		outW.Close()
	}()
	lines := bufio.NewScanner(outR)
	ask := func(msg string) string {
		t.Helper()
		fmt.Fprintln(inW, msg)
		if !strings.Contains(msg, `"id"`) {
			return ""
		}
		if !lines.Scan() {
			t.Fatalf("no answer to %s", msg)
		}
		return lines.Text()
	}
	for _, tc := range []struct{ msg, want string }{
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
			`"serverInfo":{"name":"hearth"`},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, ""},
		{`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sessions","arguments":{}}}`,
			`"text":"the hearth daemon is not running`},
	} {
		if got := ask(tc.msg); !strings.Contains(got, tc.want) {
			t.Errorf("answer to %s = %s, want %s", tc.msg, got, tc.want)
		}
	}
	inW.Close()
	if c := <-code; c != exitOK {
		t.Errorf("hearth mcp = %d after stdin closed, stderr %q; want 0", c, errOut.String())
	}
	if !strings.Contains(errOut.String(), "serving anyway") {
		t.Errorf("stderr %q, want it to say the daemon is down", errOut.String())
	}
	if _, errOut, code := hearthIn(t, "", "mcp", "extra"); code != exitUsage || !strings.Contains(errOut, "usage: hearth mcp") {
		t.Errorf("hearth mcp extra = %d, %q; want a usage error", code, errOut)
	}
}
