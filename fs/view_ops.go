package fs

import (
	"slices"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE request handlers. Each resolves the kernel node id, takes the
// store lock, checks that the view may do it, and calls the shared
// namespace operation.

func st(e syscall.Errno) fuse.Status { return fuse.Status(e) }

// at resolves a node id to its live session and inode and locks the store
// (for writing when write is set). On success the caller must call done.
func (v *View) at(nodeid uint64, write bool) (sess *session, ino uint64, done func(), errno syscall.Errno) {
	k, ok := v.key(nodeid)
	if !ok {
		return nil, 0, nil, syscall.ESTALE
	}
	if write {
		v.s.mu.Lock()
		done = func() {
			v.s.finish() // commits what an error path logged and left
			v.s.mu.Unlock()
		}
	} else {
		v.s.mu.RLock()
		done = v.s.mu.RUnlock
	}
	sess, errno = v.live(k)
	if errno == 0 && write && !v.writable(sess) {
		errno = syscall.EROFS
	}
	if errno != 0 {
		done()
		return nil, 0, nil, errno
	}
	return sess, k.ino, done, 0
}

// atNode is at that also returns the inode's node, or ENOENT if it is
// gone.
func (v *View) atNode(nodeid uint64, write bool) (*session, uint64, *node, func(), syscall.Errno) {
	sess, ino, done, errno := v.at(nodeid, write)
	if errno != 0 {
		return nil, 0, nil, nil, errno
	}
	n := sess.t.get(ino)
	if n == nil {
		done()
		return nil, 0, nil, nil, syscall.ENOENT
	}
	return sess, ino, n, done, 0
}

func (v *View) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	defer func() { v.lastLookup.Store(time.Now().UnixNano()) }() // as the answer goes out: see LastLookup
	if len(name) > MaxNameLen {
		return fuse.Status(syscall.ENAMETOOLONG)
	}
	if h.NodeId == fuse.FUSE_ROOT_ID {
		v.s.mu.RLock()
		defer v.s.mu.RUnlock()
		sess := v.s.sessions[name]
		if sess == nil || v.s.closed {
			return fuse.ENOENT
		}
		v.entry(out, sess, 0, "", rootIno, sess.t.get(rootIno))
		return fuse.OK
	}
	sess, dir, d, done, errno := v.atNode(h.NodeId, false)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if e := v.may(v.who(&h.Caller), d, mayExec); e != 0 {
		return st(e)
	}
	ino, n := sess.t.lookup(dir, name)
	if n == nil || v.hidden(sess, dir, name) {
		out.NodeId = 0 // cache the absence; creations elsewhere invalidate it
		if searchable(d) {
			out.SetEntryTimeout(cacheTTL)
		}
		return fuse.ENOENT
	}
	v.entry(out, sess, dir, name, ino, n)
	return fuse.OK
}

func (v *View) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	out.SetTimeout(cacheTTL)
	if in.NodeId == fuse.FUSE_ROOT_ID {
		v.rootAttr(&out.Attr)
		return fuse.OK
	}
	sess, ino, n, done, errno := v.atNode(in.NodeId, false)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	v.fillAttr(&out.Attr, in.NodeId, sess, ino, n)
	return fuse.OK
}

func (v *View) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.NodeId == fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	sess, ino, n, done, errno := v.atNode(in.NodeId, true)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	var ch attrChange
	ch.mode, errno = v.maySetattr(v.who(&in.Caller), n, in)
	if errno != 0 {
		return st(errno)
	}
	if u, ok := in.GetUID(); ok {
		u = v.opts.IDs.in(u)
		ch.uid = &u
	}
	if g, ok := in.GetGID(); ok {
		g = v.opts.IDs.in(g)
		ch.gid = &g
	}
	if sz, ok := in.GetSize(); ok {
		s := int64(sz)
		ch.size = &s
	}
	t := now()
	if in.Valid&fuse.FATTR_ATIME != 0 {
		a := int64(in.Atime)*1e9 + int64(in.Atimensec)
		if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
			a = t
		}
		ch.atime = &a
	}
	if in.Valid&fuse.FATTR_MTIME != 0 {
		m := int64(in.Mtime)*1e9 + int64(in.Mtimensec)
		if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
			m = t
		}
		ch.mtime = &m
	}
	n, errno = v.s.setattr(v, sess, ino, ch)
	if errno != 0 {
		return st(errno)
	}
	v.fillAttr(&out.Attr, in.NodeId, sess, ino, n)
	out.SetTimeout(cacheTTL)
	return fuse.OK
}

