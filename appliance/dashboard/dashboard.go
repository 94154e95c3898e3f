package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

//go:embed static
var static embed.FS

// contentTypes are the types of the files the dashboard is made of; a
// file of any other kind is refused when the handler is built, so that a
// module is never served with a type the browser rejects.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// securityPolicy lets the page load and fetch only from its own origin:
// no inline script, no framing; images also from blob: URLs (an output
// file shown in the page) and data: URLs.
const securityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// asset is one embedded file, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the dashboard: Prefix itself is the page, Prefix+"FILE"
// its assets; any other path under Prefix is a 404. Mount it at Prefix.
func Handler() http.Handler {
	assets, err := load()
	if err != nil {
		panic("dashboard: " + err.Error()) // the embedded files are part of the build
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serve(w, r, assets) })
}

// load reads the embedded files and checks each has a known type.
func load() (map[string]asset, error) {
	assets := map[string]asset{}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("%s: no content type for %q files: add one to contentTypes", p, path.Ext(p))
		}
		body, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		assets[strings.TrimPrefix(p, "static/")] = asset{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	return assets, err
}

func serve(w http.ResponseWriter, r *http.Request, assets map[string]asset) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the dashboard is read with GET", http.StatusMethodNotAllowed)
		return
	}
	name := strings.TrimPrefix(r.URL.Path, Prefix)
	if name == "" {
		name = "index.html"
	}
	a, ok := assets[name] // keyed by clean paths: "views/../app.js" is none
	if !ok {
		http.Error(w, fmt.Sprintf("no dashboard file %s: the dashboard is at %s", r.URL.Path, Prefix), http.StatusNotFound)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("ETag", a.etag)
	h.Set("Cache-Control", "no-cache") // revalidate: a new binary has new files
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", securityPolicy)
	h.Set("Referrer-Policy", "no-referrer")
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.body))
}

// RedirectBrowsers sends a browser asking for the root page ("GET /"
// accepting text/html) to the dashboard, and every other request to
// next.
func RedirectBrowsers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead) && acceptsHTML(r) {
			http.Redirect(w, r, Prefix, http.StatusFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func acceptsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(mt, "text/html") {
				return true
			}
		}
	}
	return false
}
