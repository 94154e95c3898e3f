package appliance

import (
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzPreviewGate feeds the preview's door arbitrary requests (method,
// path, Cookie, Authorization, Sec-Fetch-Site, Sec-Fetch-Mode, Origin):
// nothing reaches the sandbox without the preview's cookie or the API
// token; nothing under /.hearth/ is proxied; what is proxied carries no
// preview cookie and not the token; a cookie-signed request that a page
// of another origin would make is never proxied.
func FuzzPreviewGate(f *testing.F) {
	const token, private, public = "the-api-token-0123456789", "PRIVATE-secret-value", "PUBLIC-secret-value"
	f.Add("GET", "/", "hearth_preview_1="+private, "", "", "", "")
	f.Add("GET", "/x", "hearth_preview_1="+public+"; app=1; hearth_preview_2=other", "", "same-site", "navigate", "")
	f.Add("POST", "/api", "hearth_preview_1="+private, "", "same-site", "cors", "http://127.0.0.1:2")
	f.Add("GET", "/ws", "hearth_preview_1="+private, "", "", "websocket", "http://127.0.0.1:9")
	f.Add("GET", "/", "", "Bearer "+token, "cross-site", "no-cors", "null")
	f.Add("GET", "/", "", "Bearer "+token+"x", "", "", "")
	f.Add("GET", "/.hearth/signin", "hearth_preview_1="+private, "", "", "", "")
	f.Add("GET", "/.hearth/public/"+public, "", "", "", "", "")
	f.Add("PUT", "/", `hearth_preview_1="`+private+`"`, "Bearer "+token, "same-origin", "cors", "http://127.0.0.1:1")
	f.Fuzz(func(t *testing.T, method, path, cookie, auth, site, mode, origin string) {
		var seen *http.Request
		pv := &preview{
			p:       &previews{credential: func(v string) bool { return v == token }},
			sandbox: "s", port: 80, cookie: "hearth_preview_1",
			private: private, public: public, tickets: map[[sha256.Size]byte]time.Time{},
			next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = r }),
		}
		req := &http.Request{Method: method, URL: &url.URL{Path: path}, Header: http.Header{}, Host: "127.0.0.1:1"}
		for k, v := range map[string]string{"Cookie": cookie, "Authorization": auth, "Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Origin": origin} {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		signed := false
		for _, c := range (&http.Request{Header: http.Header{"Cookie": {cookie}}}).Cookies() {
			if c.Name == pv.cookie && (c.Value == private || c.Value == public) {
				signed = true
			}
		}
		byToken := auth == "Bearer "+token
		foreign := foreignRequest(req)
		pv.ServeHTTP(httptest.NewRecorder(), req)
		if seen == nil {
			return
		}
		if !signed && !byToken {
			t.Fatalf("proxied with neither the cookie nor the token: %v", req.Header)
		}
		if strings.HasPrefix(path, previewPaths) {
			t.Fatalf("proxied a path of the daemon's own: %q", path)
		}
		if signed && !byToken && foreign {
			t.Fatalf("proxied a foreign request on the cookie alone: %v", req.Header)
		}
		for _, c := range seen.Cookies() {
			if strings.HasPrefix(c.Name, previewCookiePrefix) {
				t.Fatalf("the sandbox got the preview cookie %s: %q", c.Name, seen.Header.Get("Cookie"))
			}
		}
		if byToken && seen.Header.Get("Authorization") != "" {
			t.Fatalf("the sandbox got the API token")
		}
	})
}