// mk is the common part of Mkdir, Mknod and Symlink.
func (v *View) mk(parent uint64, name string, mode uint32, c fuse.Caller, rdev uint32, target string, out *fuse.EntryOut) fuse.Status {
	if parent == fuse.FUSE_ROOT_ID {
		return fuse.EPERM // sessions are made through the API
	}
	sess, dir, done, errno := v.at(parent, true)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if e := v.mayCreate(&c, sess, dir); e != 0 {
		return st(e)
	}
	ino, n, errno := v.s.mknod(v, sess, dir, name, mode, v.opts.IDs.in(c.Uid), v.opts.IDs.in(c.Gid), rdev, target)
	if errno != 0 {
		return st(errno)
	}
	v.entry(out, sess, dir, name, ino, n)
	return fuse.OK
}

func (v *View) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return v.mk(in.NodeId, name, syscall.S_IFDIR|(in.Mode&^in.Umask&0o7777), in.Caller, 0, "", out)
}

func (v *View) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	switch in.Mode & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFIFO, syscall.S_IFSOCK:
	default:
		return fuse.EPERM // no device nodes in a shared workspace
	}
	return v.mk(in.NodeId, name, in.Mode&^in.Umask, in.Caller, 0, "", out)
}

func (v *View) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	if len(target) >= MaxPathLen {
		return fuse.Status(syscall.ENAMETOOLONG)
	}
	return v.mk(h.NodeId, name, syscall.S_IFLNK|0o777, h.Caller, 0, target, out)
}

func (v *View) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	sess, ino, done, errno := v.at(h.NodeId, false)
	if errno != 0 {
		return nil, st(errno)
	}
	defer done()
	n := sess.t.get(ino)
	if n == nil || n.mode&syscall.S_IFMT != syscall.S_IFLNK {
		return nil, fuse.EINVAL
	}
	return []byte(n.target), fuse.OK
}

func (v *View) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if h.NodeId == fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	sess, dir, done, errno := v.at(h.NodeId, true)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if e := v.mayRemove(&h.Caller, sess, dir, name); e != 0 {
		return st(e)
	}
	return st(v.s.unlink(v, sess, dir, name))
}

func (v *View) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if h.NodeId == fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	sess, dir, done, errno := v.at(h.NodeId, true)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if e := v.mayRemove(&h.Caller, sess, dir, name); e != 0 {
		return st(e)
	}
	return st(v.s.rmdir(v, sess, dir, name))
}

func (v *View) Rename(cancel <-chan struct{}, in *fuse.RenameIn, name, newName string) fuse.Status {
	if in.NodeId == fuse.FUSE_ROOT_ID || in.Newdir == fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	k2, ok := v.key(in.Newdir)
	if !ok {
		return fuse.Status(syscall.ESTALE)
	}
	sess, dir, done, errno := v.at(in.NodeId, true)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if k2.sess != sess || k2.gen != sess.gen {
		return fuse.Status(syscall.EXDEV) // sessions are separate trees
	}
	if e := v.mayRename(&in.Caller, sess, dir, name, k2.ino, newName, in.Flags); e != 0 {
		return st(e)
	}
	return st(v.s.rename(v, sess, dir, name, k2.ino, newName, in.Flags))
}

