package remote

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"hearth/fs"
)

// The control protocol: a trusted node (SSH user ControlUser) asks for
// the subsystem subsystemControl and sends one request per channel as a
// frame: a 4-byte big-endian length, then that many bytes of JSON. A
// write request is followed by data frames (raw bytes, at most
// maxDataFrame each) ended by an empty frame. The answer is one JSON
// frame.
const (
	subsystemControl = "hearth-control@hearth"
	// ControlUser is the SSH user a node connects as to run store
	// operations. It cannot be a session (ids start with a letter or a
	// digit), so no view user ever gets it.
	ControlUser = "_node"
	// maxRequestFrame bounds a request or an answer's JSON: a path is
	// at most fs.MaxPathLen and an answer lists at most the session's
	// snapshots or matches.
	maxRequestFrame = 64 << 10
	maxAnswerFrame  = 32 << 20 // a read's data, base64
	maxDataFrame    = 1 << 20
	// MaxRead bounds what one ReadFile returns.
	MaxRead = 17 << 20
)

// The operations a node may ask for.
const (
	opEnsure         = "ensure"
	opWrite          = "write"
	opMkdirAll       = "mkdir_all"
	opRemoveAll      = "remove_all"
	opChmod          = "chmod"
	opGlob           = "glob"
	opSnapshot       = "snapshot"
	opSnapshots      = "snapshots"
	opSnapshotHolds  = "snapshot_holds"
	opDeleteSnapshot = "delete_snapshot"
	opRead           = "read"
	opRestore        = "restore"
	opBranch         = "branch"
	opMove           = "move"
)

// ErrBadRequest means a control request was malformed or asked for
// something the protocol does not allow.
var ErrBadRequest = errors.New("bad workspace control request")

// ErrFrameTooLarge means a frame's length passed its bound.
var ErrFrameTooLarge = errors.New("workspace control frame too large")

// request is one control request.
type request struct {
	Op      string      `json:"op"`
	Session string      `json:"session"`
	Path    string      `json:"path,omitempty"`
	Name    string      `json:"name,omitempty"`    // a snapshot
	Pattern string      `json:"pattern,omitempty"` // glob
	UID     uint32      `json:"uid,omitempty"`
	GID     uint32      `json:"gid,omitempty"`
	Mode    os.FileMode `json:"mode,omitempty"`
	Quota   *fs.Quota   `json:"quota,omitempty"` // ensure
	Limit   int64       `json:"limit,omitempty"` // read
	To      string      `json:"to,omitempty"`    // move: the new path; branch: the new session
}

// answer is the reply to one request.
type answer struct {
	Err       string     `json:"err,omitempty"`
	Code      string     `json:"code,omitempty"` // errCodes
	Names     []string   `json:"names,omitempty"`
	Snapshots []Snapshot `json:"snapshots,omitempty"`
	Data      []byte     `json:"data,omitempty"` // read
}

// Snapshot is one of a session's snapshots as the serving node lists
// it; Holds is set by SnapshotHolds only.
type Snapshot struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Holds   int64     `json:"holds,omitempty"`
}

// errCodes carry the store's sentinel errors across, so a node's
// errors.Is works as on the serving node. The first that matches is
// sent: ErrBadRequest before the store's ErrBadName it may wrap.
var errCodes = []struct {
	code string
	err  error
}{
	{"bad_request", ErrBadRequest}, {"unknown_session", ErrUnknownSession},
	{"not_found", fs.ErrNotFound}, {"exists", fs.ErrExists}, {"bad_name", fs.ErrBadName},
	{"quota", fs.ErrQuota}, {"read_only", fs.ErrReadOnly}, {"not_dir", fs.ErrNotDir},
	{"is_dir", fs.ErrIsDir}, {"symlink", fs.ErrSymlinkInPath}, {"not_empty", fs.ErrNotEmpty},
	{"closed", fs.ErrClosed}, {"busy", fs.ErrBusy}, {"no_space", fs.ErrNoSpace},
}

func codeOf(err error) string {
	for _, c := range errCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return ""
}

// errOfCode is the sentinel error code names, nil for none.
func errOfCode(code string) error {
	for _, c := range errCodes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// RemoteError is an error the serving node answered with; it unwraps to
// the store's sentinel error when there is one.
type RemoteError struct {
	Msg string
	Err error
}

func (e *RemoteError) Error() string { return "workspace node: " + e.Msg }
func (e *RemoteError) Unwrap() error { return e.Err }

func (a answer) err() error {
	if a.Err == "" {
		return nil
	}
	return &RemoteError{Msg: a.Err, Err: errOfCode(a.Code)}
}

// writeFrame sends b as one frame.
func writeFrame(w io.Writer, b []byte) error {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := w.Write(append(n[:], b...)); err != nil {
		return err
	}
	return nil
}

// readFrame reads one frame of at most max bytes; a longer one is
// refused before its body is read.
func readFrame(r io.Reader, max int) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if uint64(size) > uint64(max) {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, size, max)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// decodeRequest parses and checks a request frame: a known operation, a
// valid session id, and a path or pattern that stays in the session.
func decodeRequest(b []byte) (request, error) {
	var req request
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return request{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if dec.More() {
		return request{}, fmt.Errorf("%w: data after the request", ErrBadRequest)
	}
	if err := req.check(); err != nil {
		return request{}, err
	}
	return req, nil
}

func (r request) check() error {
	if err := fs.ValidateID("session", r.Session); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	switch r.Op {
	case opEnsure:
		if r.Quota == nil || r.Quota.Bytes < 0 || r.Quota.Inodes < 0 {
			return fmt.Errorf("%w: ensure needs a quota of zero or more", ErrBadRequest)
		}
		return nil
	case opWrite, opMkdirAll, opRemoveAll, opChmod:
		if r.Mode&^os.ModePerm != 0 {
			return fmt.Errorf("%w: mode %v: permission bits only", ErrBadRequest, r.Mode)
		}
		return checkPath(r.Path)
	case opGlob:
		return checkPath(r.Pattern)
	case opRead:
		if r.Limit <= 0 || r.Limit > MaxRead {
			return fmt.Errorf("%w: read limit %d: 1 to %d bytes", ErrBadRequest, r.Limit, MaxRead)
		}
		return checkPath(r.Path)
	case opMove:
		if err := checkPath(r.Path); err != nil {
			return err
		}
		return checkPath(r.To)
	case opBranch:
		if err := fs.ValidateID("session", r.To); err != nil {
			return fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		fallthrough
	case opSnapshot, opDeleteSnapshot, opRestore:
		if err := fs.ValidateID("snapshot", r.Name); err != nil {
			return fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		return nil
	case opSnapshots, opSnapshotHolds:
		return nil
	}
	return fmt.Errorf("%w: unknown operation %q", ErrBadRequest, r.Op)
}

// checkPath refuses what a path relative to a session must not be:
// absolute, climbing with "..", holding NUL, or over fs.MaxPathLen. The
// store checks each name again, and follows no symbolic link.
func checkPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: empty path", ErrBadRequest)
	case len(p) > fs.MaxPathLen:
		return fmt.Errorf("%w: path is %d bytes, the limit is %d", ErrBadRequest, len(p), fs.MaxPathLen)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("%w: path %q is absolute: give it relative to the session", ErrBadRequest, p)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: path %q holds NUL", ErrBadRequest, p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return fmt.Errorf("%w: path %q climbs with \"..\"", ErrBadRequest, p)
		}
	}
	return nil
}
