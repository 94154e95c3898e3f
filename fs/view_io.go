package fs

import (
	"os"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// File data. A writable open first makes sure the file has a blob no
// snapshot shares (copy-on-write happens here, once per open), then hands
// the kernel the blob for passthrough, so reads and writes never come
// through this process. Sessions with a byte quota write through FUSE
// instead, where every write is checked.

func (v *View) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if in.NodeId == fuse.FUSE_ROOT_ID {
		return fuse.EPERM
	}
	sess, dir, done, errno := v.at(in.NodeId, true)
	if errno != 0 {
		return st(errno)
	}
	if e := v.mayCreate(&in.Caller, sess, dir); e != 0 {
		done()
		return st(e)
	}
	mode := syscall.S_IFREG | (in.Mode &^ in.Umask & 0o7777)
	// The file and its blob are one commit (openLocked's): a create the
	// journal cannot take leaves no empty file behind.
	v.s.nest++
	ino, n, errno := v.s.mknod(v, sess, dir, name, mode, v.opts.IDs.in(in.Caller.Uid), v.opts.IDs.in(in.Caller.Gid), 0, "")
	v.s.nest--
	if errno != 0 {
		v.s.abort()
		done()
		return st(errno)
	}
	// The new file's attributes are the node's: filled before the open
	// counts a writer, they need no look at its (empty) blob.
	v.entry(&out.EntryOut, sess, dir, name, ino, n)
	h, _, errno := v.openLocked(sess, ino, in.Flags|syscall.O_TRUNC)
	if errno != 0 {
		done()
		v.Forget(out.EntryOut.NodeId, 1) // the kernel never hears of it
		return st(errno)
	}
	done()
	return st(v.finishOpen(out.EntryOut.NodeId, h, &out.OpenOut))
}

func (v *View) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	write := in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY || in.Flags&syscall.O_TRUNC != 0
	k, ok := v.key(in.NodeId)
	if !ok {
		return fuse.Status(syscall.ESTALE)
	}
	w := v.who(&in.Caller)
	if write && in.Flags&syscall.O_TRUNC == 0 && v.mayOpen(w, k, in.Flags) == 0 {
		v.s.copyUp(k) // the slow part of copy-on-write, without the lock
	}
	v.s.mu.Lock()
	sess, errno := v.live(k)
	if errno == 0 && write && !v.writable(sess) {
		errno = syscall.EROFS
	}
	if errno == 0 {
		if n := sess.t.get(k.ino); n == nil {
			errno = syscall.ENOENT
		} else {
			errno = v.may(w, n, openMask(in.Flags))
		}
	}
	if errno != 0 {
		v.s.mu.Unlock()
		return st(errno)
	}
	h, _, errno := v.openLocked(sess, k.ino, in.Flags)
	v.s.mu.Unlock()
	if errno != 0 {
		return st(errno)
	}
	return st(v.finishOpen(in.NodeId, h, out))
}

// copyUpHook, when set (by tests), runs before copyUp copies a blob.
var copyUpHook atomic.Pointer[func()]

// copyUp copies the shared blob of k for its live tree outside the store
// lock, so a large copy does not stall other operations. If the tree
// changed meanwhile the copy is thrown away and ownBlob decides again.
func (s *Store) copyUp(k nodeKey) {
	s.mu.Lock()
	sess := s.sessions[k.sess.name]
	if sess != k.sess || sess.gen != k.gen || s.closed {
		s.mu.Unlock()
		return
	}
	n := sess.t.get(k.ino)
	if n == nil || !n.isRegular() || n.blob == 0 || n.birth > sess.shared || sess.open[k.ino] > 0 {
		s.mu.Unlock()
		return
	}
	src, id := n.blob, s.reserve()
	s.mu.Unlock()

	if hook := copyUpHook.Load(); hook != nil {
		(*hook)()
	}
	err := s.copyInto(id, src)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.reserved, id)
	cur := sess.t.get(k.ino)
	if err != nil || s.closed || sess.gen != k.gen || cur == nil || cur.blob != src || cur.birth > sess.shared || sess.open[k.ino] > 0 {
		os.Remove(s.blobPath(id))
		return
	}
	c := cur.clone()
	c.blob, c.birth = id, s.epoch
	s.log(&record{op: opPut, sess: sess.name, ino: k.ino, n: c})
	if s.commit() != 0 {
		os.Remove(s.blobPath(id)) // ownBlob copies again under the lock
	}
}

