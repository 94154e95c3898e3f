package fs

import (
	"os"
	"path"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The namespace operations below are shared by the FUSE views and the Go
// API. Each runs with s.mu held for writing, checks everything first,
// logs records and commits them (see commit.go) before it tells anyone,
// so a refused operation, or one the journal could not take, changes
// nothing.

func now() int64 { return time.Now().UnixNano() }

// mknod creates a file, directory, symlink or special file named name in dir.
func (s *Store) mknod(origin *View, sess *session, dir uint64, name string, mode, uid, gid, rdev uint32, target string) (uint64, *node, syscall.Errno) {
	d := sess.t.get(dir)
	if d == nil {
		return 0, nil, syscall.ENOENT
	}
	if !d.isDir() {
		return 0, nil, syscall.ENOTDIR
	}
	if e := nameErrno(name); e != 0 {
		return 0, nil, e
	}
	if _, ok := d.entries.Get(name); ok {
		return 0, nil, syscall.EEXIST
	}
	if q := sess.quota.Inodes; q > 0 && sess.t.files()+1 > q {
		return 0, nil, syscall.EDQUOT
	}
	t := now()
	n := &node{mode: mode, uid: uid, gid: gid, nlink: 1, rdev: rdev, atime: t, mtime: t, ctime: t, target: target}
	if n.isDir() {
		n.nlink, n.parent, n.dname, n.entries = 2, dir, name, emptyEntries
	}
	if mode&syscall.S_IFMT == syscall.S_IFLNK {
		n.size = int64(len(target))
	}
	ino := sess.t.next
	s.log(&record{op: opPut, sess: sess.name, ino: ino, n: n})
	s.log(&record{op: opEntry, sess: sess.name, ino: dir, name: name, child: ino})
	s.touchDir(sess, dir, t, nlinkDelta(n))
	if e := s.commit(); e != 0 {
		return 0, nil, e
	}
	s.changed(origin, sess, dir, name, OpCreated, "")
	return ino, n, 0
}

// nameErrno is validName for FUSE callers: ENAMETOOLONG for long names,
// as every Linux filesystem says, EINVAL for the rest.
func nameErrno(name string) syscall.Errno {
	if len(name) > MaxNameLen {
		return syscall.ENAMETOOLONG
	}
	if validName(name) != nil {
		return syscall.EINVAL
	}
	return 0
}

func nlinkDelta(n *node) int {
	if n.isDir() {
		return 1
	}
	return 0
}

// touchDir sets a directory's mtime and ctime to t and changes its link
// count by delta (subdirectories' "..").
func (s *Store) touchDir(sess *session, dir uint64, t int64, delta int) {
	d := sess.t.get(dir).clone()
	d.mtime, d.ctime = t, t
	d.nlink = uint32(int(d.nlink) + delta)
	s.log(&record{op: opPut, sess: sess.name, ino: dir, n: d})
}

// unlink removes a name that is not a directory.
func (s *Store) unlink(origin *View, sess *session, dir uint64, name string) syscall.Errno {
	ino, n := sess.t.lookup(dir, name)
	if n == nil {
		return syscall.ENOENT
	}
	if n.isDir() {
		return syscall.EISDIR
	}
	t := now()
	s.freeing = true
	s.log(&record{op: opEntry, sess: sess.name, ino: dir, name: name})
	s.dropLink(sess, ino, t)
	s.touchDir(sess, dir, t, 0)
	if e := s.commit(); e != 0 {
		return e
	}
	s.changed(origin, sess, dir, name, OpRemoved, "")
	return 0
}

// dropLink lowers ino's link count. At zero the inode goes, unless a
// handle still has it open: then it stays, unnamed, until the last close.
func (s *Store) dropLink(sess *session, ino uint64, t int64) {
	n := sess.t.get(ino).clone()
	n.nlink--
	n.ctime = t
	if n.nlink == 0 && sess.open[ino] == 0 {
		s.dropInode(sess, ino, n)
		return
	}
	s.log(&record{op: opPut, sess: sess.name, ino: ino, n: n})
}

func (s *Store) dropInode(sess *session, ino uint64, n *node) {
	s.log(&record{op: opDrop, sess: sess.name, ino: ino})
	if n.blob != 0 && n.birth > sess.shared {
		s.deletes = append(s.deletes, n.blob) // no snapshot holds it
	}
}

// rmdir removes an empty directory.
func (s *Store) rmdir(origin *View, sess *session, dir uint64, name string) syscall.Errno {
	ino, n := sess.t.lookup(dir, name)
	if n == nil {
		return syscall.ENOENT
	}
	if !n.isDir() {
		return syscall.ENOTDIR
	}
	if n.entries.Len() > 0 {
		return syscall.ENOTEMPTY
	}
	t := now()
	s.freeing = true
	s.log(&record{op: opEntry, sess: sess.name, ino: dir, name: name})
	s.log(&record{op: opDrop, sess: sess.name, ino: ino})
	s.touchDir(sess, dir, t, -1)
	if e := s.commit(); e != 0 {
		return e
	}
	s.changed(origin, sess, dir, name, OpRemoved, "")
	return 0
}

// isAncestor reports whether dir a is dir b or one of b's ancestors.
func isAncestor(t *tree, a, b uint64) bool {
	for {
		if a == b {
			return true
		}
		if b == rootIno {
			return false
		}
		n := t.get(b)
		if n == nil {
			return false
		}
		b = n.parent
	}
}

// rename moves dir/name to newdir/newname, replacing a compatible target
// (or swapping both with exchange).
func (s *Store) rename(origin *View, sess *session, dir uint64, name string, newdir uint64, newname string, flags uint32) syscall.Errno {
	ino, n := sess.t.lookup(dir, name)
	if n == nil {
		return syscall.ENOENT
	}
	nd := sess.t.get(newdir)
	if nd == nil || !nd.isDir() {
		return syscall.ENOTDIR
	}
	if e := nameErrno(newname); e != 0 {
		return e
	}
	if n.isDir() && isAncestor(&sess.t, ino, newdir) {
		return syscall.EINVAL
	}
	tino, tn := sess.t.lookup(newdir, newname)
	if tino == ino {
		return 0
	}
	const noReplace, exchange = 1, 2 // RENAME_NOREPLACE, RENAME_EXCHANGE
	if flags&noReplace != 0 && tn != nil {
		return syscall.EEXIST
	}
	if flags&exchange != 0 {
		if tn == nil {
			return syscall.ENOENT
		}
		if tn.isDir() && isAncestor(&sess.t, tino, dir) {
			return syscall.EINVAL
		}
		return s.exchange(origin, sess, dir, name, ino, newdir, newname, tino)
	}
	if tn != nil {
		switch {
		case n.isDir() && !tn.isDir():
			return syscall.ENOTDIR
		case !n.isDir() && tn.isDir():
			return syscall.EISDIR
		case tn.isDir() && tn.entries.Len() > 0:
			return syscall.ENOTEMPTY
		}
	}
	t := now()
	if tn != nil {
		s.freeing = true // replacing a file frees it
		if tn.isDir() {
			s.log(&record{op: opDrop, sess: sess.name, ino: tino})
			s.touchDir(sess, newdir, t, -1)
		} else {
			s.dropLink(sess, tino, t)
		}
	}
	s.log(&record{op: opEntry, sess: sess.name, ino: dir, name: name})
	s.log(&record{op: opEntry, sess: sess.name, ino: newdir, name: newname, child: ino})
	moved := sess.t.get(ino).clone()
	moved.ctime = t
	delta := 0
	if moved.isDir() {
		moved.parent, moved.dname = newdir, newname
		if dir != newdir {
			delta = 1
		}
	}
	s.log(&record{op: opPut, sess: sess.name, ino: ino, n: moved})
	s.touchDir(sess, dir, t, -delta)
	s.touchDir(sess, newdir, t, delta)
	if e := s.commit(); e != 0 {
		return e
	}
	s.changed(origin, sess, newdir, newname, OpRenamed, s.relPath(sess, dir, name))
	s.changed(origin, sess, dir, name, "", "")
	return 0
}

func (s *Store) exchange(origin *View, sess *session, dir uint64, name string, ino, newdir uint64, newname string, tino uint64) syscall.Errno {
	t := now()
	s.log(&record{op: opEntry, sess: sess.name, ino: dir, name: name, child: tino})
	s.log(&record{op: opEntry, sess: sess.name, ino: newdir, name: newname, child: ino})
	for _, m := range []struct {
		ino, dir uint64
		name     string
	}{{ino, newdir, newname}, {tino, dir, name}} {
		n := sess.t.get(m.ino).clone()
		n.ctime = t
		if n.isDir() {
			n.parent, n.dname = m.dir, m.name
		}
		s.log(&record{op: opPut, sess: sess.name, ino: m.ino, n: n})
	}
	a, b := sess.t.get(ino), sess.t.get(tino)
	if dir != newdir && a.isDir() != b.isDir() {
		d := 1
		if a.isDir() {
			d = -1
		}
		s.touchDir(sess, dir, t, d)
		s.touchDir(sess, newdir, t, -d)
	} else {
		s.touchDir(sess, dir, t, 0)
		s.touchDir(sess, newdir, t, 0)
	}
	if e := s.commit(); e != 0 {
		return e
	}
	s.changed(origin, sess, newdir, newname, OpRenamed, s.relPath(sess, dir, name))
	s.changed(origin, sess, dir, name, OpRenamed, s.relPath(sess, newdir, newname))
	return 0
}

// link adds a hard link to a file that is not a directory.
func (s *Store) link(origin *View, sess *session, ino, newdir uint64, newname string) (*node, syscall.Errno) {
	n := sess.t.get(ino)
	if n == nil {
		return nil, syscall.ENOENT
	}
	if n.isDir() {
		return nil, syscall.EPERM
	}
	d := sess.t.get(newdir)
	if d == nil || !d.isDir() {
		return nil, syscall.ENOTDIR
	}
	if e := nameErrno(newname); e != 0 {
		return nil, e
	}
	if _, ok := d.entries.Get(newname); ok {
		return nil, syscall.EEXIST
	}
	t := now()
	c := n.clone()
	c.nlink++
	c.ctime = t
	s.log(&record{op: opPut, sess: sess.name, ino: ino, n: c})
	s.log(&record{op: opEntry, sess: sess.name, ino: newdir, name: newname, child: ino})
	s.touchDir(sess, newdir, t, 0)
	if e := s.commit(); e != 0 {
		return nil, e
	}
	s.changed(origin, sess, newdir, newname, OpCreated, "")
	return c, 0
}

// attrChange is a setattr request in the store's terms.
type attrChange struct {
	mode     *uint32
	uid, gid *uint32
	size     *int64
	atime    *int64
	mtime    *int64
}

// setattr changes a node's attributes; a size change truncates its blob,
// copying the blob first if a snapshot shares it.
func (s *Store) setattr(origin *View, sess *session, ino uint64, ch attrChange) (*node, syscall.Errno) {
	n := sess.t.get(ino)
	if n == nil {
		return nil, syscall.ENOENT
	}
	c := n.clone()
	if ch.size != nil {
		if !n.isRegular() {
			return nil, syscall.EINVAL
		}
		if q := sess.quota.Bytes; q > 0 && *ch.size > n.size && sess.t.bytes+*ch.size-n.size > q {
			return nil, syscall.EDQUOT
		}
		var errno syscall.Errno
		c, errno = s.ownBlob(sess, ino, *ch.size == 0)
		s.dropFresh()
		if errno != 0 {
			s.abort()
			return nil, errno
		}
		c = c.clone()
		c.size = *ch.size
		c.mtime = now()
		if c.size < n.size {
			s.freeing = true
		}
	}
	if ch.mode != nil {
		c.mode = n.mode&syscall.S_IFMT | *ch.mode&^uint32(syscall.S_IFMT)
	}
	if ch.uid != nil {
		c.uid = *ch.uid
	}
	if ch.gid != nil {
		c.gid = *ch.gid
	}
	if ch.atime != nil {
		c.atime = *ch.atime
	}
	if ch.mtime != nil {
		c.mtime = *ch.mtime
	}
	c.ctime = now()
	s.log(&record{op: opPut, sess: sess.name, ino: ino, n: c})
	if e := s.commit(); e != 0 {
		return nil, e
	}
	// The blob changes only once the journal holds the new size.
	if ch.size != nil {
		if err := os.Truncate(s.blobPath(c.blob), *ch.size); err != nil {
			back := c.clone()
			s.statInto(back)
			s.log(&record{op: opPut, sess: sess.name, ino: ino, n: back})
			s.commit()
			return nil, errnoOf(err)
		}
	}
	// Times set explicitly, and a size change's, go on the blob too (a
	// truncate to the size a blob has already does not date it). A
	// writer's release takes the mtime from the blob (passthrough writes
	// change it without telling the store), and the kernel sends the
	// release after close(2) has returned, so a release handled after
	// these times were set would otherwise put the write's time back
	// (cp -p, tar: write, close, set the times). A later write moves the
	// blob's mtime again, and the release takes that. Should this fail,
	// the journal still holds the times set.
	if (ch.mtime != nil || ch.size != nil) && c.isRegular() && c.blob != 0 {
		unix.UtimesNanoAt(unix.AT_FDCWD, s.blobPath(c.blob),
			[]unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(c.mtime)}, 0)
	}
	s.changedInode(origin, sess, ino)
	if c.isDir() && searchable(n) && !searchable(c) {
		s.changedSearch(sess, ino, c)
	}
	return c, 0
}

