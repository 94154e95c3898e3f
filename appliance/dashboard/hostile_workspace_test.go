package dashboard_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hearth/client"
)

// TestHostileWorkspacePreview: files an agent wrote to attack the
// operator's browser (a name that is markup, HTML and SVG with script, an
// SVG named .png) are listed and previewed as text: no element is made
// from their contents and nothing of theirs runs. The page's policy
// would block inline handlers anyway, so the test looks for the elements
// themselves, which an innerHTML would have made.
func TestHostileWorkspacePreview(t *testing.T) {
	ctx := browser(t)
	cfg := daemonConfig(t)
	d := startDaemon(t, cfg)
	c := client.New(cfg.SocketPath())
	if err := c.CreateSession(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	evil := map[string]string{
		"<img src=x onerror=window.__pwned=1>.txt": `<img src=x onerror="window.__pwned=2">`,
		"page.html": `<!doctype html><script>window.__pwned=3</script><img src=x onerror="window.__pwned=4">`,
		"logo.svg":  `<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned=5"><script>window.__pwned=6</script></svg>`,
		"chart.png": `<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned=7"><script>window.__pwned=8</script></svg>`,
	}
	for name, body := range evil {
		if err := os.WriteFile(filepath.Join(cfg.Workspace.Mount, "s1", "outputs", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := signIn(t, ctx, d)
	do(t, ctx, 10*time.Second, "open the outputs", chromedp.Navigate(base+"/ui/#/workspace/s1/outputs"))
	waitFor(t, ctx, 10*time.Second, "the files listed by name", `document.querySelectorAll('#ws-files tr[data-path]').length === 4 && `+
		`document.querySelector('#ws-files tr[data-path="outputs/<img src=x onerror=window.__pwned=1>.txt"]')?.innerText.includes('<img src=x')`)
	made := `document.querySelectorAll('#view script, #view svg, #view iframe, #view object, #view embed, #view img:not([data-type])').length`
	for name, body := range evil {
		preview(t, ctx, "outputs/"+name, `document.querySelector('#ws-viewer pre[data-type="text"]')?.textContent === `+js(body))
		if n := eval[int](t, ctx, made); n != 0 {
			t.Errorf("previewing %q made %d elements from its contents", name, n)
		}
	}
	if pwned := eval[bool](t, ctx, `window.__pwned !== undefined`); pwned {
		t.Errorf("an agent's file ran script in the dashboard: __pwned = %v", eval[any](t, ctx, `window.__pwned`))
	}
	screenshot(t, ctx, "dashboard-workspace-hostile.png")
}
