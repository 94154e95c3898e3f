package appliance

import (
	"net/http"
	"time"

	"hearth/appliance/api"
	"hearth/fs"
)

// The workspace routes: sessions and snapshots of the shared tree. Their
// JSON keeps the shape of API v1 (fs.SessionInfo and fs.SnapshotInfo).

func (s *server) ListSessions(w http.ResponseWriter, r *http.Request) {
	reply(w, http.StatusOK, s.d.store.Sessions())
}

func (s *server) CreateSession(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSessionRequest
	if decode(w, r, maxBody, &req) {
		result(w, http.StatusCreated, req, s.d.store.CreateSession(req.Id, fs.Owner{}))
	}
}

func (s *server) DeleteSession(w http.ResponseWriter, r *http.Request, id string) {
	result(w, http.StatusOK, api.Deleted{Deleted: id}, s.d.store.DeleteSession(id))
}

func (s *server) ListSnapshots(w http.ResponseWriter, r *http.Request, params api.ListSnapshotsParams) {
	list, err := s.d.store.Snapshots(params.Session)
	result(w, http.StatusOK, list, err)
}

func (s *server) CreateSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	if req.Name == "" {
		req.Name = time.Now().UTC().Format("snap-20060102-150405.000")
	}
	result(w, http.StatusCreated, req, s.d.store.Snapshot(req.Session, req.Name))
}

func (s *server) DeleteSnapshot(w http.ResponseWriter, r *http.Request, params api.DeleteSnapshotParams) {
	result(w, http.StatusOK, api.Deleted{Deleted: params.Name}, s.d.store.DeleteSnapshot(params.Session, params.Name))
}

func (s *server) RestoreSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.RestoreRequest
	if decode(w, r, maxBody, &req) {
		result(w, http.StatusOK, req, s.d.store.Restore(req.Session, req.Snapshot))
	}
}

func (s *server) BranchSession(w http.ResponseWriter, r *http.Request) {
	var req api.BranchRequest
	if decode(w, r, maxBody, &req) {
		result(w, http.StatusCreated, req, s.d.store.Branch(req.Session, req.Snapshot, req.From, req.NewSession))
	}
}
