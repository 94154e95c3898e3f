package dashboard

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, target string, header http.Header) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

// embedded lists the dashboard's files, relative to Prefix.
func embedded(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		files[strings.TrimPrefix(p, "static/")] = string(b)
		return err
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded files: %v, %d found", err, len(files))
	}
	return files
}

// TestAssets: the page and every asset are served with the type the
// browser needs (a module served as anything but JavaScript is refused),
// the page's security policy and an ETag that makes a reload cheap.
func TestAssets(t *testing.T) {
	h := Handler()
	want := map[string]string{".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
		".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
	for name, body := range embedded(t) {
		t.Run(name, func(t *testing.T) {
			resp := get(t, h, "GET", Prefix+name, nil)
			got, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(got) != body {
				t.Fatalf("GET %s = %d, %d bytes; want 200 and the embedded %d bytes", Prefix+name, resp.StatusCode, len(got), len(body))
			}
			if ct := resp.Header.Get("Content-Type"); ct != want[path.Ext(name)] {
				t.Errorf("GET %s: Content-Type %q, want %q", name, ct, want[path.Ext(name)])
			}
			if resp.Header.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
				t.Errorf("GET %s: headers %v, want nosniff and the security policy", name, resp.Header)
			}
			etag := resp.Header.Get("ETag")
			again := get(t, h, "GET", Prefix+name, http.Header{"If-None-Match": {etag}})
			if etag == "" || again.StatusCode != http.StatusNotModified {
				t.Errorf("GET %s with If-None-Match %q = %d, want 304", name, etag, again.StatusCode)
			}
		})
	}
	resp := get(t, h, "GET", Prefix, nil)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" || !strings.Contains(string(body), `<script type="module" src="app.js">`) {
		t.Errorf("GET %s = %d %q, want the page", Prefix, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// TestNotServed: paths that name no file, and methods other than GET,
// are refused saying where the dashboard is.
func TestNotServed(t *testing.T) {
	h := Handler()
	for _, tc := range []struct {
		method, target string
		status         int
		msg            string
	}{
		{"GET", Prefix + "nope.js", 404, "no dashboard file /ui/nope.js: the dashboard is at /ui/"},
		{"GET", Prefix + "views/../app.js", 404, "no dashboard file"},
		{"GET", Prefix + "static/app.js", 404, "no dashboard file"},
		{"POST", Prefix, 405, "GET"},
		{"DELETE", Prefix + "app.js", 405, "GET"},
	} {
		resp := get(t, h, tc.method, tc.target, nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.msg) {
			t.Errorf("%s %s = %d %q, want %d saying %q", tc.method, tc.target, resp.StatusCode, body, tc.status, tc.msg)
		}
	}
}

// TestNothingExternal: no asset names a URL of another host (the
// appliance may be offline, and the page's policy would refuse it
// anyway), and every file a page or module refers to is embedded.
func TestNothingExternal(t *testing.T) {
	files := embedded(t)
	// The SVG namespace is a name in XML and createElementNS, never fetched.
	namespaces := strings.NewReplacer("http://www.w3.org/2000/svg", "")
	external := regexp.MustCompile(`(?i)(https?:|wss?:|ftp:)//|\b(src|href|action)\s*=\s*["']?//|url\(\s*["']?(https?:)?//|@import`)
	for name, body := range files {
		if m := external.FindString(namespaces.Replace(body)); m != "" {
			t.Errorf("%s refers to another host (%q): the dashboard must work offline; embed what it needs", name, m)
		}
	}
	refs := regexp.MustCompile(`(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)['"]([^'"]+)['"]|\b(?:src|href)="([^"#][^"]*)"`)
	for name, body := range files {
		for _, m := range refs.FindAllStringSubmatch(body, -1) {
			ref := m[1] + m[2]
			target := path.Join(path.Dir(name), ref)
			if _, ok := files[target]; !ok {
				t.Errorf("%s refers to %q (%s), which is not embedded", name, ref, target)
			}
		}
	}
	if !strings.Contains(files["index.html"], `src="app.js"`) || !strings.Contains(files["app.js"], `from './views/execution.js'`) {
		t.Fatal("the reference check found nothing to check: fix its patterns")
	}
}

// TestRedirectBrowsers: a browser opening the root gets the dashboard;
// API clients and other paths get what next answers.
func TestRedirectBrowsers(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "next", http.StatusTeapot) })
	h := RedirectBrowsers(next)
	html := http.Header{"Accept": {"text/html,application/xhtml+xml,*/*;q=0.8"}}
	for _, tc := range []struct {
		method, target string
		header         http.Header
		status         int
	}{
		{"GET", "/", html, http.StatusFound},
		{"HEAD", "/", html, http.StatusFound},
		{"GET", "/", http.Header{"Accept": {"application/json"}}, http.StatusTeapot},
		{"GET", "/", nil, http.StatusTeapot},
		{"POST", "/", html, http.StatusTeapot},
		{"GET", "/v2/nothing", html, http.StatusTeapot},
	} {
		resp := get(t, h, tc.method, tc.target, tc.header)
		if resp.StatusCode != tc.status || (tc.status == http.StatusFound && resp.Header.Get("Location") != Prefix) {
			t.Errorf("%s %s (Accept %q) = %d to %q, want %d", tc.method, tc.target, tc.header.Get("Accept"), resp.StatusCode, resp.Header.Get("Location"), tc.status)
		}
	}
}

// TestEveryEventType: the execution page listens for every event type
// the stream has (EventSource delivers a named event only to a listener
// of that name, so a type missing from its list would never show).
func TestEveryEventType(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../agents/stream/event.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Type" {
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok {
						s, _ := strconv.Unquote(lit.Value)
						types = append(types, s)
					}
				}
			}
		}
		return true
	})
	page := embedded(t)["views/execution.js"]
	list := regexp.MustCompile(`const eventTypes = \[([^\]]*)\]`).FindStringSubmatch(page)
	if len(types) < 8 || list == nil {
		t.Fatalf("found %d stream types and list %q: fix the test's parsing", len(types), list)
	}
	for _, typ := range types {
		if !strings.Contains(list[1], "'"+typ+"'") {
			t.Errorf("views/execution.js does not listen for %q events (agents/stream has them): add it to eventTypes, and a row for it to views/events.js", typ)
		}
	}
}
