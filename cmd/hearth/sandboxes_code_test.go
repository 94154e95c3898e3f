package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"hearth/appliance"
	"hearth/appliance/appliancetest"
	"hearth/client"
)

// TestSandboxCodeInBrowser: `hearth sandboxes code` on a sandbox of the
// code-server image with a workspace session starts code-server, exposes
// it and prints a sign-in link; headless Chromium opens the link, the VS
// Code workbench loads through the preview, its explorer lists the
// session's folder, and the session's file, opened through the
// workbench's payload parameter, shows its unique line in the editor; a
// line typed in it and saved reaches the file in the sandbox and in the
// session's workspace view on the host.
func TestSandboxCodeInBrowser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root (namespaces, mounts, cgroups, FUSE)")
	}
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium not installed: apt-get install chromium")
	}
	dir := t.TempDir()
	cfg := appliance.DefaultConfig()
	cfg.StateDir, cfg.Workspace.Mount = filepath.Join(dir, "state"), filepath.Join(dir, "agents")
	cfg.Sandbox.Agent = appliancetest.Agent(t)
	appliancetest.LinkImages(t, cfg.StateDir, appliancetest.Images(t, "code-server"))
	config := filepath.Join(dir, "hearth.toml")
	body := fmt.Sprintf("state_dir = %q\n[workspace]\nmount = %q\n[sandbox]\nagent = %q\ntier = \"jail\"\ndefault_image = \"code-server\"\nmemory = \"2G\"\n[api]\ntcp = \"127.0.0.1:0\"\n",
		cfg.StateDir, cfg.Workspace.Mount, cfg.Sandbox.Agent)
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err = appliance.LoadConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	d, err := appliance.Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		c := client.New(cfg.SocketPath())
		list, _ := c.Sandboxes(context.Background())
		for _, s := range list {
			c.DestroySandbox(context.Background(), s.Id)
		}
		d.Close()
	})
	c := "--config=" + config

	var nonce [8]byte
	rand.Read(nonce[:])
	line := "hearth-code-" + hex.EncodeToString(nonce[:])
	folder := "/workspace/agents/s1"
	file := folder + "/notes/hello.md"
	runSteps(t, []step{
		{args: []string{"sandboxes", "create", "--session", "s1", "--idle-timeout", "0", "ed", c}, wantOut: "ed\n", exactOut: true},
		{args: []string{"sandboxes", "exec", "ed", c, "--", "sh", "-c", "mkdir -p " + folder + "/notes && printf '# Notes\\n\\n%s\\n' " + line + " > " + file}},
	})
	start := time.Now()
	out, errOut, code := hearthIn(t, "", "sandboxes", "code", "ed", c)
	if code != 0 || !strings.HasPrefix(out, "http://127.0.0.1:") || !strings.Contains(errOut, "started code-server") {
		t.Fatalf("hearth sandboxes code = %d, stdout %q, stderr %q", code, out, errOut)
	}
	previewURL := strings.TrimSpace(out)
	var signIn string
	for _, f := range strings.Fields(errOut) {
		if strings.HasPrefix(f, previewURL+".hearth/signin?ticket=") {
			signIn = f
		}
	}
	if signIn == "" {
		t.Fatalf("no sign-in link for %s in %q", previewURL, errOut)
	}
	// Again: the running code-server is found, not started twice.
	if out2, errOut2, code := hearthIn(t, "", "sandboxes", "code", "ed", c); code != 0 || strings.TrimSpace(out2) != previewURL || strings.Contains(errOut2, "started code-server") {
		t.Errorf("hearth sandboxes code again = %d, stdout %q, stderr %q; want the same URL and no second start", code, out2, errOut2)
	}

	// code-server takes a few seconds to listen; the sign-in link lasts
	// two minutes, so wait for the server before opening it.
	hc := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		req, _ := http.NewRequest("GET", previewURL+"healthz", nil)
		req.Header.Set("Authorization", "Bearer "+d.Token())
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			logs, jerr, _ := hearthIn(t, "", "sandboxes", "job", "logs", "ed", "job-1", "--stderr", c)
			t.Fatalf("code-server never answered /healthz through %s: %v %v\nits log: %s %s", previewURL, resp, err, logs, jerr)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("code-server answered through the preview %s after the command", time.Since(start).Round(time.Millisecond))

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancel := chromedp.NewContext(actx)
	defer cancelAlloc()
	defer cancel()
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	wait := func(what, expr string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(browser, 2*time.Minute)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(2*time.Minute-5*time.Second))); err != nil {
			html, _ := chromedp.Run(browser, chromedp.Evaluate[string](`document.documentElement.outerHTML.slice(0, 3000)`))
			t.Fatalf("waiting for %s (%s): %v\nthe page:\n%s", what, expr, err, html)
		}
	}
	navigate := func(u string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(browser, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
			t.Fatalf("navigate to %s: %v", u, err)
		}
	}

	// The sign-in link sets the preview's cookie and sends the browser to
	// the root, which code-server sends on to the folder it was given.
	loaded := time.Now()
	navigate(signIn)
	wait("the workbench", `document.querySelector('.monaco-workbench') !== null`)
	href, err := chromedp.Run(browser, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if u, err := url.Parse(href); err != nil || !strings.HasPrefix(href, previewURL) || u.Query().Get("folder") != folder {
		t.Errorf("after signing in the browser is at %s, want %s?folder=%s", href, previewURL, folder)
	}
	// The explorer shows the session's tree (it has inputs/, outputs/ and
	// the notes/ written above).
	wait("the session's notes folder in the explorer", `[...document.querySelectorAll('.explorer-folders-view .monaco-list-row')].some(r => r.getAttribute('aria-label') === 'notes' || r.textContent.trim() === 'notes')`)
	t.Logf("workbench and explorer loaded in %s", time.Since(loaded).Round(time.Millisecond))

	// Open the file: the workbench's payload parameter names it as a
	// vscode-remote URI whose authority is the host the browser sees.
	host := strings.TrimSuffix(strings.TrimPrefix(previewURL, "http://"), "/")
	payload := fmt.Sprintf(`[["openFile","vscode-remote://%s%s"]]`, host, file)
	navigate(previewURL + "?folder=" + url.QueryEscape(folder) + "&payload=" + url.QueryEscape(payload))
	opened := time.Now()
	wait("the file's unique line in the editor", `[...document.querySelectorAll('.monaco-editor .view-lines')].some(v => v.textContent.includes('`+line+`'))`)
	wait("the file's tab", `[...document.querySelectorAll('.tabs-container .tab')].some(t => t.textContent.includes('hello.md'))`)
	t.Logf("hello.md shown in the editor %s after opening", time.Since(opened).Round(time.Millisecond))

	// Edit it: a line typed at its end and saved reaches the sandbox's
	// file and the session's workspace view on the host. (The web
	// workbench also saves by itself after a second, files.autoSave's
	// default in a browser; Ctrl+S saves at once.)
	edit := "edited-" + hex.EncodeToString(nonce[:])
	ctx, cancelEdit := context.WithTimeout(browser, 30*time.Second)
	defer cancelEdit()
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`.monaco-editor .view-lines`)),
		chromedp.KeyEvent(kb.End, chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.KeyEvent(edit),
		chromedp.KeyEvent("s", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
	); err != nil {
		t.Fatalf("type into the editor: %v", err)
	}
	wait("the typed line in the editor", `[...document.querySelectorAll('.monaco-editor .view-lines')].some(v => v.textContent.includes('`+edit+`'))`)
	want := "# Notes\n\n" + line + "\n" + edit
	hostFile := filepath.Join(cfg.Workspace.Mount, "s1", "notes", "hello.md")
	for saved := time.Now(); ; {
		got, _, _ := hearthIn(t, "", "sandboxes", "exec", "ed", c, "--", "cat", file)
		onHost, _ := os.ReadFile(hostFile)
		if strings.TrimSpace(got) == want && strings.TrimSpace(string(onHost)) == want {
			break
		}
		if time.Since(saved) > 30*time.Second {
			t.Fatalf("after saving, the sandbox's %s is %q and the host's %s is %q; want %q", file, got, hostFile, onHost, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
