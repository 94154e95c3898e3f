package main

import (
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"hearth/client"
)

// TestSandboxPortCommands: expose prints the preview URL and a sign-in
// link (and a public link when asked), ports lists them, unexpose
// revokes the public link or closes the port; a bad port is a usage
// error, and a daemon without api.tcp says what to set.
func TestSandboxPortCommands(t *testing.T) {
	c, _ := sandboxDaemon(t, "[api]\ntcp = \"127.0.0.1:0\"\n")
	runSteps(t, []step{
		{args: []string{"sandboxes", "create", "--idle-timeout", "0", "web", c}, wantOut: "web\n", exactOut: true},
		{args: []string{"sandboxes", "ports", "web", c}, wantOut: "no exposed ports in sandbox web"},
		{args: []string{"sandboxes", "expose", "web", "0", c}, wantCode: exitUsage, wantErr: "1 to 65535"},
		{args: []string{"sandboxes", "expose", "web", "http", c}, wantCode: exitUsage, wantErr: "1 to 65535"},
		{args: []string{"sandboxes", "expose", "nope", "80", c}, wantCode: exitNotFound, wantErr: "no sandbox nope"},
		{args: []string{"sandboxes", "expose", "web", "8080", c}, wantOut: "http://127.0.0.1:", wantErr: "/.hearth/signin?ticket="},
		{args: []string{"sandboxes", "expose", "web", "8080", "--public", c}, wantErr: "public link"},
	})
	out, _, code := hearthIn(t, "", "sandboxes", "ports", "web", "--json", c)
	var ports []client.ExposedPort
	if code != 0 || json.Unmarshal([]byte(out), &ports) != nil || len(ports) != 1 || ports[0].Port != 8080 || ports[0].PublicUrl == "" {
		t.Fatalf("ports --json = %d %q, want port 8080 with a public link", code, out)
	}
	// The public link opens the preview, whose server is missing: 502.
	jar, _ := cookiejar.New(nil) // the link sets the preview's cookie, then sends there
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	resp, err := hc.Get(ports[0].PublicUrl)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("the public link, nothing listening: %d, want 502", resp.StatusCode)
	}
	runSteps(t, []step{
		{args: []string{"sandboxes", "ports", "web", c}, wantOut: "/.hearth/public/"},
		{args: []string{"sandboxes", "unexpose", "web", "8080", "--public", c}, wantErr: "revoked the public link"},
		{args: []string{"sandboxes", "ports", "web", c}, wantOut: "8080"},
		{args: []string{"sandboxes", "unexpose", "web", "8080", c}, wantErr: "closed sandbox web port 8080"},
		{args: []string{"sandboxes", "unexpose", "web", "8080", c}, wantCode: exitNotFound, wantErr: "no exposed port 8080"},
	})
	if out, _, _ := hearthIn(t, "", "sandboxes", "ports", "web", c); !strings.Contains(out, "no exposed ports") {
		t.Errorf("ports after closing: %q", out)
	}

	// code-server is not in the tiny image: said so, with what to do.
	runSteps(t, []step{
		{args: []string{"sandboxes", "code", "web", "--port", "0", c}, wantCode: exitUsage, wantErr: "1 to 65535"},
		{args: []string{"sandboxes", "code", "web", c}, wantCode: exitError, wantErr: "sandbox web has no code-server (image tiny)"},
		{args: []string{"sandboxes", "code", "nope", c}, wantCode: exitNotFound, wantErr: "no sandbox nope"},
	})

	noTCP, _ := sandboxDaemon(t)
	runSteps(t, []step{
		{args: []string{"sandboxes", "create", "--idle-timeout", "0", "web", noTCP}, wantOut: "web\n", exactOut: true},
		{args: []string{"sandboxes", "expose", "web", "8080", noTCP}, wantCode: exitError, wantErr: "set api.tcp"},
	})
}
