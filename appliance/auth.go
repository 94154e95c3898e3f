package appliance

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// tokenCookie carries the API token for browsers (the dashboard), which
// cannot add an Authorization header to an EventSource.
const tokenCookie = "hearth_token"

// loadToken reads the API token from path, making a new random one (and
// the file, mode 0600) the first time.
func loadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		t := strings.TrimSpace(string(b))
		if len(t) < 16 {
			return "", fmt.Errorf("api.token_file %s: the token is shorter than 16 characters: put a longer one there, or delete the file to have one made", path)
		}
		return t, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("api.token_file: %w", err)
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	t := hex.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("api.token_file: %w", err)
	}
	_, err = f.WriteString(t + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("api.token_file: %w", err)
	}
	return t, nil
}

// loadSecret reads the runner's secret from path, making a random one
// (mode 0600) the first time. It derives the tokens agents hold, so it
// must survive restarts.
func loadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the runner's secret: %w", err)
	}
	b = make([]byte, 32)
	rand.Read(b)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("the runner's secret: %w", err)
	}
	return b, nil
}

// requireToken lets through requests that carry token as a bearer token
// or in the cookie. A browser opening a page with ?token= gets the cookie
// and is sent to the same page without the token in its address.
func requireToken(token string, h http.Handler) http.Handler {
	ok := func(got string) bool {
		return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bearer, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found && ok(bearer) {
			h.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(tokenCookie); err == nil && ok(c.Value) {
			h.ServeHTTP(w, r)
			return
		}
		q := r.URL.Query()
		if r.Method == http.MethodGet && ok(q.Get("token")) {
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q.Del("token")
			u := *r.URL
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="hearth"`)
		fail(w, &APIError{Status: http.StatusUnauthorized, Code: "unauthorized",
			Message: "this address needs the API token: send 'Authorization: Bearer <token>' (the token is in the daemon's api.token_file, by default <state_dir>/api.token), or open the dashboard once with ?token=<token>"})
	})
}