// changedSearch tells every view, the one that made the change too, to
// drop the cached entries of directory ino, which not everyone may search
// any more: the kernel checks no search permission on an entry it has
// (see perm.go). Cost: one notice per entry and view.
func (s *Store) changedSearch(sess *session, ino uint64, d *node) {
	if d.entries == nil {
		return
	}
	for _, v := range s.views {
		it := d.entries.Iterator()
		for !it.Done() {
			name, _, _ := it.Next()
			v.enqueue(notice{sess: sess, gen: sess.gen, ino: ino, name: name})
		}
	}
}

// ownBlob makes sure ino has a blob of its own that no snapshot or other
// session shares, and returns the node as it now is. With empty the old
// content is not needed (O_TRUNC, truncate to 0).
//
// A shared blob that nobody has open is copied for the live tree. One that
// is open stays with the live tree, since open handles and the kernel's
// passthrough file pin it, and the other holders get the copy instead.
func (s *Store) ownBlob(sess *session, ino uint64, empty bool) (*node, syscall.Errno) {
	n := sess.t.get(ino)
	if n.blob != 0 && n.birth > sess.shared {
		return n, 0
	}
	if n.blob != 0 && sess.open[ino] > 0 {
		if err := s.detachShared(sess, ino, n.blob); err != nil {
			return nil, errnoOf(err)
		}
		c := n.clone()
		c.birth = s.epoch
		s.statInto(c)
		s.log(&record{op: opPut, sess: sess.name, ino: ino, n: c})
		return c, 0
	}
	c := n.clone()
	if n.blob == 0 || empty {
		id, f, err := s.newBlob()
		if err == nil {
			// A writer's release takes the mtime from the blob, which
			// is dated when it was made or emptied for reuse, not when
			// the file was: date it as the file, so a file created or
			// emptied and closed unwritten keeps its own time.
			if err = setMtime(f.Fd(), c.mtime); err != nil {
				f.Close()
			}
		}
		if err != nil {
			return nil, errnoOf(err)
		}
		s.fresh = f // the caller about to open it may take it
		c.blob, c.size = id, 0
	} else {
		id, err := s.copyOf(n.blob)
		if err != nil {
			return nil, errnoOf(err)
		}
		c.blob = id
	}
	c.birth = s.epoch
	s.log(&record{op: opPut, sess: sess.name, ino: ino, n: c})
	return c, 0
}