func (v *View) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	if in.NodeId == fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	src, ok := v.key(in.Oldnodeid)
	if !ok {
		return fuse.Status(syscall.ESTALE)
	}
	sess, dir, done, errno := v.at(in.NodeId, true)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if src.sess != sess || src.gen != sess.gen {
		return fuse.Status(syscall.EXDEV)
	}
	// As the kernel does: the hard link rule first, then the directory.
	if sn := sess.t.get(src.ino); sn != nil {
		if e := v.mayLink(v.who(&in.Caller), sn); e != 0 {
			return st(e)
		}
	}
	if e := v.mayCreate(&in.Caller, sess, dir); e != 0 {
		return st(e)
	}
	n, errno := v.s.link(v, sess, src.ino, dir, name)
	if errno != 0 {
		return st(errno)
	}
	v.entry(out, sess, dir, name, src.ino, n)
	return fuse.OK
}

func (v *View) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	if in.NodeId == fuse.FUSE_ROOT_ID {
		if in.Mask&mayWrite != 0 && in.Uid != 0 {
			return fuse.EACCES
		}
		return fuse.OK
	}
	sess, _, n, done, errno := v.atNode(in.NodeId, false)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if in.Mask&mayWrite != 0 && !v.writable(sess) {
		return fuse.Status(syscall.EROFS)
	}
	return st(v.may(v.who(&in.Caller), n, in.Mask&(mayRead|mayWrite|mayExec)))
}

func (v *View) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	var s syscall.Statfs_t
	if err := syscall.Statfs(v.s.dir, &s); err != nil {
		return fuse.ToStatus(err)
	}
	out.FromStatfsT(&s)
	return fuse.OK
}

// Directories.

func (v *View) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	h := &handle{nodeid: in.NodeId}
	h.entries = []fuse.DirEntry{{Name: ".", Mode: syscall.S_IFDIR}, {Name: "..", Mode: syscall.S_IFDIR}}
	if in.NodeId == fuse.FUSE_ROOT_ID {
		v.s.mu.RLock()
		for name := range v.s.sessions {
			h.entries = append(h.entries, fuse.DirEntry{Name: name, Mode: syscall.S_IFDIR})
		}
		v.s.mu.RUnlock()
		slices.SortFunc(h.entries[2:], func(a, b fuse.DirEntry) int { return cmpString(a.Name, b.Name) })
	} else {
		sess, ino, done, errno := v.at(in.NodeId, false)
		if errno != 0 {
			return st(errno)
		}
		d := sess.t.get(ino)
		if d == nil || !d.isDir() {
			done()
			return fuse.ENOTDIR
		}
		if e := v.may(v.who(&in.Caller), d, mayRead); e != 0 {
			done()
			return st(e)
		}
		// The directory node is immutable: listing it is a consistent
		// snapshot however the directory changes meanwhile.
		h.entries = slices.Grow(h.entries, d.entries.Len())
		it := d.entries.Iterator()
		for !it.Done() {
			name, child, _ := it.Next()
			if v.hidden(sess, ino, name) {
				continue
			}
			mode := uint32(syscall.S_IFREG)
			if c := sess.t.get(child); c != nil {
				mode = c.mode
			}
			h.entries = append(h.entries, fuse.DirEntry{Name: name, Mode: mode})
		}
		done()
	}
	for i := range h.entries {
		h.entries[i].Off = uint64(i + 1)
	}
	out.Fh = v.addHandle(h)
	out.OpenFlags |= fuse.FOPEN_CACHE_DIR
	return fuse.OK
}

func (v *View) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	h := v.handle(in.Fh)
	if h == nil {
		return fuse.EBADF
	}
	for i := int(in.Offset); i < len(h.entries); i++ {
		if !out.AddDirEntry(h.entries[i]) {
			break
		}
	}
	return fuse.OK
}

func (v *View) ReleaseDir(in *fuse.ReleaseIn) {
	v.mu.Lock()
	delete(v.handles, in.Fh)
	v.mu.Unlock()
}

func (v *View) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return fuse.ToStatus(v.s.Sync())
}

func (v *View) addHandle(h *handle) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	fh := v.nextFh
	v.nextFh++
	v.handles[fh] = h
	return fh
}

