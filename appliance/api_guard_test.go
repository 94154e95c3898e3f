package appliance

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestGuardTaskUploads: a task's multipart request (the CLI streams
// input files so) gets past guardBrowsers on the two task routes only,
// and never from a page of another origin.
func TestGuardTaskUploads(t *testing.T) {
	const form = "multipart/form-data; boundary=x"
	for _, c := range []struct {
		method, path, ctype, site, origin string
		want                              int // 0: reached the handler
	}{
		{"POST", "/v1/executions", form, "", "", 0},
		{"POST", "/v1/sessions/s1/resume", form, "", "", 0},
		{"POST", "/v1/executions", form, "same-origin", "http://h", 0},
		{"POST", "/v1/executions", form, "cross-site", "", http.StatusForbidden},
		{"POST", "/v1/executions", form, "same-site", "http://h:1", http.StatusForbidden},
		{"POST", "/v1/sessions/s1/resume", form, "", "http://evil.example", http.StatusForbidden},
		{"POST", "/v1/executions", "text/plain", "", "", http.StatusUnsupportedMediaType},
		{"POST", "/v1/executions", "application/x-www-form-urlencoded", "", "", http.StatusUnsupportedMediaType},
		{"PUT", "/v1/executions", form, "", "", http.StatusUnsupportedMediaType},
		{"POST", "/v1/sessions//resume", form, "", "", http.StatusUnsupportedMediaType},
		{"POST", "/v1/sessions/s1/resume/x", form, "", "", http.StatusUnsupportedMediaType},
		{"POST", "/v1/credits", form, "", "", http.StatusUnsupportedMediaType},
		{"POST", "/v1/sandboxes/x/exec", form, "", "", http.StatusUnsupportedMediaType},
		// A session archive's upload: the archive is the body.
		{"POST", "/v1/workspace/sessions/s1/archive", "application/octet-stream", "", "", 0},
		{"POST", "/v1/workspace/sessions/s1/archive", "application/octet-stream", "same-origin", "http://h", 0},
		{"POST", "/v1/workspace/sessions/s1/archive", "application/octet-stream", "cross-site", "", http.StatusForbidden},
		{"POST", "/v1/workspace/sessions/s1/archive", "text/plain", "", "http://evil.example", http.StatusForbidden},
		{"PUT", "/v1/workspace/sessions/s1/archive", "application/octet-stream", "", "", http.StatusUnsupportedMediaType},
		{"POST", "/v1/workspace/sessions//archive", "application/octet-stream", "", "", http.StatusUnsupportedMediaType},
		{"POST", "/v1/workspace/sessions/s1/archive/x", "application/octet-stream", "", "", http.StatusUnsupportedMediaType},
	} {
		r := httptest.NewRequest(c.method, "http://h"+c.path, nil)
		r.Header.Set("Content-Type", c.ctype)
		if c.site != "" {
			r.Header.Set("Sec-Fetch-Site", c.site)
		}
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		w := httptest.NewRecorder()
		reached := false
		guardBrowsers(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true })).ServeHTTP(w, r)
		got := w.Code
		if reached {
			got = 0
		}
		if got != c.want {
			t.Errorf("%s %s (%s, Sec-Fetch-Site %q, Origin %q) = %d, want %d (0: reached)", c.method, c.path, c.ctype, c.site, c.origin, got, c.want)
		}
	}
}
