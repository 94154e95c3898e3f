package fs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Owner is the user that owns a new session's directories.
type Owner struct{ UID, GID uint32 }

// SessionInfo describes one session.
type SessionInfo struct {
	ID      string
	Created time.Time
	Files   int64 // inodes in the live tree, the session directory included
	Bytes   int64
	Quota   Quota
}

// SnapshotInfo describes one snapshot. Session is "" for a snapshot of the
// whole tree.
type SnapshotInfo struct {
	Session  string
	Name     string
	Created  time.Time
	Sessions []string
	Files    int64
	Bytes    int64 // logical size of the files it holds
	Shared   int64 // bytes of blobs also used by a live tree or another snapshot
	Unique   int64 // bytes that deleting the snapshot would free
}

// errOf turns an errno from a namespace operation into an API error.
func errOf(op string, e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	var base error = e
	switch e {
	case syscall.ENOENT:
		base = ErrNotFound
	case syscall.EEXIST:
		base = ErrExists
	case syscall.EDQUOT, syscall.ENOSPC:
		base = ErrQuota
	case syscall.ENOTDIR:
		base = ErrNotDir
	case syscall.EISDIR:
		base = ErrIsDir
	case syscall.ENOTEMPTY:
		base = ErrNotEmpty
	case syscall.EINVAL, syscall.ENAMETOOLONG:
		base = ErrBadName
	}
	return fmt.Errorf("%s: %w", op, base)
}

// sessionLocked returns the live session id; the caller holds s.mu.
func (s *Store) sessionLocked(id string) (*session, error) {
	if s.closed {
		return nil, ErrClosed
	}
	sess := s.sessions[id]
	if sess == nil {
		return nil, fmt.Errorf("session %q: %w", id, ErrNotFound)
	}
	return sess, nil
}