// openLocked prepares a handle for ino; the caller holds s.mu for writing.
func (v *View) openLocked(sess *session, ino uint64, flags uint32) (*handle, *node, syscall.Errno) {
	n := sess.t.get(ino)
	if n == nil {
		return nil, nil, syscall.ENOENT
	}
	if !n.isRegular() {
		return nil, nil, syscall.EINVAL
	}
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	trunc := flags&syscall.O_TRUNC != 0
	h := &handle{key: nodeKey{sess, sess.gen, ino}, write: write, appends: flags&syscall.O_APPEND != 0}
	if write || trunc {
		var errno syscall.Errno
		if n, errno = v.s.ownBlob(sess, ino, trunc); errno != 0 {
			v.s.dropFresh()
			v.s.abort()
			return nil, nil, errno
		}
		if trunc && n.size > 0 {
			v.s.dropFresh()
			if n, errno = v.s.setattr(v, sess, ino, attrChange{size: new(int64)}); errno != 0 {
				return nil, nil, errno
			}
		}
	}
	if errno := v.s.commit(); errno != 0 {
		v.s.dropFresh()
		return nil, nil, errno
	}
	h.blob = n.blob
	if h.blob != 0 {
		// Read-write even for readers: this may become the inode's
		// passthrough file, which later writers share.
		h.f = v.s.takeFresh(h.blob)
		if h.f == nil {
			f, err := openBlobFile(v.s.blobPath(h.blob), os.O_RDWR, 0)
			if err != nil {
				return nil, nil, errnoOf(err)
			}
			h.f = f
		}
	}
	sess.open[ino]++
	if write {
		sess.writers[ino]++
	}
	// Quota sessions keep writes on the FUSE path, where they are counted,
	// and so reads too: the kernel does not mix the two on one inode.
	h.fusePath = sess.quota.Bytes > 0
	return h, n, 0
}

// finishOpen picks the data path for h and registers it under nodeid.
func (v *View) finishOpen(nodeid uint64, h *handle, out *fuse.OpenOut) syscall.Errno {
	h.nodeid = nodeid
	v.mu.Lock()
	k := v.nodes[nodeid]
	if k != nil {
		h.dir, h.name = k.dir, k.name
	}
	wantPass := !h.fusePath && h.f != nil && !v.noPass && k != nil
	switch {
	case wantPass && k.bk.pass > 0 && k.bk.blob == h.blob:
		h.mode = ioPass
	case wantPass && k.bk.pass == 0 && k.bk.cached == 0:
		if v.register(k, h) {
			h.mode = ioPass
		}
	case k != nil && k.bk.pass > 0:
		// The kernel wants every open of a passthrough inode to use its
		// one backing file; ownBlob keeps open blobs with the live tree,
		// so this is a bug if it happens.
		v.mu.Unlock()
		v.s.releaseCounts(h)
		if h.f != nil {
			h.f.Close()
		}
		return syscall.EBUSY
	}
	switch h.mode {
	case ioPass:
		k.bk.pass++
		out.BackingID = k.bk.id
		out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
		if h.f != nil { // the kernel uses the backing file, not ours
			h.f.Close()
			h.f = nil
		}
	default:
		if k != nil {
			k.bk.cached++
		}
	}
	fh := v.nextFh
	v.nextFh++
	v.handles[fh] = h
	v.mu.Unlock()
	out.Fh = fh
	return 0
}

// register gives the kernel h's blob descriptor as the passthrough file of
// node k, which then owns it. The caller holds v.mu.
func (v *View) register(k *kref, h *handle) bool {
	id, errno := v.srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(h.f.Fd())})
	if errno != 0 {
		v.noPass = true // not root, or a kernel without passthrough
		return false
	}
	k.bk = backing{id: id, blob: h.blob, file: h.f, cached: k.bk.cached}
	h.f = nil
	return true
}

func (v *View) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	h := v.handle(in.Fh)
	if h == nil {
		return nil, fuse.EBADF
	}
	if h.f == nil {
		return fuse.ReadResultData(nil), fuse.OK
	}
	return fuse.ReadResultFd(h.f.Fd(), int64(in.Offset), len(buf)), fuse.OK
}

