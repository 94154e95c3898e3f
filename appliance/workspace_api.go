package appliance

import (
	"fmt"
	"io"
	"net/http"
	"path"
	"time"

	"hearth/appliance/api"
	"hearth/fs"
)

// The workspace routes: sessions and snapshots of the shared tree. Their
// JSON keeps the shape of API v1 (fs.SessionInfo and fs.SnapshotInfo).

func (s *server) ListSessions(w http.ResponseWriter, r *http.Request) {
	if !s.workspaceHere(w, "list sessions") {
		return
	}
	reply(w, http.StatusOK, s.d.store.Sessions())
}

func (s *server) CreateSession(w http.ResponseWriter, r *http.Request) {
	if !s.workspaceHere(w, "create a session") {
		return
	}
	var req api.CreateSessionRequest
	if decode(w, r, maxBody, &req) {
		result(w, http.StatusCreated, req, s.d.store.CreateSession(req.Id, fs.Owner{}))
	}
}

func (s *server) DeleteSession(w http.ResponseWriter, r *http.Request, id string) {
	if !s.workspaceHere(w, "delete a session") {
		return
	}
	result(w, http.StatusOK, api.Deleted{Deleted: id}, s.d.store.DeleteSession(id))
}

func (s *server) ListSnapshots(w http.ResponseWriter, r *http.Request, params api.ListSnapshotsParams) {
	if !s.workspaceHere(w, "list snapshots") {
		return
	}
	list, err := s.d.store.Snapshots(params.Session)
	result(w, http.StatusOK, list, err)
}

func (s *server) CreateSnapshot(w http.ResponseWriter, r *http.Request) {
	if !s.workspaceHere(w, "take a snapshot") {
		return
	}
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
	if !s.workspaceHere(w, "delete a snapshot") {
		return
	}
	result(w, http.StatusOK, api.Deleted{Deleted: params.Name}, s.d.store.DeleteSnapshot(params.Session, params.Name))
}

func (s *server) RestoreSnapshot(w http.ResponseWriter, r *http.Request) {
	if !s.workspaceHere(w, "restore a snapshot") {
		return
	}
	var req api.RestoreRequest
	if decode(w, r, maxBody, &req) {
		result(w, http.StatusOK, req, s.d.store.Restore(req.Session, req.Snapshot))
	}
}

func (s *server) BranchSession(w http.ResponseWriter, r *http.Request) {
	if !s.workspaceHere(w, "branch a session") {
		return
	}
	var req api.BranchRequest
	if decode(w, r, maxBody, &req) {
		result(w, http.StatusCreated, req, s.d.store.Branch(req.Session, req.Snapshot, req.From, req.NewSession))
	}
}

func (s *server) DownloadSessionArchive(w http.ResponseWriter, r *http.Request, id string, params api.DownloadSessionArchiveParams) {
	format := string(params.Format)
	if format == "" {
		format = fs.FormatTarGz
	}
	aw := &archiveWriter{w: w, id: id, format: format}
	err := s.d.DownloadArchive(aw, id, format, params.Home)
	switch {
	case err != nil && !aw.started:
		fail(w, apiError(err))
	case err != nil:
		// Headers and part of the archive are out: cut the connection so
		// that the client sees a failed transfer, never a short archive
		// that looks whole.
		panic(http.ErrAbortHandler)
	case !aw.started:
		aw.start() // an empty archive still has its headers
	}
}

// archiveWriter sends the download's headers with its first bytes, so an
// error before them (no such session) is still an error response.
type archiveWriter struct {
	w          http.ResponseWriter
	id, format string
	started    bool
}

func (a *archiveWriter) Write(p []byte) (int, error) {
	if !a.started {
		a.start()
	}
	return a.w.Write(p)
}

func (a *archiveWriter) start() {
	a.started = true
	ct := "application/gzip"
	if a.format == fs.FormatZip {
		ct = "application/zip"
	}
	a.w.Header().Set("Content-Type", ct)
	a.w.Header().Set("X-Content-Type-Options", "nosniff")
	a.w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", a.id+"."+a.format))
	a.w.WriteHeader(http.StatusOK)
}

func (s *server) UploadSessionArchive(w http.ResponseWriter, r *http.Request, id string, params api.UploadSessionArchiveParams) {
	got, err := s.d.UploadArchive(id, params.Dir, string(params.Format), r.Body)
	result(w, http.StatusOK, got, err)
}

func (s *server) ListWorkspaceDir(w http.ResponseWriter, r *http.Request, id string, params api.ListWorkspaceDirParams) {
	list, err := s.d.ListWorkspaceDir(id, params.Path)
	out := make([]api.WorkspaceEntry, len(list))
	for i, e := range list {
		out[i] = api.WorkspaceEntry{Name: e.Name, Path: e.Path, Type: api.WorkspaceEntryType(e.Type), Size: e.Size, Modified: e.Modified}
	}
	result(w, http.StatusOK, out, err)
}

// ReadWorkspaceFile serves a file with the one type OpenWorkspaceFile
// allows, not to be sniffed, and sandboxed should a browser open it as a
// page: what an agent wrote never runs with the dashboard's origin.
func (s *server) ReadWorkspaceFile(w http.ResponseWriter, r *http.Request, id string, params api.ReadWorkspaceFileParams) {
	f, err := s.d.OpenWorkspaceFile(id, params.Path)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	defer f.Close()
	h := w.Header()
	h.Set("Content-Type", f.ContentType)
	h.Set("Content-Length", fmt.Sprint(f.Size))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", path.Base(params.Path)))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
}

// workspaceHere answers the workspace routes on a node whose workspace
// another node holds (workspace.remote) with the error naming it.
func (s *server) workspaceHere(w http.ResponseWriter, what string) bool {
	if err := s.d.WorkspaceHere(what); err != nil {
		fail(w, apiError(err))
		return false
	}
	return true
}
