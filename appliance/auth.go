package appliance

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

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

// sessionCookie carries a browser's session id (never the API token):
// the dashboard cannot add an Authorization header to an EventSource.
// Browsers send a host's cookies to every port of it, so the cookie alone
// must not be enough for a page of another origin: see guardBrowsers and
// crossSiteRead.
const sessionCookie = "hearth_session"

// logoutPath ends the browser session of the request (POST).
const logoutPath = "/ui/logout"

// Browser sessions end after sessionIdle without a request, and
// sessionMax after sign-in whatever the use; at most maxSessions are kept
// (the least recently used go first).
const (
	sessionIdle = 12 * time.Hour
	sessionMax  = 7 * 24 * time.Hour
	maxSessions = 256
)

// sessions are the browser sessions signed in with the API token. They
// live in memory only: a daemon restart signs every browser out, and so
// does a new token (it needs a restart to be read).
type sessions struct {
	mu  sync.Mutex
	m   map[[sha256.Size]byte]*browserSession // by the id's hash: a lookup does not time the id
	now func() time.Time
}

type browserSession struct{ created, seen time.Time }

func newSessions() *sessions {
	return &sessions{m: map[[sha256.Size]byte]*browserSession{}, now: time.Now}
}

// create starts a session and returns its id, 256 random bits.
func (s *sessions) create() string {
	raw := make([]byte, 32)
	rand.Read(raw)
	id := base64.RawURLEncoding.EncodeToString(raw)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.expire(now)
	for len(s.m) >= maxSessions {
		s.dropLeastRecent()
	}
	s.m[sha256.Sum256([]byte(id))] = &browserSession{created: now, seen: now}
	return id
}

// valid says whether id is a live session, and marks it used.
func (s *sessions) valid(id string) bool {
	if id == "" {
		return false
	}
	key := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	bs, ok := s.m[key]
	if !ok {
		return false
	}
	now := s.now()
	if bs.expired(now) {
		delete(s.m, key)
		return false
	}
	bs.seen = now
	return true
}

// revoke ends the session id, if it is one.
func (s *sessions) revoke(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, sha256.Sum256([]byte(id)))
}

// revokeAll ends every session.
func (s *sessions) revokeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.m)
}

func (bs *browserSession) expired(now time.Time) bool {
	return now.Sub(bs.seen) >= sessionIdle || now.Sub(bs.created) >= sessionMax
}

// expire drops the expired sessions; s.mu is held.
func (s *sessions) expire(now time.Time) {
	for k, bs := range s.m {
		if bs.expired(now) {
			delete(s.m, k)
		}
	}
}

// dropLeastRecent drops the session used longest ago; s.mu is held.
func (s *sessions) dropLeastRecent() {
	var oldest [sha256.Size]byte
	var seen time.Time
	for k, bs := range s.m {
		if seen.IsZero() || bs.seen.Before(seen) {
			oldest, seen = k, bs.seen
		}
	}
	delete(s.m, oldest)
}

// requireToken lets through requests that carry token as a bearer token,
// or a live session's cookie. A browser opening a page with ?token= gets
// a new session's cookie and is sent to the same page without the token
// in its address. POST logoutPath ends the request's session.
func requireToken(token string, ss *sessions, h http.Handler) http.Handler {
	ok := func(got string) bool {
		return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == logoutPath {
			logout(w, r, ss)
			return
		}
		if bearer, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found && ok(bearer) {
			h.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(sessionCookie); err == nil && ss.valid(c.Value) {
			if crossSiteRead(r) {
				fail(w, &APIError{Status: http.StatusForbidden, Code: codeCrossOrigin,
					Message: "a page of another origin cannot use the dashboard's session: open the dashboard itself"})
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		q := r.URL.Query()
		if r.Method == http.MethodGet && ok(q.Get("token")) {
			http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: ss.create(), Path: "/", MaxAge: int(sessionMax / time.Second),
				HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q.Del("token")
			u := *r.URL
			u.RawQuery = q.Encode()
			w.Header().Set("Referrer-Policy", "no-referrer")
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="hearth"`)
		fail(w, &APIError{Status: http.StatusUnauthorized, Code: "unauthorized",
			Message: "this address needs the API token: send 'Authorization: Bearer <token>' (the token is in the daemon's api.token_file, by default <state_dir>/api.token), or open the dashboard once with ?token=<token>"})
	})
}

// crossSiteRead says whether a browser sent r for a page of another
// origin (Sec-Fetch-Site same-site or cross-site: another port of the
// host is same-site) other than by the user following a link to a page.
// Such a page cannot read the answer, but it could still time it or
// start a stream; the session is not for it.
func crossSiteRead(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-site", "cross-site":
		return !(r.Method == http.MethodGet && r.Header.Get("Sec-Fetch-Mode") == "navigate")
	}
	return false
}

// logout ends the session of the request's cookie and clears the cookie.
// Only POST, so that a link cannot sign the browser out; guardBrowsers
// has already refused it from another origin.
func logout(w http.ResponseWriter, r *http.Request, ss *sessions) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(w, &APIError{Status: http.StatusMethodNotAllowed, Code: codeBadRequest, Message: "sign out with POST " + logoutPath})
		return
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		ss.revoke(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}
