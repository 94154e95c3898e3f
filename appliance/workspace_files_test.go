package appliance

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hearth/client"
)

// onePixelPNG is a 1x1 PNG.
var onePixelPNG, _ = base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")

// workspaceFilesEnv is a daemon with session s1 holding files written
// through the host view, as an agent's would be.
func workspaceFilesEnv(t *testing.T, files map[string]string) (*Daemon, *client.Client, string) {
	t.Helper()
	cfg := agentConfig(t)
	d, c := startSandboxDaemon(t, cfg)
	if err := c.CreateSession(context.Background(), "s1"); err != nil {
		t.Fatalf("CreateSession = %v", err)
	}
	dir := filepath.Join(cfg.Workspace.Mount, "s1")
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d, c, dir
}

func readAll(t *testing.T, c *client.Client, session, path string) (string, string) {
	t.Helper()
	body, ct, err := c.ReadWorkspaceFile(context.Background(), session, path)
	if err != nil {
		t.Fatalf("ReadWorkspaceFile(%q) = %v", path, err)
	}
	defer body.Close()
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), ct
}

// TestWorkspaceFiles lists a session's directories (its .home left out)
// and reads text and an image with the types told from their bytes.
func TestWorkspaceFiles(t *testing.T) {
	_, c, _ := workspaceFilesEnv(t, map[string]string{
		"outputs/report.md": "# Q2\n\ntotal 30 — ok\n", "outputs/chart.png": string(onePixelPNG),
		"outputs/data.bin": "\x00\x01\x02", ".home/secret": "private",
	})
	ctx := context.Background()
	top, err := c.WorkspaceDir(ctx, "s1", "")
	if err != nil {
		t.Fatalf("WorkspaceDir(s1, \"\") = %v", err)
	}
	var names []string
	for _, e := range top {
		names = append(names, e.Name+":"+string(e.Type))
	}
	if got, want := strings.Join(names, " "), "inputs:dir outputs:dir"; got != want {
		t.Errorf("WorkspaceDir(s1) = %s, want %s (.home hidden)", got, want)
	}
	outs, err := c.WorkspaceDir(ctx, "s1", "outputs")
	if err != nil || len(outs) != 3 || outs[2].Path != "outputs/report.md" || outs[2].Size != int64(len("# Q2\n\ntotal 30 — ok\n")) {
		t.Errorf("WorkspaceDir(s1, outputs) = %+v, %v", outs, err)
	}
	for _, tc := range []struct{ path, body, ct string }{
		{"outputs/report.md", "# Q2\n\ntotal 30 — ok\n", "text/plain; charset=utf-8"},
		{"outputs/chart.png", string(onePixelPNG), "image/png"},
		{"/outputs/data.bin", "\x00\x01\x02", "application/octet-stream"},
	} {
		if body, ct := readAll(t, c, "s1", tc.path); body != tc.body || ct != tc.ct {
			t.Errorf("ReadWorkspaceFile(%q) = %q, %q; want %q, %q", tc.path, body, ct, tc.body, tc.ct)
		}
	}
}

// TestHostileWorkspaceFiles: what an agent writes reaches a browser only
// as plain text or a raster image, never sniffed, sandboxed and as an
// attachment; no path or link reaches another session, the host or a
// .home.
func TestHostileWorkspaceFiles(t *testing.T) {
	d, c, dir := workspaceFilesEnv(t, map[string]string{
		"outputs/<img src=x onerror=alert(1)>.txt": "<script>alert(1)</script>",
		"outputs/page.html":                        "<!doctype html><html><body><script>alert(1)</script></body></html>",
		"outputs/logo.svg":                         `<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><script>alert(1)</script></svg>`,
		".home/secret":                             "private",
	})
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "outputs", "passwd")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"outputs/<img src=x onerror=alert(1)>.txt", "outputs/page.html", "outputs/logo.svg"} {
		resp, body := rawGet(t, d.cfg, "/v1/workspace/sessions/s1/files?path="+url.QueryEscape(p), nil)
		h := resp.Header
		if resp.StatusCode != http.StatusOK || h.Get("Content-Type") != "text/plain; charset=utf-8" || h.Get("X-Content-Type-Options") != "nosniff" ||
			!strings.HasPrefix(h.Get("Content-Security-Policy"), "sandbox;") || !strings.HasPrefix(h.Get("Content-Disposition"), "attachment;") {
			t.Errorf("GET %s = %d %v, want text/plain, nosniff, a sandbox policy and attachment", p, resp.StatusCode, h)
		}
		if !strings.Contains(body, "<script>") {
			t.Errorf("GET %s = %q, want the bytes as they are", p, body)
		}
	}
	list, err := c.WorkspaceDir(context.Background(), "s1", "outputs")
	if err != nil || len(list) != 4 || list[0].Name != "<img src=x onerror=alert(1)>.txt" || list[3].Type != "link" {
		t.Errorf("WorkspaceDir(outputs) = %+v, %v; want the names as they are and the link as a link", list, err)
	}
	runErrorCases(t, []errorCase{
		{"a link out", func() error {
			_, _, err := c.ReadWorkspaceFile(context.Background(), "s1", "outputs/passwd")
			return err
		}, "bad_request", 400, "not a regular file"},
		{"climbing out", func() error { _, _, err := c.ReadWorkspaceFile(context.Background(), "s1", "../s2/x"); return err }, "bad_request", 400, "inside the session"},
		{"the .home", func() error { _, _, err := c.ReadWorkspaceFile(context.Background(), "s1", ".home/secret"); return err }, "bad_request", 400, "private"},
		{"the .home listed", func() error { _, err := c.WorkspaceDir(context.Background(), "s1", "./.home"); return err }, "bad_request", 400, "private"},
		{"a bad session", func() error { _, err := c.WorkspaceDir(context.Background(), "a b", ""); return err }, "bad_name", 400, "session"},
		{"no session", func() error { _, err := c.WorkspaceDir(context.Background(), "s9", ""); return err }, "not_found", 404, "no session s9"},
		{"a directory read", func() error { _, _, err := c.ReadWorkspaceFile(context.Background(), "s1", "outputs"); return err }, "bad_request", 400, "not a regular file"},
	})
}

// FuzzPreviewType: whatever the bytes, a preview is only ever plain
// text, a raster image or opaque bytes, and text is valid UTF-8.
func FuzzPreviewType(f *testing.F) {
	for _, s := range []string{"", "hello\n", "<html><script>alert(1)</script>", "<svg onload=alert(1)>", string(onePixelPNG), "\xff\xfe<\x00h\x00", "GIF89a", "\x00"} {
		f.Add([]byte(s), true)
	}
	allowed := map[string]bool{"text/plain; charset=utf-8": true, "image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true, "application/octet-stream": true}
	f.Fuzz(func(t *testing.T, head []byte, whole bool) {
		ct := PreviewType(head, whole)
		if !allowed[ct] {
			t.Fatalf("PreviewType(%q) = %q", head, ct)
		}
		if ct == "text/plain; charset=utf-8" && (bytes.IndexByte(head, 0) >= 0 || whole && !isUTF8(head)) {
			t.Fatalf("PreviewType(%q) = text, but it is not UTF-8 text", head)
		}
	})
}

func isUTF8(b []byte) bool { return strings.ToValidUTF8(string(b), "\uFFFD") == string(b) }
