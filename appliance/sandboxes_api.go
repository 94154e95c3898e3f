package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"hearth/appliance/api"
	"hearth/cluster"
	"hearth/vmm/guest"
)

// The sandbox routes.

// sandboxView describes a sandbox for the API.
func sandboxView(sb SandboxInfo) api.Sandbox {
	out := api.Sandbox{
		Id: sb.ID, Image: sb.Image, ImageHash: sb.ImageHash, Session: sb.Session,
		Status: api.SandboxStatus(sb.Status), AutoPaused: sb.AutoPaused,
		Cpus: sb.CPUs, Memory: sb.Memory, Pids: sb.Pids, Disk: sb.Disk, Env: sb.Env,
		IdleTimeout: time.Duration(sb.IdleTimeout).String(), ExecTimeout: time.Duration(sb.ExecTimeout).String(),
		User: sb.User, Network: sb.Network, Created: sb.Created, LastActive: sb.LastActive.UTC(), Driver: sb.Driver,
		Owner: sb.Owner, ForkedFrom: sb.ForkedFrom, Node: sb.Node, NodeAddr: sb.NodeAddr,
	}
	if sb.Status == cluster.SandboxLost {
		out.Status = api.SandboxStatusLost
	}
	if sb.Usage != nil {
		out.Usage = usageView(*sb.Usage)
		if ws := sb.Workspace; ws != nil {
			out.Usage.WorkspaceBytes, out.Usage.WorkspaceBytesLimit = ws.Bytes, ws.Quota.Bytes
			out.Usage.WorkspaceFiles, out.Usage.WorkspaceFilesLimit = ws.Files, ws.Quota.Inodes
		}
	}
	return out
}

func (s *server) ListSandboxes(w http.ResponseWriter, r *http.Request) {
	list, err := s.d.sbx.ListCluster(r.Context())
	out := []api.Sandbox{}
	for _, sb := range list {
		out = append(out, sandboxView(sb))
	}
	result(w, http.StatusOK, out, err)
}

func (s *server) CreateSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if !decode(w, r, maxBody, &req) {
		return
	}
	spec := createSpec{ID: req.Id, Image: req.Image, Session: req.Session, Owner: req.Owner, CPUs: req.Cpus,
		Memory: req.Memory, Pids: req.Pids, Disk: req.Disk, Env: req.Env,
		WorkspaceBytes: req.WorkspaceBytes, WorkspaceFiles: req.WorkspaceFiles}
	var err error
	if spec.IdleTimeout, err = optDuration("idle_timeout", req.IdleTimeout); err == nil {
		spec.ExecTimeout, err = optDuration("exec_timeout", req.ExecTimeout)
	}
	if err != nil {
		fail(w, apiError(err))
		return
	}
	sb, err := s.d.sbx.Create(r.Context(), spec)
	if err != nil {
		fail(w, apiError(err))
		return
	}
	reply(w, http.StatusCreated, sandboxView(sb))
}

// optDuration parses an optional duration; "" means the default (nil).
func optDuration(key, v string) (*time.Duration, error) {
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return nil, invalidf("%s %q: write a duration like 90s, 10m or 1h", key, v)
	}
	return &d, nil
}

func (s *server) GetSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	sb, err := s.d.sbx.Get(id)
	result(w, http.StatusOK, sandboxView(sb), err)
}

func (s *server) DestroySandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	// A client that goes away must not leave a sandbox half destroyed.
	result(w, http.StatusOK, api.Deleted{Deleted: id}, s.d.sbx.Destroy(context.WithoutCancel(r.Context()), id))
}

func (s *server) PauseSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	sb, err := s.d.sbx.Pause(r.Context(), id)
	s.lifecycleReply(w, sb, err)
}

func (s *server) ResumeSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	sb, err := s.d.sbx.Resume(r.Context(), id)
	s.lifecycleReply(w, sb, err)
}

func (s *server) lifecycleReply(w http.ResponseWriter, sb SandboxInfo, err error) {
	result(w, http.StatusOK, sandboxView(sb), err)
}