// takeFresh returns the descriptor of the blob ownBlob just made, if it
// is blob, saving an open; the caller holds s.mu.
func (s *Store) takeFresh(blob uint64) *os.File {
	f := s.fresh
	s.fresh = nil
	if f != nil && f.Name() != s.blobPath(blob) {
		f.Close()
		return nil
	}
	return f
}

// dropFresh closes a descriptor ownBlob left that nobody took.
func (s *Store) dropFresh() {
	if s.fresh != nil {
		s.fresh.Close()
		s.fresh = nil
	}
}

// statFrom is statInto through f, a descriptor of n's blob, if not nil.
func (s *Store) statFrom(n *node, f *os.File) {
	var st syscall.Stat_t
	if f == nil || syscall.Fstat(int(f.Fd()), &st) != nil {
		s.statInto(n)
		return
	}
	n.size, n.mtime = st.Size, st.Mtim.Nano()
}

// statInto sets n's size and mtime from its blob, which passthrough
// writers change without telling the store.
func (s *Store) statInto(n *node) {
	var st syscall.Stat_t
	if syscall.Stat(s.blobPath(n.blob), &st) == nil {
		n.size, n.mtime = st.Size, st.Mtim.Nano()
	}
}

// newBlob makes an empty blob file. The caller holds s.mu.
// It takes one from the pool that blobMaker keeps filled, so that creating
// a file does not wait for the backing filesystem to create one.
func (s *Store) newBlob() (uint64, *os.File, error) {
	if n := len(s.pool); n > 0 {
		id := s.pool[n-1]
		s.pool = s.pool[:n-1]
		delete(s.reserved, id)
		if n <= poolLow {
			s.wakeMaker()
		}
		f, err := openBlobFile(s.blobPath(id), os.O_RDWR, 0)
		return id, f, err
	}
	s.wakeMaker()
	id := s.nextBlob
	s.nextBlob++
	f, err := openBlobFile(s.blobPath(id), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	return id, f, err
}

// The blob pool: empty blob files made ahead of need (opening one is
// much cheaper than creating one), and the emptied blobs of deleted files
// (see recycle). They stay on disk across a restart, unreferenced, and
// Open adopts them again.
const (
	poolSize = 256
	poolLow  = 128
)

func (s *Store) wakeMaker() {
	select {
	case s.makeMore <- struct{}{}:
	default:
	}
}

// blobMaker refills the pool whenever it runs low.
func (s *Store) blobMaker() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case <-s.makeMore:
		}
		for {
			s.mu.Lock()
			if s.closed || len(s.pool) >= poolSize {
				s.mu.Unlock()
				break
			}
			id := s.reserve()
			s.mu.Unlock()
			f, err := openBlobFile(s.blobPath(id), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
			if err != nil {
				s.mu.Lock()
				delete(s.reserved, id)
				s.mu.Unlock()
				break // newBlob reports the error when it makes one itself
			}
			f.Close()
			s.mu.Lock()
			s.pool = append(s.pool, id)
			s.mu.Unlock()
		}
	}
}

