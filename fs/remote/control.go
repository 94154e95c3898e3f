package remote

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"golang.org/x/crypto/ssh"

	"hearth/fs"
)

// controlIdle bounds how long a control channel may sit before its
// request arrives, so an idle node holds no goroutine forever.
const controlIdle = time.Minute

// serveControl answers one request on ch. It runs on the serving node, as
// the store's own Go API: every path is checked here (checkPath) and
// again by the store, which follows no symbolic link.
func (s *Server) serveControl(ch ssh.Channel) {
	defer ch.Close()
	timer := time.AfterFunc(controlIdle, func() { ch.Close() })
	b, err := readFrame(ch, maxRequestFrame)
	timer.Stop()
	if err != nil {
		if !errors.Is(err, io.EOF) {
			s.reply(ch, fmt.Errorf("%w: %w", ErrBadRequest, err), answer{})
		}
		return
	}
	req, err := decodeRequest(b)
	if err != nil {
		s.reply(ch, err, answer{})
		return
	}
	a, err := s.do(req, idleReader{ch: ch})
	s.reply(ch, err, a)
}

// idleReader closes the channel when a read waits longer than
// controlIdle: a node that stops sending a write's data midway does not
// hold the write (and its goroutines) open.
type idleReader struct{ ch ssh.Channel }

func (r idleReader) Read(b []byte) (int, error) {
	timer := time.AfterFunc(controlIdle, func() { r.ch.Close() })
	defer timer.Stop()
	return r.ch.Read(b)
}

func (s *Server) reply(ch ssh.Channel, err error, a answer) {
	if err != nil {
		a = answer{Err: err.Error(), Code: codeOf(err)}
	}
	b, _ := json.Marshal(a)
	writeFrame(ch, b)
	ch.CloseWrite()
}

// do runs req against the store; body is where a write's data frames
// come from.
func (s *Server) do(req request, body io.Reader) (answer, error) {
	st := s.cfg.Store
	owner := fs.Owner{UID: req.UID, GID: req.GID}
	switch req.Op {
	case opEnsure:
		return answer{}, s.ensure(req.Session, owner, *req.Quota)
	case opWrite:
		return answer{}, s.write(req, body)
	case opMkdirAll:
		return answer{}, st.MkdirAll(req.Session, req.Path, owner)
	case opRemoveAll:
		return answer{}, st.RemoveAll(req.Session, req.Path)
	case opChmod:
		return answer{}, st.Chmod(req.Session, req.Path, req.Mode)
	case opGlob:
		names, err := st.Glob(req.Session, req.Pattern)
		return answer{Names: names}, err
	case opRead:
		b, err := st.ReadFile(req.Session, "", req.Path, req.Limit)
		return answer{Data: b}, err
	case opRestore:
		return answer{}, st.Restore(req.Session, req.Name)
	case opBranch:
		return answer{}, st.Branch(req.Session, req.Name, req.Session, req.To)
	case opMove:
		return answer{}, st.Move(req.Session, [][2]string{{req.Path, req.To}})
	case opSnapshot:
		return answer{}, st.Snapshot(req.Session, req.Name)
	case opDeleteSnapshot:
		return answer{}, st.DeleteSnapshot(req.Session, req.Name)
	case opSnapshots:
		list, err := st.SnapshotNames(req.Session)
		out := make([]Snapshot, len(list))
		for i, sn := range list {
			out[i] = Snapshot{Name: sn.Name, Created: sn.Created}
		}
		return answer{Snapshots: out}, err
	case opSnapshotHolds:
		list, err := st.SnapshotHolds(req.Session)
		out := make([]Snapshot, len(list))
		for i, h := range list {
			out[i] = Snapshot{Name: h.Name, Created: h.Created, Holds: h.Holds}
		}
		return answer{Snapshots: out}, err
	}
	return answer{}, fmt.Errorf("%w: unknown operation %q", ErrBadRequest, req.Op)
}

// write streams the data frames after req into the store: the file
// appears whole once the empty frame arrives, or not at all.
func (s *Server) write(req request, body io.Reader) error {
	pr, pw := io.Pipe()
	go func() {
		for {
			b, err := readFrame(body, maxDataFrame)
			if err != nil {
				pw.CloseWithError(fmt.Errorf("%w: write %s: %w", ErrBadRequest, req.Path, err))
				return
			}
			if len(b) == 0 {
				pw.Close()
				return
			}
			if _, err := pw.Write(b); err != nil {
				return // the store gave up; its error is the answer
			}
		}
	}()
	_, err := s.cfg.Store.WriteFile(req.Session, req.Path, pr, 0, fs.Owner{UID: req.UID, GID: req.GID})
	pr.CloseWithError(err) // unblocks the reader above if the store stopped early
	return err
}

// ensure makes the session owned by owner with quota q, or gives an
// existing one's directories to owner (a session made through the
// workspace API belongs to root until an agent works in it) and sets
// its quota: what the appliance does for a local workspace.
func (s *Server) ensure(session string, owner fs.Owner, q fs.Quota) error {
	created := s.cfg.Store.CreateSession(session, owner)
	if created != nil && !errors.Is(created, fs.ErrExists) {
		return created
	}
	if err := s.quota(session, q); err != nil {
		return err
	}
	if created == nil {
		return nil
	}
	return s.chownSession(session, owner)
}

func (s *Server) quota(session string, q fs.Quota) error {
	for _, info := range s.cfg.Store.Sessions() {
		if info.ID == session && info.Quota == q {
			return nil
		}
	}
	if err := s.cfg.Store.SetQuota(session, q); err != nil {
		return fmt.Errorf("session %s: %w", session, err)
	}
	return nil
}

// chownSession gives the session's top directories to owner through the
// session's view (the store's Go API has no chown).
func (s *Server) chownSession(session string, owner fs.Owner) error {
	h, release, err := s.views.acquire(viewUser{session: session})
	if err != nil {
		return err
	}
	defer release()
	for _, sub := range []string{"", fs.InputsDir, fs.OutputsDir, fs.HomeDir} {
		p := path.Join(session, sub)
		if err := h.root.Lchown(p, int(owner.UID), int(owner.GID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("give session %s to uid %d: %w", session, owner.UID, err)
		}
	}
	return nil
}