func (v *View) handle(fh uint64) *handle {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.handles[fh]
}

// Extended attributes.

// Bounds on extended attributes, as Linux filesystems have them: one
// value at most 64 KiB (E2BIG beyond, XATTR_SIZE_MAX), and all of an
// inode's names and values together at most 64 KiB (ENOSPC beyond), so
// one file cannot fill the daemon's memory and journal with attributes.
const (
	maxXattrSize  = 64 << 10
	maxXattrTotal = 64 << 10
)

func (v *View) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	if h.NodeId == fuse.FUSE_ROOT_ID {
		return 0, fuse.ENOATTR
	}
	_, _, n, done, errno := v.atNode(h.NodeId, false)
	if errno != 0 {
		return 0, st(errno)
	}
	defer done()
	if e := v.mayXattr(v.who(&h.Caller), n, attr, mayRead); e != 0 {
		return 0, st(e)
	}
	val, ok := n.xattrs[attr]
	if !ok {
		return 0, fuse.ENOATTR
	}
	if len(dest) < len(val) {
		return uint32(len(val)), fuse.ERANGE
	}
	return uint32(copy(dest, val)), fuse.OK
}

func (v *View) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	if h.NodeId == fuse.FUSE_ROOT_ID {
		return 0, fuse.OK
	}
	sess, ino, done, errno := v.at(h.NodeId, false)
	if errno != 0 {
		return 0, st(errno)
	}
	defer done()
	var names []byte
	for name := range sess.t.get(ino).xattrs {
		names = append(append(names, name...), 0)
	}
	if len(dest) < len(names) {
		return uint32(len(names)), fuse.ERANGE
	}
	return uint32(copy(dest, names)), fuse.OK
}

func (v *View) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	if len(data) > maxXattrSize {
		return fuse.Status(syscall.E2BIG)
	}
	return v.xattr(&in.Caller, in.NodeId, attr, data, in.Flags)
}

func (v *View) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	return v.xattr(&h.Caller, h.NodeId, attr, nil, 0)
}

func (v *View) xattr(c *fuse.Caller, nodeid uint64, attr string, data []byte, flags uint32) fuse.Status {
	if nodeid == fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	sess, ino, n, done, errno := v.atNode(nodeid, true)
	if errno != 0 {
		return st(errno)
	}
	defer done()
	if e := v.mayXattr(v.who(c), n, attr, mayWrite); e != 0 {
		return st(e)
	}
	_, exists := n.xattrs[attr]
	switch {
	case data == nil && !exists:
		return fuse.ENOATTR
	case flags&unix.XATTR_CREATE != 0 && exists:
		return fuse.Status(syscall.EEXIST)
	case flags&unix.XATTR_REPLACE != 0 && !exists:
		return fuse.ENOATTR
	}
	if data != nil {
		if errno := xattrRoom(sess, n, attr, data); errno != 0 {
			return st(errno)
		}
	}
	n = n.withXattr(attr, data)
	n.ctime = now()
	v.s.log(&record{op: opPut, sess: sess.name, ino: ino, n: n})
	if e := v.s.commit(); e != 0 {
		return st(e)
	}
	v.s.changedInode(v, sess, ino)
	return fuse.OK
}

// xattrRoom checks that setting attr to data keeps n within the per-inode
// bound (ENOSPC) and its session within its byte quota (EDQUOT).
func xattrRoom(sess *session, n *node, attr string, data []byte) syscall.Errno {
	grow := int64(len(attr) + len(data))
	if old, ok := n.xattrs[attr]; ok {
		grow -= int64(len(attr) + len(old))
	}
	if n.xattrBytes()+grow > maxXattrTotal {
		return syscall.ENOSPC
	}
	if q := sess.quota.Bytes; q > 0 && grow > 0 && sess.t.bytes+grow > q {
		return syscall.EDQUOT
	}
	return 0
}

var _ fuse.RawFileSystem = (*View)(nil)