func (v *View) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	h := v.handle(in.Fh)
	if h == nil || !h.write || h.f == nil {
		return 0, fuse.EBADF
	}
	h.changed.Store(true)
	var n int
	var err error
	var before, off int64 // blob size before the write, and where it writes
	if h.appends {        // O_APPEND: write at the end, one appender at a time
		v.appendMu.Lock()
		defer v.appendMu.Unlock()
		var fi os.FileInfo
		if fi, err = h.f.Stat(); err == nil {
			before, off = fi.Size(), fi.Size()
			if errno := v.grow(h, off+int64(len(data))); errno != 0 {
				return 0, st(errno)
			}
			n, err = h.f.WriteAt(data, off)
		}
	} else {
		off = int64(in.Offset)
		if errno := v.grow(h, off+int64(len(data))); errno != 0 {
			return 0, st(errno)
		}
		if fi, serr := h.f.Stat(); serr == nil {
			before = fi.Size()
		}
		n, err = h.f.WriteAt(data, off)
	}
	if err != nil {
		v.failedWrite(h, max(before, off+int64(n)))
		if n > 0 { // a short write: the part written stays, and says so
			return uint32(n), fuse.OK
		}
		return 0, fuse.ToStatus(err)
	}
	return uint32(n), fuse.OK
}

// failedWrite undoes what a write that failed (a full disk) left beyond
// keep bytes: the backing filesystem may keep part of a write it reports
// as failed (tmpfs does), and grow recorded a size the data never
// reached. The size is then taken back from the blob.
func (v *View) failedWrite(h *handle, keep int64) {
	if fi, err := h.f.Stat(); err == nil && fi.Size() > keep {
		h.f.Truncate(keep)
	}
	v.settle(h)
}

// grow records that h's file now reaches end bytes, refusing growth past
// the session's byte quota.
func (v *View) grow(h *handle, end int64) syscall.Errno {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	sess, errno := v.live(h.key)
	if errno != 0 {
		return errno
	}
	n := sess.t.get(h.key.ino)
	if n == nil || end <= n.size {
		return 0
	}
	if q := sess.quota.Bytes; q > 0 && sess.t.bytes+end-n.size > q {
		return syscall.EDQUOT
	}
	c := n.clone()
	c.size, c.mtime = end, now()
	v.s.log(&record{op: opPut, sess: sess.name, ino: h.key.ino, n: c})
	return v.s.commit()
}

// Flush is not needed: sizes are settled on release, and a subscriber
// that must not take a write from before it for a later one subscribes
// with Store.SubscribeSettled. ENOSYS tells the kernel to stop sending
// it, which saves a round trip per close.
func (v *View) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return fuse.ENOSYS
}

func (v *View) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	h := v.handle(in.Fh)
	if h != nil {
		f := h.f
		if f == nil {
			v.mu.Lock()
			if k := v.nodes[h.nodeid]; k != nil {
				f = k.bk.file
			}
			v.mu.Unlock()
		}
		if f != nil {
			if err := f.Sync(); err != nil {
				return fuse.ToStatus(err)
			}
		}
		v.settle(h)
	}
	return fuse.ToStatus(v.s.Sync())
}

// settle records the size and mtime a writable handle left in its blob,
// marking the handle changed when they moved.
// It reads them with the store locked: releases run concurrently, and a
// size read before another handle truncated the file must not land after.
func (v *View) settle(h *handle) {
	if !h.write || h.blob == 0 {
		return
	}
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	v.settleLocked(h, nil)
}

// settleLocked is settle with the store locked, reading the blob through
// f, an open descriptor of it, when there is one: cheaper than finding it
// by name.
func (v *View) settleLocked(h *handle, f *os.File) {
	if !h.write || h.blob == 0 {
		return
	}
	sess, errno := v.live(h.key)
	if errno != 0 {
		return
	}
	n := sess.t.get(h.key.ino)
	if n == nil || n.blob != h.blob {
		return
	}
	c := n.clone()
	v.s.statFrom(c, f)
	if c.size == n.size && c.mtime == n.mtime {
		return
	}
	v.s.log(&record{op: opPut, sess: sess.name, ino: h.key.ino, n: c})
	// If the journal cannot take it, the size stays what it was; the next
	// settle, or a restart (fixSizes), takes it from the blob.
	if v.s.commit() == 0 {
		h.changed.Store(true)
	}
}

// announceLocked tells the session's subscribers that h wrote the file,
// and the other views to drop what they cached of it, if h changed it
// since it last did.
func (v *View) announceLocked(sess *session, h *handle) {
	if !h.changed.Swap(false) {
		return
	}
	v.s.events.publish(Event{Session: sess.name, Path: v.s.relPath(sess, h.dir, h.name), Op: OpWritten})
	v.s.changedInode(v, sess, h.key.ino)
}

