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

	"hearth/appliance/dashboard"
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

// The dashboard signs in by exchanging the API token for a browser
// session (POST sessionPath, JSON {"token"}), keeps the session id in
// its origin's localStorage and sends it as a bearer token. Not in a
// cookie: browsers send a host's cookies to every port of it, so a page
// served on any other port of 127.0.0.1 would be sent the cookie
// (TestHostileCrossOriginBrowser); localStorage is per origin, port
// included. EventSource cannot send a header, so an event stream also
// takes the id as ?session=.
const (
	sessionPath = "/ui/session" // POST {"token"}: a new session
	logoutPath  = "/ui/logout"  // POST, with the session as bearer: end it
)

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

// requireToken lets through requests that carry token, or a live browser
// session's id, as a bearer token; and the dashboard's page and files,
// which hold no secret (the page signs in with POST sessionPath). It
// answers sessionPath and logoutPath itself.
func requireToken(token string, ss *sessions, h http.Handler) http.Handler {
	isToken := func(got string) bool {
		return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case sessionPath:
			signIn(w, r, ss, isToken)
			return
		case logoutPath:
			logout(w, r, ss)
			return
		}
		bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if isToken(bearer) || ss.valid(bearer) || isEventStream(r) && ss.valid(r.URL.Query().Get("session")) || public(r) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="hearth"`)
		fail(w, &APIError{Status: http.StatusUnauthorized, Code: "unauthorized",
			Message: "this address needs the API token: send 'Authorization: Bearer <token>' (the token is in the daemon's api.token_file, by default <state_dir>/api.token), or open the dashboard once with /ui/?token=<token>"})
	})
}

// public says whether r reads the dashboard (its page, files and the
// root's redirect to it) or the API's document (/openapi.yaml, .json),
// which anyone who can connect may: none of them holds a secret.
func public(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	return r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, dashboard.Prefix) ||
		r.URL.Path == "/openapi.yaml" || r.URL.Path == "/openapi.json"
}

// isEventStream says whether r asks for an execution's live events.
func isEventStream(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/executions/") && strings.HasSuffix(r.URL.Path, "/events") &&
		strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// signIn exchanges the API token for a new browser session: POST
// {"token":"..."} answers {"session":"...","idle_seconds":N,"max_seconds":N}.
// guardBrowsers has already refused it from another origin or without
// a JSON body.
func signIn(w http.ResponseWriter, r *http.Request, ss *sessions, isToken func(string) bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(w, &APIError{Status: http.StatusMethodNotAllowed, Code: codeBadRequest, Message: `sign in with POST ` + sessionPath + ` {"token":"<the API token>"}`})
		return
	}
	var req struct {
		Token string `json:"token"`
	}
	if !decode(w, r, 4<<10, &req) {
		return
	}
	if !isToken(req.Token) {
		fail(w, &APIError{Status: http.StatusUnauthorized, Code: "unauthorized",
			Message: "that is not the API token: it is in the daemon's api.token_file, by default <state_dir>/api.token"})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	reply(w, http.StatusCreated, map[string]any{"session": ss.create(),
		"idle_seconds": int(sessionIdle / time.Second), "max_seconds": int(sessionMax / time.Second)})
}

// logout ends the session the request carries as bearer token.
func logout(w http.ResponseWriter, r *http.Request, ss *sessions) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(w, &APIError{Status: http.StatusMethodNotAllowed, Code: codeBadRequest, Message: "sign out with POST " + logoutPath})
		return
	}
	if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		ss.revoke(bearer)
	}
	w.WriteHeader(http.StatusNoContent)
}
