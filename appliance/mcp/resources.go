package mcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hearth/client"
)

// maxRead bounds what one read_output call or resource read returns: a
// model's context is no place for more.
const maxRead = 1 << 20

// Session outputs as resources. Their URIs are
// hearth://sessions/{session}/outputs/{path}, each path segment
// percent-escaped. The SDK lists only resources registered in advance,
// and outputs come and go, so resources/list is answered here, from the
// daemon, a page of sessions at a time.
const (
	uriPrefix   = "hearth://sessions/"
	uriTemplate = uriPrefix + "{session}/outputs/{+path}"
)

// sessionsPerPage is how many sessions' outputs one resources/list page
// holds (a variable for the tests).
var sessionsPerPage = 20

func (h *handlers) addResources(s *mcpsdk.Server) {
	s.AddResourceTemplate(&mcpsdk.ResourceTemplate{
		Name:        "session-output",
		Title:       "A file an agent session wrote under outputs/",
		Description: "A file under an agent session's outputs/, at most 1 MiB; list_sessions names the sessions.",
		URITemplate: uriTemplate,
	}, h.readResource)
	s.AddReceivingMiddleware(func(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
		return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
			r, ok := req.(*mcpsdk.ListResourcesRequest)
			if method != "resources/list" || !ok {
				return next(ctx, method, req)
			}
			var cursor string
			if r.Params != nil {
				cursor = r.Params.Cursor
			}
			return h.listResources(ctx, cursor)
		}
	})
}

// listResources lists the outputs of the sessions after cursor (a
// session id; "" for the newest).
func (h *handlers) listResources(ctx context.Context, cursor string) (*mcpsdk.ListResourcesResult, error) {
	sessions, err := h.d.AgentSessions(ctx, client.AgentSessionFilter{Before: cursor, Limit: sessionsPerPage})
	if err != nil {
		return nil, internal(err)
	}
	res := &mcpsdk.ListResourcesResult{Resources: []*mcpsdk.Resource{}}
	for _, s := range sessions {
		if s.LastExecution == "" {
			continue
		}
		files, err := h.d.Outputs(ctx, s.LastExecution)
		if err != nil {
			return nil, internal(fmt.Errorf("outputs of session %s: %w", s.Id, err))
		}
		for _, f := range files {
			res.Resources = append(res.Resources, &mcpsdk.Resource{
				URI: outputURI(s.Id, f.Path), Name: s.Id + "/" + f.Path, MIMEType: mime.TypeByExtension(path.Ext(f.Path)), Size: f.Size,
			})
		}
	}
	if len(sessions) == sessionsPerPage {
		res.NextCursor = sessions[len(sessions)-1].Id
	}
	return res, nil
}

func (h *handlers) readResource(ctx context.Context, req *mcpsdk.ReadResourceRequest) (*mcpsdk.ReadResourceResult, error) {
	uri := req.Params.URI
	session, file, err := parseOutputURI(uri)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	id, err := h.sessionExecution(ctx, session)
	if errors.Is(err, errNoSession) {
		return nil, mcpsdk.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, internal(err)
	}
	out, err := h.read(ctx, id, file, maxRead)
	if err != nil {
		return nil, internal(err) // the daemon's message says what was wrong: no such file, a path outside outputs/
	}
	if out.Truncated {
		return nil, internal(fmt.Errorf("%s is %d bytes, more than the %d a resource may be: download it with 'hearth agents outputs %s --download DIR'",
			uri, out.Size, maxRead, id))
	}
	c := &mcpsdk.ResourceContents{URI: uri, MIMEType: mimeType(file, out.Encoding == "text"), Text: out.Content}
	if out.Encoding != "text" {
		c.Text, c.Blob = "", out.raw
	}
	return &mcpsdk.ReadResourceResult{Contents: []*mcpsdk.ResourceContents{c}}, nil
}

// internal reports err as a JSON-RPC internal error with its message.
func internal(err error) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
}

// outputURI names the file at rel (relative to the session, starting
// outputs/) of a session.
func outputURI(session, rel string) string {
	segs := strings.Split(rel, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return uriPrefix + url.PathEscape(session) + "/" + strings.Join(segs, "/")
}

// parseOutputURI is the inverse of outputURI. The file it returns is
// not checked: the daemon refuses anything outside outputs/.
func parseOutputURI(uri string) (session, rel string, err error) {
	rest, ok := strings.CutPrefix(uri, uriPrefix)
	esc, file, ok2 := strings.Cut(rest, "/outputs/")
	if !ok || !ok2 || esc == "" || file == "" {
		return "", "", fmt.Errorf("resource %q: want %s", uri, uriTemplate)
	}
	if session, err = url.PathUnescape(esc); err == nil {
		rel, err = url.PathUnescape(file)
	}
	if err != nil {
		return "", "", fmt.Errorf("resource %q: %w", uri, err)
	}
	return session, "outputs/" + rel, nil
}

// mimeType is the type of a file named name, by its extension if known,
// else by whether it is text.
func mimeType(name string, text bool) string {
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	if text {
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}

// errNoSession means an agent session has no execution, or does not exist.
var errNoSession = errors.New("no such agent session")

// sessionExecution returns the newest execution of an agent session:
// outputs are reached through an execution of their session.
func (h *handlers) sessionExecution(ctx context.Context, session string) (string, error) {
	list, err := h.d.Executions(ctx, client.ExecutionFilter{Session: session, Limit: 1})
	if err != nil {
		return "", err
	}
	if len(list) == 0 {
		return "", fmt.Errorf("%w %q: list_sessions names them", errNoSession, session)
	}
	return list[0].Id, nil
}

// read reads up to limit bytes of the file rel under the outputs of
// execution id's session.
func (h *handlers) read(ctx context.Context, id, rel string, limit int64) (output, error) {
	rel = "outputs/" + strings.TrimPrefix(rel, "outputs/")
	w := &capped{limit: limit}
	n, err := h.d.DownloadOutput(ctx, id, rel, w)
	if err != nil && !errors.Is(err, errFull) {
		return output{}, fmt.Errorf("read %s: %w", rel, err)
	}
	out := output{Path: rel, Size: n, Truncated: w.full, raw: w.buf}
	if w.full {
		if out.Size, err = h.size(ctx, id, rel); err != nil {
			return output{}, err
		}
	}
	if text, ok := asText(w.buf, w.full); ok {
		out.Encoding, out.Content = "text", string(text)
	} else {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(w.buf)
	}
	return out, nil
}

// asText returns b as text if it is UTF-8; when b was cut short, a
// character the cut split is left out.
func asText(b []byte, cut bool) ([]byte, bool) {
	for i := len(b) - 1; cut && i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				b = b[:i]
			}
			break
		}
	}
	return b, utf8.Valid(b)
}

// size is the size of the output file rel, which was just read.
func (h *handlers) size(ctx context.Context, id, rel string) (int64, error) {
	files, err := h.d.Outputs(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", rel, err)
	}
	for _, f := range files {
		if f.Path == rel {
			return f.Size, nil
		}
	}
	return 0, fmt.Errorf("size of %s: it is gone", rel)
}

// errFull stops a download once capped has what it may hold.
var errFull = errors.New("read limit reached")

// capped keeps up to limit bytes, and fails the write that would go past
// them, so that the download stops there.
type capped struct {
	limit int64
	buf   []byte
	full  bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.limit - int64(len(c.buf))
	if int64(len(p)) <= room {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	c.buf, c.full = append(c.buf, p[:room]...), true
	return int(room), errFull
}