// CreateSession makes session id with inputs/, outputs/ and a private
// .home/, all owned by owner.
func (s *Store) CreateSession(id string, owner Owner) error {
	if err := ValidateID("session", id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.sessions[id] != nil {
		return fmt.Errorf("create session %q: %w", id, ErrExists)
	}
	t := now()
	end := s.batch()
	s.log(&record{op: opSession, sess: id, time: t})
	sess := s.sessions[id]
	root := sess.t.get(rootIno).clone()
	root.uid, root.gid = owner.UID, owner.GID
	s.log(&record{op: opPut, sess: id, ino: rootIno, n: root})
	for _, d := range []string{InputsDir, OutputsDir, HomeDir} {
		mode := uint32(syscall.S_IFDIR | 0o755)
		if d == HomeDir {
			mode = syscall.S_IFDIR | 0o700
		}
		s.mknod(nil, sess, rootIno, d, mode, owner.UID, owner.GID, 0, "")
	}
	if e := end(true); e != 0 {
		return s.journalErr("create session "+id, e)
	}
	s.changedSession(id)
	return nil
}

// Sessions lists the live sessions by id.
func (s *Store) Sessions() []SessionInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]SessionInfo, 0, len(s.sessions))
	for _, sess := range s.sessions {
		out = append(out, SessionInfo{ID: sess.name, Created: time.Unix(0, sess.created),
			Files: sess.t.files(), Bytes: sess.t.bytes, Quota: sess.quota})
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return cmpString(a.ID, b.ID) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// RenameSession renames a session and its snapshots.
func (s *Store) RenameSession(id, newID string) error {
	if err := ValidateID("session", newID); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.sessionLocked(id); err != nil {
		return fmt.Errorf("rename session: %w", err)
	}
	if s.sessions[newID] != nil {
		return fmt.Errorf("rename session %q to %q: %w", id, newID, ErrExists)
	}
	s.log(&record{op: opSessionRename, sess: id, name: newID})
	if e := s.commit(); e != 0 {
		return s.journalErr("rename session "+id, e)
	}
	s.changedSession(id)
	s.changedSession(newID)
	return nil
}

// DeleteSession removes a session with its snapshots. Whole-tree
// snapshots keep their copy of it.
func (s *Store) DeleteSession(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.sessionLocked(id); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	s.freeing = true
	s.log(&record{op: opSessionDelete, sess: id})
	if e := s.commit(); e != 0 {
		return s.journalErr("delete session "+id, e)
	}
	s.changedSession(id)
	return nil
}

// SetQuota sets a session's limits. Usage already over a new limit stays;
// only growth is refused.
func (s *Store) SetQuota(id string, q Quota) error {
	if q.Bytes < 0 || q.Inodes < 0 {
		return fmt.Errorf("set quota of %q: limits must not be negative", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return fmt.Errorf("set quota: %w", err)
	}
	if (q.Bytes > 0) != (sess.quota.Bytes > 0) {
		// Sessions with a byte quota use another data path (see View), and
		// handles already open keep theirs.
		for _, n := range sess.open {
			if n > 0 {
				return fmt.Errorf("set quota of %q: %w: files are open; set or clear the byte quota while the session's machine is stopped", id, ErrBusy)
			}
		}
	}
	s.log(&record{op: opQuota, sess: id, a: uint64(q.Bytes), b: uint64(q.Inodes)})
	return s.journalErr("set quota of "+id, s.commit())
}

// Snapshot takes snapshot name of session id (id "" snapshots the whole
// tree). It costs the same whatever the session holds: the trees are
// shared, and only files open for writing at that moment are copied (or
// cloned), since their writers keep writing in place.
func (s *Store) Snapshot(id, name string) error {
	if err := ValidateID("snapshot", name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if id != "" {
		if _, err := s.sessionLocked(id); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	key := snapKey{id, name}
	if s.snaps[key] != nil {
		return fmt.Errorf("snapshot %q of %q: %w", name, id, ErrExists)
	}
	s.log(&record{op: opSnapshot, sess: id, name: name, time: now()})
	// Writers keep writing their blobs in place: the snapshot gets copies.
	for sessName := range s.snaps[key].trees {
		sess := s.sessions[sessName]
		for ino, n := range sess.writers {
			if n > 0 {
				_, e := s.ownBlob(sess, ino, false)
				s.dropFresh()
				if e != 0 {
					s.abort() // no snapshot without its copies
					return errOf(fmt.Sprintf("snapshot %q of %q", name, id), e)
				}
			}
		}
	}
	return s.journalErr(fmt.Sprintf("snapshot %q of %q", name, id), s.commit())
}

// Snapshots lists the snapshots of session id ("" lists whole-tree ones),
// oldest first, with the bytes they share and hold alone.
func (s *Store) Snapshots(id string) ([]SnapshotInfo, error) {
	s.mu.RLock()
	if id != "" {
		if _, err := s.sessionLocked(id); err != nil {
			s.mu.RUnlock()
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
	}
	c := s.captureLocked()
	s.mu.RUnlock()

	// Count, for every blob, how many trees (live or frozen) hold it.
	refs := map[uint64]int{}
	count := func(t tree) {
		seen := map[uint64]bool{}
		t.blobs(func(b uint64, _ int64) {
			if !seen[b] {
				seen[b] = true
				refs[b]++
			}
		})
	}
	for _, sess := range c.sessions {
		count(sess.t)
	}
	var out []SnapshotInfo
	for _, sn := range c.snaps {
		for _, st := range sn.trees {
			count(st.t)
		}
	}
	for _, sn := range c.snaps {
		if sn.key.scope != id {
			continue
		}
		info := SnapshotInfo{Session: id, Name: sn.key.name, Created: time.Unix(0, sn.created)}
		seen := map[uint64]bool{}
		for name, st := range sn.trees {
			info.Sessions = append(info.Sessions, name)
			info.Files += st.t.files()
			info.Bytes += st.t.bytes
			st.t.blobs(func(b uint64, size int64) {
				if seen[b] {
					return
				}
				seen[b] = true
				if refs[b] > 1 {
					info.Shared += size
				} else {
					info.Unique += size
				}
			})
		}
		slices.Sort(info.Sessions)
		out = append(out, info)
	}
	return out, nil
}

// SnapshotName is a snapshot's name and when it was taken.
type SnapshotName struct {
	Name    string
	Created time.Time
}

// SnapshotNames lists the names of session id's snapshots ("" lists
// whole-tree ones), oldest first. Unlike Snapshots it counts no bytes, so
// it costs the number of snapshots, not the files they hold: retention
// calls it after every snapshot it takes.
func (s *Store) SnapshotNames(id string) ([]SnapshotName, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	if id != "" {
		if _, err := s.sessionLocked(id); err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
	}
	var out []SnapshotName
	for k, sn := range s.snaps {
		if k.scope == id {
			out = append(out, SnapshotName{Name: k.name, Created: time.Unix(0, sn.created)})
		}
	}
	slices.SortFunc(out, func(a, b SnapshotName) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

func (s *Store) snapshotLocked(id, name string) (*snapshot, error) {
	if s.closed {
		return nil, ErrClosed
	}
	sn := s.snaps[snapKey{id, name}]
	if sn == nil {
		if id == "" {
			return nil, fmt.Errorf("whole-tree snapshot %q: %w", name, ErrNotFound)
		}
		return nil, fmt.Errorf("snapshot %q of session %q: %w", name, id, ErrNotFound)
	}
	return sn, nil
}

// DeleteSnapshot deletes a snapshot; blobs only it held are freed.
func (s *Store) DeleteSnapshot(id, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.snapshotLocked(id, name); err != nil {
		return fmt.Errorf("delete snapshot: %w", err)
	}
	s.freeing = true
	s.log(&record{op: opSnapshotDelete, sess: id, name: name})
	return s.journalErr(fmt.Sprintf("delete snapshot %q of %q", name, id), s.commit())
}

// Restore rolls session id back to its snapshot name (id "" rolls the whole
// tree back: sessions made since are removed, removed ones come back). It
// costs the same whatever the session holds. Files still open keep what
// they had open; new opens see the restored tree.
func (s *Store) Restore(id, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.snapshotLocked(id, name)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	before := make([]string, 0, len(s.sessions))
	for n := range s.sessions {
		before = append(before, n)
	}
	s.log(&record{op: opRestore, sess: id, name: name})
	if e := s.commit(); e != 0 {
		return s.journalErr(fmt.Sprintf("restore %q to %q", id, name), e)
	}
	for n := range sn.trees {
		before = append(before, n)
	}
	for _, n := range before {
		s.changedSession(n)
	}
	return nil
}

// Branch makes a new session newID that starts as session from in snapshot
// name of scope id (id "" for a whole-tree snapshot, else id == from). Data
// is shared until either side writes it.
func (s *Store) Branch(id, name, from, newID string) error {
	if err := ValidateID("session", newID); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.snapshotLocked(id, name)
	if err != nil {
		return fmt.Errorf("branch: %w", err)
	}
	if from == "" {
		from = id
	}
	if sn.trees[from] == nil {
		return fmt.Errorf("branch: snapshot %q holds no session %q: %w", name, from, ErrNotFound)
	}
	if s.sessions[newID] != nil {
		return fmt.Errorf("branch to session %q: %w", newID, ErrExists)
	}
	s.log(&record{op: opBranch, sess: id, name: name, name2: from, snap: newID, time: now()})
	if e := s.commit(); e != 0 {
		return s.journalErr("branch to session "+newID, e)
	}
	s.changedSession(newID)
	return nil
}

// resolve walks path inside session sess without following symbolic links.
// With parent it returns the directory that holds the last component.
func (s *Store) resolve(sess *session, p string, parent bool) (dir uint64, name string, err error) {
	parts, err := splitPath(p)
	if err != nil {
		return 0, "", err
	}
	dir = rootIno
	last := len(parts)
	if parent {
		last--
	}
	for _, c := range parts[:last] {
		ino, n := sess.t.lookup(dir, c)
		switch {
		case n == nil:
			return 0, "", fmt.Errorf("%q: %w", p, ErrNotFound)
		case n.mode&syscall.S_IFMT == syscall.S_IFLNK:
			return 0, "", fmt.Errorf("%q: %w", p, ErrSymlinkInPath)
		case !n.isDir():
			return 0, "", fmt.Errorf("%q: %w", p, ErrNotDir)
		}
		dir = ino
	}
	if parent {
		return dir, parts[last], nil
	}
	return dir, "", nil
}

// MkdirAll makes directory path (and its parents) inside session id.
func (s *Store) MkdirAll(id, p string, owner Owner) error {
	parts, err := splitPath(p)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return err
	}
	dir := uint64(rootIno)
	for _, c := range parts {
		ino, n := sess.t.lookup(dir, c)
		if n == nil {
			var e syscall.Errno
			ino, n, e = s.mknod(nil, sess, dir, c, syscall.S_IFDIR|0o755, owner.UID, owner.GID, 0, "")
			if e != 0 {
				return errOf("mkdir "+p, e)
			}
		}
		if !n.isDir() {
			return fmt.Errorf("mkdir %q: %w", p, ErrNotDir)
		}
		dir = ino
	}
	return nil
}

// WriteFile creates or replaces the file at path in session id with the
// content of r, copying at most limit bytes (0: no limit beyond the
// session's quota). The file appears complete or not at all.
func (s *Store) WriteFile(id, p string, r io.Reader, limit int64, owner Owner) (int64, error) {
	return s.writeFile(id, p, r, limit, owner, true)
}

// writeFile is WriteFile; without durable neither the data nor the
// journal is synced (a caller writing many files syncs once at the end).
func (s *Store) writeFile(id, p string, r io.Reader, limit int64, owner Owner, durable bool) (int64, error) {
	if _, err := splitPath(p); err != nil {
		return 0, err
	}
	// Write the data into a fresh blob first, outside the lock.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, ErrClosed
	}
	blob := s.reserve()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.reserved, blob)
		s.mu.Unlock()
	}()
	f, err := os.OpenFile(s.blobPath(blob), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", p, err)
	}
	src := r
	if limit > 0 {
		src = io.LimitReader(r, limit+1)
	}
	n, err := io.Copy(f, src)
	if err == nil && durable {
		err = f.Sync()
	}
	f.Close()
	if err == nil && limit > 0 && n > limit {
		err = fmt.Errorf("%w: more than %d bytes", ErrQuota, limit)
	}
	if err != nil {
		os.Remove(f.Name())
		return 0, fmt.Errorf("write %s: %w", p, err)
	}
	if err := s.linkBlob(id, p, blob, n, owner, durable); err != nil {
		os.Remove(f.Name())
		return 0, err
	}
	return n, nil
}

// linkBlob puts a finished blob in the tree at path, replacing a file.
func (s *Store) linkBlob(id, p string, blob uint64, size int64, owner Owner, durable bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	dir, name, err := s.resolve(sess, p, true)
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	_, old := sess.t.lookup(dir, name)
	if old != nil && !old.isRegular() {
		return fmt.Errorf("write %s: %w", p, ErrExists)
	}
	var freed int64
	if old != nil && old.nlink == 1 {
		freed = old.size // replaced, so it does not count against the quota
	}
	if q := sess.quota.Bytes; q > 0 && sess.t.bytes-freed+size > q {
		return fmt.Errorf("write %s: %w: session %q may hold %d bytes", p, ErrQuota, id, q)
	}
	end := s.batch() // the old file goes only if the new one comes
	if old != nil {
		if e := s.unlink(nil, sess, dir, name); e != 0 {
			end(false)
			return errOf("write "+p, e)
		}
	}
	ino, n, e := s.mknod(nil, sess, dir, name, syscall.S_IFREG|0o644, owner.UID, owner.GID, 0, "")
	if e != 0 {
		end(false)
		return errOf("write "+p, e)
	}
	c := n.clone()
	c.blob, c.birth, c.size = blob, s.epoch, size
	s.log(&record{op: opPut, sess: id, ino: ino, n: c})
	if e := end(true); e != 0 {
		return s.journalErr("write "+p, e)
	}
	s.events.publish(Event{Session: id, Path: s.relPath(sess, dir, name), Op: OpWritten})
	s.changedInode(nil, sess, ino)
	if !durable {
		return nil
	}
	return s.syncLocked()
}

// syncLocked flushes the journal to the OS; the caller holds s.mu.
func (s *Store) syncLocked() error {
	if err := s.j.flush(); err != nil {
		return err
	}
	return s.j.f.Sync()
}

// ReadFile returns the content of the file at path in session id, or of
// the same path in snapshot snap when snap is set (the session's own
// snapshot of that name, else a whole-tree one). It reads at most limit
// bytes (0: all).
func (s *Store) ReadFile(id, snap, p string, limit int64) ([]byte, error) {
	s.mu.RLock()
	var t tree
	if snap == "" {
		sess, err := s.sessionLocked(id)
		if err != nil {
			s.mu.RUnlock()
			return nil, err
		}
		t = sess.t
	} else {
		// The session's own snapshot, else a whole-tree one that holds it.
		sn, err := s.snapshotLocked(id, snap)
		if err != nil {
			sn, _ = s.snapshotLocked("", snap)
		}
		if sn == nil || sn.trees[id] == nil {
			s.mu.RUnlock()
			if err == nil {
				err = fmt.Errorf("snapshot %q holds no session %q: %w", snap, id, ErrNotFound)
			}
			return nil, err
		}
		t = sn.trees[id].t
	}
	s.mu.RUnlock()
	tmp := &session{name: id, t: t}
	dir, name, err := s.resolve(tmp, p, true)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	_, n := t.lookup(dir, name)
	switch {
	case n == nil:
		return nil, fmt.Errorf("read %s: %w", p, ErrNotFound)
	case n.isDir():
		return nil, fmt.Errorf("read %s: %w", p, ErrIsDir)
	case !n.isRegular():
		return nil, fmt.Errorf("read %s: %w", p, ErrSymlinkInPath)
	case n.blob == 0:
		return nil, nil
	}
	f, err := os.Open(s.blobPath(n.blob))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	var rd io.Reader = f
	if limit > 0 {
		rd = io.LimitReader(f, limit)
	}
	return io.ReadAll(rd)
}

// IsNotFound reports whether err means a session, snapshot or file is missing.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// RemoveAll removes path in session id and everything under it. It never
// follows a symbolic link: one on the way is an error, one at the end is
// removed itself. A missing path is not an error.
func (s *Store) RemoveAll(id, p string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	dir, name, err := s.resolve(sess, p, true)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if e := s.removeAll(sess, dir, name); e != 0 && e != syscall.ENOENT {
		return errOf("remove "+p, e)
	}
	return nil
}

// removeAll removes dir/name and, for a directory, what it holds; the
// caller holds s.mu.
func (s *Store) removeAll(sess *session, dir uint64, name string) syscall.Errno {
	ino, n := sess.t.lookup(dir, name)
	if n == nil {
		return syscall.ENOENT
	}
	if !n.isDir() {
		return s.unlink(nil, sess, dir, name)
	}
	var names []string
	for it := n.entries.Iterator(); !it.Done(); {
		child, _, _ := it.Next()
		names = append(names, child)
	}
	for _, child := range names {
		if e := s.removeAll(sess, ino, child); e != 0 && e != syscall.ENOENT {
			return e
		}
	}
	return s.rmdir(nil, sess, dir, name)
}

// Chmod sets the permission bits of path in session id, not following a
// symbolic link anywhere in it.
func (s *Store) Chmod(id, p string, mode os.FileMode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	dir, name, err := s.resolve(sess, p, true)
	if err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	ino, n := sess.t.lookup(dir, name)
	switch {
	case n == nil:
		return fmt.Errorf("chmod %q: %w", p, ErrNotFound)
	case n.mode&syscall.S_IFMT == syscall.S_IFLNK:
		return fmt.Errorf("chmod %q: %w", p, ErrSymlinkInPath)
	}
	m := uint32(mode.Perm())
	if _, e := s.setattr(nil, sess, ino, attrChange{mode: &m}); e != 0 {
		return errOf("chmod "+p, e)
	}
	return nil
}