// settleWritersLocked settles the view's writable handles of session and
// announces what their writers changed; the caller holds s.mu.
func (v *View) settleWritersLocked(session string) {
	type open struct {
		h *handle
		f *os.File
	}
	var hs []open
	v.mu.Lock()
	for _, h := range v.handles {
		if !h.write || h.key.sess.name != session {
			continue
		}
		f := h.f
		if k := v.nodes[h.nodeid]; f == nil && k != nil {
			f = k.bk.file // passthrough: open until a release, which waits for s.mu
		}
		hs = append(hs, open{h, f})
	}
	v.mu.Unlock()
	for _, o := range hs {
		v.settleLocked(o.h, o.f)
		if sess, errno := v.live(o.h.key); errno == 0 {
			v.announceLocked(sess, o.h)
		}
	}
}

func (v *View) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	// One hold of the store lock for all of it, taken before the handle
	// leaves v.handles: SubscribeSettled, which holds it, finds a
	// writable handle either open or settled and announced. A release
	// runs beside the machine's next requests, which wait for the lock.
	v.s.mu.Lock()
	v.mu.Lock()
	h := v.handles[in.Fh]
	delete(v.handles, in.Fh)
	if h == nil {
		v.mu.Unlock()
		v.s.mu.Unlock()
		return
	}
	f := h.f // the blob's descriptor, for settle; closed after it
	var unregister int32
	if k := v.nodes[h.nodeid]; k != nil {
		switch h.mode {
		case ioPass:
			if k.bk.pass--; k.bk.pass == 0 {
				unregister = k.bk.id // after the lock: an ioctl
				f = k.bk.file
				k.bk = backing{cached: k.bk.cached}
			}
		case ioCached:
			k.bk.cached--
		}
		if k.lookups == 0 && k.bk.pass == 0 && k.bk.cached == 0 {
			delete(v.nodes, h.nodeid)
			delete(v.ids, k.key)
		}
	}
	v.mu.Unlock()
	v.settleLocked(h, f)
	sess, n := v.s.releaseCountsLocked(h)
	if h.write && n != nil {
		v.announceLocked(sess, h)
		v.s.events.publish(Event{Session: sess.name, Path: v.s.relPath(sess, h.dir, h.name), Op: OpClosed})
	}
	v.s.mu.Unlock()
	if unregister != 0 {
		v.srv.UnregisterBackingFd(unregister)
	}
	if f != nil {
		f.Close()
	}
	if h.f != nil && h.f != f {
		h.f.Close()
	}
}

// releaseCounts forgets an open handle and drops its inode if that was
// the last reference to an unlinked file. It returns the session and the
// node when the inode lives on.
func (s *Store) releaseCounts(h *handle) (*session, *node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseCountsLocked(h)
}

// releaseCountsLocked is releaseCounts with the store locked.
func (s *Store) releaseCountsLocked(h *handle) (*session, *node) {
	sess := s.sessions[h.key.sess.name]
	if sess != h.key.sess || sess.gen != h.key.gen || s.closed {
		return nil, nil
	}
	ino := h.key.ino
	sess.open[ino]--
	if h.write {
		sess.writers[ino]--
	}
	n := sess.t.get(ino)
	if n != nil && n.nlink == 0 && sess.open[ino] == 0 {
		s.freeing = true
		s.dropInode(sess, ino, n)
		s.commit() // if not, the unnamed inode stays until a restart drops it
		return nil, nil
	}
	return sess, n
}

func (v *View) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	h := v.handle(in.Fh)
	if h == nil || !h.write {
		return fuse.EBADF
	}
	f := h.f
	if f == nil { // passthrough: the kernel holds the descriptor
		var err error
		if f, err = openBlobFile(v.s.blobPath(h.blob), os.O_RDWR, 0); err != nil {
			return fuse.ToStatus(err)
		}
		defer f.Close()
	}
	if in.Mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
		if errno := v.grow(h, int64(in.Offset+in.Length)); errno != 0 {
			return st(errno)
		}
	}
	if err := unix.Fallocate(int(f.Fd()), in.Mode, int64(in.Offset), int64(in.Length)); err != nil {
		return fuse.ToStatus(err)
	}
	h.changed.Store(true)
	v.settle(h)
	return fuse.OK
}

func (v *View) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	h := v.handle(in.Fh)
	if h == nil {
		return fuse.EBADF
	}
	if h.blob == 0 {
		return fuse.Status(syscall.ENXIO)
	}
	f, err := os.Open(v.s.blobPath(h.blob))
	if err != nil {
		return fuse.ToStatus(err)
	}
	defer f.Close()
	off, err := unix.Seek(int(f.Fd()), int64(in.Offset), int(in.Whence))
	if err != nil {
		return fuse.ToStatus(err)
	}
	out.Offset = uint64(off)
	return fuse.OK
}