// reserve takes a blob id for a blob made outside the lock, which garbage
// collection leaves alone until release. The caller holds s.mu.
func (s *Store) reserve() uint64 {
	id := s.nextBlob
	s.nextBlob++
	s.reserved[id] = true
	return id
}

// copyOf makes a new blob with the content of blob: a clone where the
// backing filesystem supports it. The caller holds s.mu.
func (s *Store) copyOf(blob uint64) (uint64, error) {
	id := s.nextBlob
	s.nextBlob++
	return id, s.copyInto(id, blob)
}

// copyInto makes blob id a copy of blob src; on failure nothing is left.
func (s *Store) copyInto(id, src uint64) error {
	dst, err := os.OpenFile(s.blobPath(id), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer dst.Close()
	in, err := os.Open(s.blobPath(src))
	if err == nil {
		err = copyBlob(dst, in, s.reflink)
		// The copy is dated as its source: the mtime of the file a
		// writer opened and did not write stays (a release takes it
		// from the blob), and so does a snapshot's.
		var st unix.Stat_t
		if err == nil {
			err = unix.Fstat(int(in.Fd()), &st)
		}
		if err == nil {
			err = setMtime(dst.Fd(), st.Mtim.Nano())
		}
		in.Close()
	}
	if err != nil {
		os.Remove(dst.Name())
	}
	return err
}

// detachShared gives every holder of blob at ino other than sess's live
// tree (snapshots, sessions branched from them) one copy of it, so sess
// may go on writing blob in place. It costs one copy plus a look at ino in
// each session and snapshot, whatever their size.
func (s *Store) detachShared(sess *session, ino, blob uint64) error {
	var copyID uint64
	repoint := func(r *record, t *tree) error {
		n := t.get(ino)
		if n == nil || n.blob != blob {
			return nil
		}
		if copyID == 0 {
			id, err := s.copyOf(blob)
			if err != nil {
				return err
			}
			copyID = id
		}
		c := n.clone()
		c.blob = copyID
		s.statInto(c) // passthrough writers may have changed the size
		r.ino, r.n = ino, c
		s.log(r)
		return nil
	}
	for _, other := range s.sessions {
		if other == sess {
			continue
		}
		if err := repoint(&record{op: opPut, sess: other.name}, &other.t); err != nil {
			return err
		}
	}
	for _, sn := range s.snaps {
		for name, st := range sn.trees {
			if err := repoint(&record{op: opPut, sess: name, snap: sn.key.String()}, &st.t); err != nil {
				return err
			}
		}
	}
	return nil
}

// relPath is the path of dir/name relative to the session directory.
func (s *Store) relPath(sess *session, dir uint64, name string) string {
	parts := []string{name}
	for dir != rootIno {
		d := sess.t.get(dir)
		if d == nil {
			break
		}
		parts = append(parts, d.dname)
		dir = d.parent
	}
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return path.Join(parts...)
}

// changed publishes a file event (when op is set) and tells every view but
// origin to forget its cached entry dir/name.
func (s *Store) changed(origin *View, sess *session, dir uint64, name string, op EventOp, old string) {
	if op != "" {
		s.events.publish(Event{Session: sess.name, Path: s.relPath(sess, dir, name), OldPath: old, Op: op})
	}
	for _, v := range s.views {
		if v != origin {
			v.enqueue(notice{sess: sess, gen: sess.gen, ino: dir, name: name})
		}
	}
	s.changedInode(origin, sess, dir)
}

// changedInode tells every view but origin to drop cached attributes and
// data of ino.
func (s *Store) changedInode(origin *View, sess *session, ino uint64) {
	for _, v := range s.views {
		if v != origin {
			v.enqueue(notice{sess: sess, gen: sess.gen, ino: ino, inode: true})
		}
	}
}

// changedSession tells every view that a session directory appeared,
// disappeared or was replaced.
func (s *Store) changedSession(name string) {
	for _, v := range s.views {
		v.enqueue(notice{root: true, name: name})
	}
}

func errnoOf(err error) syscall.Errno {
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
