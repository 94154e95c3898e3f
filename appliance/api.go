package appliance

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"sync"

	"hearth/agents"
	"hearth/agents/store"
	"hearth/appliance/api"
	"hearth/appliance/dashboard"
	"hearth/appliance/mcp"
	"hearth/client"
	"hearth/fs"
	"hearth/image"
	"hearth/scheduler"
	"hearth/vmm"
	"hearth/vmm/guest"
)

// The local API, version 1, is described by api/openapi.yaml; the routes
// and parameter binding are generated from it, the handlers are in
// *_api.go (see doc.go). JSON in and out, except the streams; errors are
// {"error":{"code":"...","message":"..."}} with a 4xx or 5xx status,
// chosen by apiError below and nowhere else.

const (
	maxBody     = 1 << 20  // a JSON request body
	maxExecBody = 16 << 20 // an exec request, which carries stdin
)

// Error codes. Only this file maps them to HTTP statuses.
const (
	codeNotFound    = "not_found"
	codeBadRequest  = "bad_request"
	codeConflict    = "conflict"
	codeTooLarge    = "too_large"
	codeUnavailable = "unavailable"
	codeInternal    = "internal"
	codeBuildFailed = "build_failed"
	codeUnsupported = "unsupported" // the machine's tier cannot do it
	codeNoCredits   = "insufficient_credits"
	codeCrossOrigin = "cross_origin"           // a browser's request for a page of another origin
	codeMediaType   = "unsupported_media_type" // a JSON route sent something else
)

var codeStatus = map[string]int{
	codeNotFound: http.StatusNotFound, codeBadRequest: http.StatusBadRequest, codeConflict: http.StatusConflict,
	codeTooLarge: http.StatusRequestEntityTooLarge, codeUnavailable: http.StatusServiceUnavailable,
	codeInternal: http.StatusInternalServerError, codeBuildFailed: http.StatusInternalServerError,
	codeUnsupported: http.StatusNotImplemented, codeNoCredits: http.StatusPaymentRequired,
}

// APIError is the body of every error response, and what the client
// returns for one.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Step is the build step that failed, for build_failed.
	Step   string `json:"step,omitempty"`
	Status int    `json:"-"`
}

func (e *APIError) Error() string { return e.Message }

// kindCode is the API code of each domain error (errors.go).
var kindCode = map[error]string{
	ErrNotFound: codeNotFound, ErrInvalid: codeBadRequest, ErrConflict: codeConflict,
	ErrUnavailable: codeUnavailable, ErrUnsupported: codeUnsupported, ErrTooLarge: codeTooLarge,
	ErrNoCredits: codeNoCredits,
}

// notFound are the not-found sentinels of the packages the services use.
var notFound = []error{
	ErrNotFound, fs.ErrNotFound, guest.ErrNotFound, image.ErrNotFound, store.ErrNotFound,
	agents.ErrNotFound, scheduler.ErrNotFound, vmm.ErrNotFound,
}

// apiError maps errors to HTTP; this is the only place that does. A
// domain error's own kind comes first (an invalid request that mentions
// a missing file is invalid), then the sentinels it wraps.
func apiError(err error) *APIError {
	e := &APIError{Code: codeInternal, Message: err.Error()}
	var ke *kindError
	var se *image.StepError
	switch {
	case errors.As(err, &ke):
		e.Code = kindCode[ke.kind]
	case errors.As(err, &se):
		e.Code, e.Step = codeBuildFailed, se.Step
	case isAny(err, notFound):
		e.Code = codeNotFound
	case errors.Is(err, scheduler.ErrBusy), errors.Is(err, agents.ErrRefused):
		e.Code = codeConflict
	case errors.Is(err, scheduler.ErrClosed):
		e.Code = codeUnavailable
	case errors.Is(err, store.ErrWriteFailed): // the disk is full: GET /v1/health says so until it is not
		e.Code = codeUnavailable
	case errors.Is(err, store.ErrClaimed), errors.Is(err, store.ErrNotHolder):
		e.Code = codeConflict
	case errors.Is(err, store.ErrInsufficientCredits):
		e.Code = codeNoCredits
	case errors.Is(err, store.ErrInvalid):
		e.Code = codeBadRequest
	case errors.Is(err, fs.ErrExists):
		e.Code, e.Status = "exists", http.StatusConflict
	case errors.Is(err, fs.ErrBadName):
		e.Code, e.Status = "bad_name", http.StatusBadRequest
	case errors.Is(err, fs.ErrQuota):
		e.Code, e.Status = "quota", http.StatusInsufficientStorage
	case errors.Is(err, guest.ErrTooLarge):
		e.Code = codeTooLarge
	case errors.Is(err, guest.ErrOutside):
		e.Code = codeBadRequest
	}
	if e.Status == 0 {
		e.Status = codeStatus[e.Code]
	}
	return e
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// server implements the generated interface over a daemon.
type server struct{ d *Daemon }

var _ api.ServerInterface = (*server)(nil)

func (d *Daemon) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", dashboard.RedirectBrowsers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail(w, &APIError{Code: codeNotFound, Message: fmt.Sprintf("no API route %s %s", r.Method, r.URL.Path), Status: http.StatusNotFound})
	})))
	mux.Handle(dashboard.Prefix, dashboard.Handler())       // the web dashboard, a client of this API
	mux.Handle("/mcp", mcp.Handler(client.New(d.Socket()))) // MCP over streamable HTTP, through the API like any client
	return api.HandlerWithOptions(&server{d: d}, api.StdHTTPServerOptions{
		BaseRouter: mux,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			fail(w, &APIError{Code: codeBadRequest, Message: err.Error(), Status: http.StatusBadRequest})
		},
	})
}

