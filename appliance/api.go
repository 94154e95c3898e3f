package appliance

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"hearth/fs"
)

// The local API, version 1. JSON in and out; errors are
// {"error":{"code":"...","message":"..."}} with a 4xx or 5xx status.

const maxBody = 1 << 20

// SnapshotRequest takes a snapshot; Session "" means the whole tree.
type SnapshotRequest struct {
	Session string `json:"session"`
	Name    string `json:"name"`
}

// RestoreRequest rolls a session (or, with Session "", the tree) back.
type RestoreRequest struct {
	Session  string `json:"session"`
	Snapshot string `json:"snapshot"`
}

// BranchRequest starts NewSession from session From in a snapshot of
// Session (From defaults to Session).
type BranchRequest struct {
	Session    string `json:"session"`
	Snapshot   string `json:"snapshot"`
	From       string `json:"from,omitempty"`
	NewSession string `json:"new_session"`
}

// CreateSessionRequest makes a session.
type CreateSessionRequest struct {
	ID string `json:"id"`
}

// APIError is the body of every error response.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"-"`
}

func (e *APIError) Error() string { return e.Message }

func (d *Daemon) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/workspace/sessions", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, d.store.Sessions())
	})
	mux.HandleFunc("POST /v1/workspace/sessions", func(w http.ResponseWriter, r *http.Request) {
		var req CreateSessionRequest
		if decode(w, r, &req) {
			result(w, http.StatusCreated, req, d.store.CreateSession(req.ID, fs.Owner{}))
		}
	})
	mux.HandleFunc("DELETE /v1/workspace/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		result(w, http.StatusOK, map[string]string{"deleted": r.PathValue("id")}, d.store.DeleteSession(r.PathValue("id")))
	})
	mux.HandleFunc("GET /v1/workspace/snapshots", func(w http.ResponseWriter, r *http.Request) {
		list, err := d.store.Snapshots(r.URL.Query().Get("session"))
		result(w, http.StatusOK, list, err)
	})
	mux.HandleFunc("POST /v1/workspace/snapshots", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if !decode(w, r, &req) {
			return
		}
		if req.Name == "" {
			req.Name = time.Now().UTC().Format("snap-20060102-150405.000")
		}
		result(w, http.StatusCreated, req, d.store.Snapshot(req.Session, req.Name))
	})
	mux.HandleFunc("DELETE /v1/workspace/snapshots", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		result(w, http.StatusOK, map[string]string{"deleted": q.Get("name")}, d.store.DeleteSnapshot(q.Get("session"), q.Get("name")))
	})
	mux.HandleFunc("POST /v1/workspace/restore", func(w http.ResponseWriter, r *http.Request) {
		var req RestoreRequest
		if decode(w, r, &req) {
			result(w, http.StatusOK, req, d.store.Restore(req.Session, req.Snapshot))
		}
	})
	mux.HandleFunc("POST /v1/workspace/branch", func(w http.ResponseWriter, r *http.Request) {
		var req BranchRequest
		if decode(w, r, &req) {
			result(w, http.StatusCreated, req, d.store.Branch(req.Session, req.Snapshot, req.From, req.NewSession))
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, &APIError{Code: "not_found", Message: fmt.Sprintf("no API route %s %s", r.Method, r.URL.Path), Status: http.StatusNotFound})
	})
	return mux
}

// decode reads a JSON body strictly: size-limited, unknown fields refused.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		code, status := "bad_request", http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			code, status = "too_large", http.StatusRequestEntityTooLarge
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

// apiError maps store errors to HTTP; this is the only place that does.
func apiError(err error) *APIError {
	e := &APIError{Code: "internal", Message: err.Error(), Status: http.StatusInternalServerError}
	switch {
	case errors.Is(err, fs.ErrNotFound):
		e.Code, e.Status = "not_found", http.StatusNotFound
	case errors.Is(err, fs.ErrExists):
		e.Code, e.Status = "exists", http.StatusConflict
	case errors.Is(err, fs.ErrBadName):
		e.Code, e.Status = "bad_name", http.StatusBadRequest
	case errors.Is(err, fs.ErrQuota):
		e.Code, e.Status = "quota", http.StatusInsufficientStorage
	}
	return e
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, e *APIError) {
	reply(w, e.Status, map[string]*APIError{"error": e})
}