// ExecSandbox streams a command's output as ndjson frames: started, then
// stdout and stderr in the order produced, then exit (or error).
func (s *server) ExecSandbox(w http.ResponseWriter, r *http.Request, id api.SandboxID) {
	var req api.ExecRequest
	if !decode(w, r, maxExecBody, &req) {
		return
	}
	spec := execSpec{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User, Stdin: req.Stdin,
		TTY: req.Tty, Rows: clampDim(req.Rows), Cols: clampDim(req.Cols)}
	var err error
	if spec.Timeout, err = optDuration("timeout", req.Timeout); err != nil {
		fail(w, apiError(err))
		return
	}
	out := newStream(w)
	ex, err := s.d.sbx.Exec(r.Context(), id, spec, frameWriter{out, api.ExecFrameStreamStdout}, frameWriter{out, api.ExecFrameStreamStderr})
	if err != nil {
		out.fail(err)
		return
	}
	out.frame(api.ExecFrame{Started: &api.ExecStarted{Pid: ex.PID}})
	st, err := ex.Wait()
	if err != nil {
		out.fail(fmt.Errorf("sandbox %s: %w", id, err))
		return
	}
	out.frame(api.ExecFrame{Exit: &api.ExitStatus{Code: st.Code, Signal: st.Signal, TimedOut: st.TimedOut}})
}

func clampDim(v int) uint16 { return uint16(min(max(v, 0), 65535)) }

// frameWriter turns one output stream into frames.
type frameWriter struct {
	s    *stream
	kind api.ExecFrameStream
}

func (f frameWriter) Write(p []byte) (int, error) {
	if err := f.s.frame(api.ExecFrame{Stream: f.kind, Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *server) DownloadSandboxFile(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.DownloadSandboxFileParams) {
	lw := &lazyWriter{w: w}
	err := s.d.sbx.Download(r.Context(), id, params.Path, func(fi guest.FileInfo) io.Writer {
		lw.size, lw.mode = fi.Size, fi.Mode
		return lw
	})
	if err != nil && !lw.started {
		fail(w, apiError(err))
	}
	// An error after the first byte can only cut the body short; the
	// client sees fewer bytes than Content-Length.
}

// lazyWriter sends the download's headers with its first bytes, so an
// error before them is still an error response.
type lazyWriter struct {
	w       http.ResponseWriter
	size    int64
	mode    uint32
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.start()
	}
	return l.w.Write(p)
}

func (l *lazyWriter) start() {
	l.started = true
	h := l.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(l.size, 10))
	h.Set("X-File-Mode", strconv.FormatUint(uint64(l.mode), 8))
	l.w.WriteHeader(http.StatusOK)
}

func (s *server) UploadSandboxFile(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.UploadSandboxFileParams) {
	limit := s.d.sbx.MaxUpload()
	if err := checkPath(params.Path); err != nil {
		fail(w, apiError(err))
		return
	}
	mode := uint64(0o644)
	if params.Mode != "" {
		var err error
		if mode, err = strconv.ParseUint(params.Mode, 8, 32); err != nil || mode > 0o7777 {
			fail(w, apiError(invalidf("mode %q: give permission bits in octal, like 0644", params.Mode)))
			return
		}
	}
	if r.ContentLength > limit {
		fail(w, apiError(tooLarge(r.ContentLength, limit)))
		return
	}
	body := &limitedReader{r: r.Body, left: limit}
	n, err := s.d.sbx.Upload(r.Context(), id, params.Path, body, uint32(mode))
	if body.over {
		err = tooLarge(-1, limit)
	}
	result(w, http.StatusOK, api.FileWritten{Path: params.Path, Size: n}, err)
}

func tooLarge(size, limit int64) error {
	what := "the upload"
	if size >= 0 {
		what = fmt.Sprintf("the upload of %d bytes", size)
	}
	return tooLargef("%s is over the daemon's limit of %d bytes: raise max_upload under [sandbox] in the config, or split the file", what, limit)
}

// limitedReader fails a read past the limit and remembers that it did.
type limitedReader struct {
	r    io.Reader
	left int64
	over bool
}

var errUploadTooLarge = errors.New("upload too large")

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One more byte tells a body of exactly the limit from a longer one.
		var b [1]byte
		if n, _ := l.r.Read(b[:]); n > 0 {
			l.over = true
			return 0, errUploadTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func (s *server) StatSandboxFile(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.StatSandboxFileParams) {
	fi, err := s.d.sbx.Stat(r.Context(), id, params.Path)
	result(w, http.StatusOK, fileInfo(fi), err)
}

func (s *server) ListSandboxDir(w http.ResponseWriter, r *http.Request, id api.SandboxID, params api.ListSandboxDirParams) {
	list, err := s.d.sbx.ListDir(r.Context(), id, params.Path)
	out := make([]api.FileInfo, len(list))
	for i, fi := range list {
		out[i] = fileInfo(fi)
	}
	result(w, http.StatusOK, out, err)
}

func fileInfo(fi guest.FileInfo) api.FileInfo {
	return api.FileInfo{Name: fi.Name, Size: fi.Size, Mode: fi.Mode, ModTime: fi.ModTime, IsDir: fi.IsDir}
}