// guardBrowsers refuses what a page of another origin can make a browser
// send without asking (no CORS preflight) along with the dashboard's
// cookie: a state-changing request from another origin (by Sec-Fetch-Site
// or Origin, which API clients do not send; another port of the same
// host is another origin), and a body that is not JSON (a form or
// text/plain) on a route that takes JSON. Uploads keep their own type.
func guardBrowsers(h http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := cop.Check(r); err != nil {
			fail(w, &APIError{Status: http.StatusForbidden, Code: codeCrossOrigin,
				Message: "a browser's " + r.Method + " from another origin is refused: use the dashboard of this address, or an API client"})
			return
		}
		if !safeMethod(r.Method) && !isUpload(r) && (r.ContentLength != 0 || r.Header.Get("Content-Type") != "") && !isJSON(r.Header.Get("Content-Type")) {
			fail(w, &APIError{Status: http.StatusUnsupportedMediaType, Code: codeMediaType,
				Message: fmt.Sprintf("%s %s takes a JSON body: send it with 'Content-Type: application/json', not %q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))})
			return
		}
		h.ServeHTTP(w, r)
	})
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// isUpload says whether r is one of the requests whose body is not JSON
// (openapi.yaml): PUT /v1/sandboxes/{id}/files and POST
// /v1/workspace/sessions/{id}/archive, application/octet-stream, and a task that streams its input files, POST /v1/executions or
// /v1/sessions/{id}/resume as multipart/form-data. A form that a page of
// another origin makes a browser send is refused before this, by its
// Origin or Sec-Fetch-Site.
func isUpload(r *http.Request) bool {
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/"); ok && r.Method == http.MethodPut {
		id, tail, _ := strings.Cut(rest, "/")
		return id != "" && tail == "files"
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/workspace/sessions/"); ok && r.Method == http.MethodPost {
		id, tail, _ := strings.Cut(rest, "/")
		return id != "" && tail == "archive"
	}
	return r.Method == http.MethodPost && isTaskPath(r.URL.Path) && isMultipart(r)
}

// isTaskPath says whether p is a route that starts a task from a
// request with input files.
func isTaskPath(p string) bool {
	if p == "/v1/executions" {
		return true
	}
	rest, ok := strings.CutPrefix(p, "/v1/sessions/")
	id, tail, _ := strings.Cut(rest, "/")
	return ok && id != "" && tail == "resume"
}

// decode reads a JSON body strictly: size-limited, unknown fields refused.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		code, status := codeBadRequest, http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			code, status = codeTooLarge, http.StatusRequestEntityTooLarge
		}
		fail(w, &APIError{Code: code, Message: "request body: " + err.Error(), Status: status})
		return false
	}
	return true
}

func result(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		fail(w, apiError(err))
		return
	}
	reply(w, status, v)
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, e *APIError) {
	reply(w, e.Status, map[string]*APIError{"error": e})
}

// stream writes newline-delimited JSON frames, each flushed at once so the
// client sees it as it is produced. The 200 header goes out with the
// first frame, so an error before it can still be an error response.
type stream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	err     error // the first write error: the client went away
}

func newStream(w http.ResponseWriter) *stream {
	return &stream{w: w, rc: http.NewResponseController(w)}
}

func (s *stream) frame(v any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.Header().Set("X-Content-Type-Options", "nosniff")
		s.w.WriteHeader(http.StatusOK)
	}
	b, err := json.Marshal(v)
	if err == nil {
		_, err = s.w.Write(append(b, '\n'))
	}
	if err == nil {
		err = s.rc.Flush()
	}
	s.err = err
	return err
}

// fail ends the stream with an error: an error frame once it started, an
// error response before.
func (s *stream) fail(err error) {
	e := apiError(err)
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if !started {
		fail(s.w, e)
		return
	}
	s.frame(map[string]api.Error{"error": {Code: e.Code, Message: e.Message, Step: e.Step}})
}
