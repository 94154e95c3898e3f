package fs

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Permission checks.
//
// Views are mounted without the kernel's default_permissions. With it the
// kernel checked mode bits from the attributes it had cached, and every
// create or delete in a directory dropped that directory's attributes, so
// the next check there waited for a GETATTR: two of the seven requests a
// small file cost. The view checks instead, in the request that opens,
// makes, removes or changes something, as the kernel's generic_permission
// and setattr_prepare do, with the caller's ids from the request.
//
// What the kernel then never asks about is search permission on a
// directory whose entries it has cached. So an entry is cached (entryTTL)
// only in a directory that every user may search; in any other its
// timeout is zero, and every path walk through the directory comes back
// to Lookup with the walker's ids. A mode change that takes search away
// from anyone drops the directory's cached entries in every view.
//
// Root's overrides: the host's root (the appliance, virtiofsd, the SFTP
// server) has them everywhere, as before. A machine's root has them, as
// capabilities in its own user namespace give them, over files whose
// owner and group both lie in the machine's range of ids (IDShift).

// The masks of may, as in the kernel (MAY_EXEC, MAY_WRITE, MAY_READ).
const (
	mayExec  = 1
	mayWrite = 2
	mayRead  = 4
)

// fmodeExec is the flag the kernel adds to an open that executes the file
// (__FMODE_EXEC); such an open needs execute permission, not read.
const fmodeExec = 0x20

// entryTTL is how long the kernel may keep a name's entry in a directory
// every user may search. Names change only through the store, which tells
// every view (notifier), so this bounds nothing a user could see late.
const entryTTL = time.Hour

// who is the caller of one request, with the ids the store keeps.
type who struct {
	host     uint32 // the caller's uid on the host, as the kernel sent it
	uid, gid uint32 // the caller's fsuid and fsgid in the store's ids
	pid      uint32
	groups   []uint32 // supplementary groups in the store's ids, read once needed
	read     bool     // groups was read
	readOK   bool
}

func (v *View) who(c *fuse.Caller) *who {
	return &who{host: c.Uid, uid: v.opts.IDs.in(c.Uid), gid: v.opts.IDs.in(c.Gid), pid: c.Pid}
}

// holds says whether id (a store id) lies in the range the shift maps.
func (m IDShift) holds(id uint32) bool { return m.Size > 0 && id >= m.From && id-m.From < m.Size }

// capable says whether w has root's overrides over n (CAP_DAC_OVERRIDE,
// CAP_FOWNER, CAP_CHOWN, CAP_FSETID): the host's root, or the machine's
// root over a file whose owner and group are the machine's.
func (v *View) capable(w *who, n *node) bool {
	if w.host == 0 {
		return true
	}
	m := v.opts.IDs
	return m.Size > 0 && w.host == m.To && m.holds(n.uid) && m.holds(n.gid)
}

// owns says whether w owns n or may act as its owner (CAP_FOWNER).
func (v *View) owns(w *who, n *node) bool { return w.uid == n.uid || v.capable(w, n) }

// may says whether w may access n as mask asks: nil errno, or EACCES.
func (v *View) may(w *who, n *node, mask uint32) syscall.Errno {
	if mask&^v.classBits(w, n, mask)&7 == 0 {
		return 0
	}
	// Read and write are always overridable, and search of a directory;
	// execution of a file only when some execute bit is set.
	if v.capable(w, n) && (mask&mayExec == 0 || n.isDir() || n.mode&0o111 != 0) {
		return 0
	}
	return syscall.EACCES
}

// classBits are the permission bits of n that apply to w: the owner's,
// the group's for a member of n's group, else everyone else's.
func (v *View) classBits(w *who, n *node, mask uint32) uint32 {
	m := n.mode
	if w.uid == n.uid {
		return m >> 6 & 7
	}
	if w.gid == n.gid {
		return m >> 3 & 7
	}
	g, o := m>>3&7, m&7
	if (g^o)&mask == 0 {
		return o // membership would not change the answer
	}
	groups, ok := v.groupsOf(w)
	if !ok {
		return g & o // not known: grant only what both would
	}
	if slices.Contains(groups, n.gid) {
		return g
	}
	return o
}

// inGroup says whether gid is w's group or one of its supplementary ones.
func (v *View) inGroup(w *who, gid uint32) bool {
	if w.gid == gid {
		return true
	}
	groups, _ := v.groupsOf(w)
	return slices.Contains(groups, gid)
}

// groupsOf reads the caller's supplementary groups from /proc: FUSE sends
// only the uid and gid. The caller is blocked in the request, so its
// thread id names it. ok is false if they could not be read.
func (v *View) groupsOf(w *who) ([]uint32, bool) {
	if w.read {
		return w.groups, w.readOK
	}
	w.read = true
	if w.pid == 0 {
		return nil, false
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(w.pid), 10) + "/status")
	if err != nil {
		return nil, false
	}
	_, rest, ok := bytes.Cut(b, []byte("\nGroups:"))
	if !ok {
		return nil, false
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	for _, f := range strings.Fields(string(line)) {
		g, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, false
		}
		w.groups = append(w.groups, v.opts.IDs.in(uint32(g)))
	}
	w.readOK = true
	return w.groups, true
}

// openMask is what an open with flags needs.
func openMask(flags uint32) uint32 {
	var mask uint32
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		mask = mayRead
	case syscall.O_WRONLY:
		mask = mayWrite
	default:
		mask = mayRead | mayWrite
	}
	if flags&syscall.O_TRUNC != 0 {
		mask |= mayWrite
	}
	if flags&fmodeExec != 0 {
		mask = mayExec
	}
	return mask
}

// mayDelete says whether w may remove victim from dir: write and search
// on dir, and in a sticky directory only the owner of either (or root).
func (v *View) mayDelete(w *who, dir, victim *node) syscall.Errno {
	if e := v.may(w, dir, mayWrite|mayExec); e != 0 {
		return e
	}
	if dir.mode&syscall.S_ISVTX != 0 && w.uid != victim.uid && w.uid != dir.uid && !v.capable(w, victim) {
		return syscall.EPERM
	}
	return 0
}

// mayLink applies the kernel's protected_hardlinks rule, which it checks
// with permissions only a view can now answer: someone who neither owns
// src nor may act as its owner may link only a plain file it may read and
// write.
func (v *View) mayLink(w *who, src *node) syscall.Errno {
	if !v.protectedLinks || v.owns(w, src) {
		return 0
	}
	if !src.isRegular() || src.mode&syscall.S_ISUID != 0 || src.mode&(syscall.S_ISGID|0o010) == syscall.S_ISGID|0o010 ||
		v.may(w, src, mayRead|mayWrite) != 0 {
		return syscall.EPERM
	}
	return 0
}

// protectedHardlinks reads the kernel's fs.protected_hardlinks.
func protectedHardlinks() bool {
	b, err := os.ReadFile("/proc/sys/fs/protected_hardlinks")
	return err != nil || strings.TrimSpace(string(b)) != "0"
}

// maySetattr checks a SETATTR as setattr_prepare would (the kernel skips
// those checks on a filesystem without default_permissions) and returns
// the mode to set: the set-group-id bit goes when w is neither in the
// file's group nor root.
func (v *View) maySetattr(w *who, n *node, in *fuse.SetAttrIn) (mode *uint32, errno syscall.Errno) {
	// truncate(2) by path needs write permission; a descriptor's was
	// checked when it was opened.
	if _, ok := in.GetSize(); ok && in.Valid&fuse.FATTR_FH == 0 {
		if e := v.may(w, n, mayWrite); e != 0 {
			return nil, e
		}
	}
	if u, ok := in.GetUID(); ok {
		u = v.opts.IDs.in(u)
		if !(w.uid == n.uid && u == n.uid) && !v.capable(w, n) {
			return nil, syscall.EPERM
		}
	}
	gid := n.gid
	if g, ok := in.GetGID(); ok {
		g = v.opts.IDs.in(g)
		if !(w.uid == n.uid && (g == n.gid || v.inGroup(w, g))) && !v.capable(w, n) {
			return nil, syscall.EPERM
		}
		gid = g
	}
	if m, ok := in.GetMode(); ok {
		if !v.owns(w, n) {
			// The kernel clears the set-id bits of a file someone else
			// writes as a mode change: that, and only that, is allowed.
			const setID = syscall.S_ISUID | syscall.S_ISGID
			if m&0o7777 == n.mode&0o7777 || m&^n.mode&0o7777 != 0 || (m^n.mode)&0o7777&^setID != 0 {
				return nil, syscall.EPERM
			}
		} else if m&syscall.S_ISGID != 0 && !v.inGroup(w, gid) && !v.capable(w, n) {
			m &^= syscall.S_ISGID
		}
		mode = &m
	}
	explicit := in.Valid&fuse.FATTR_ATIME != 0 && in.Valid&fuse.FATTR_ATIME_NOW == 0 ||
		in.Valid&fuse.FATTR_MTIME != 0 && in.Valid&fuse.FATTR_MTIME_NOW == 0
	if explicit && !v.owns(w, n) {
		return nil, syscall.EPERM
	}
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0 && !explicit && !v.owns(w, n) {
		if e := v.may(w, n, mayWrite); e != 0 {
			return nil, e
		}
	}
	return mode, 0
}

// mayXattr checks access to an extended attribute: the kernel checks
// trusted.* (root only) and leaves security.* and system.* to security
// modules and the filesystem, but asks the filesystem's permission for
// user.*, which is then read or write permission on the file.
func (v *View) mayXattr(w *who, n *node, attr string, mask uint32) syscall.Errno {
	if !strings.HasPrefix(attr, "user.") {
		return 0
	}
	return v.may(w, n, mask)
}

// searchable says whether every user may search directory n, so that the
// kernel may keep its entries without asking again.
func searchable(n *node) bool { return n != nil && n.mode&0o111 == 0o111 }

// mayCreate says whether c may make a name in dir: write and search.
func (v *View) mayCreate(c *fuse.Caller, sess *session, dir uint64) syscall.Errno {
	d := sess.t.get(dir)
	if d == nil {
		return syscall.ENOENT
	}
	return v.may(v.who(c), d, mayWrite|mayExec)
}

// mayRemove says whether c may remove name from dir.
func (v *View) mayRemove(c *fuse.Caller, sess *session, dir uint64, name string) syscall.Errno {
	d := sess.t.get(dir)
	_, n := sess.t.lookup(dir, name)
	if d == nil || n == nil {
		return syscall.ENOENT
	}
	return v.mayDelete(v.who(c), d, n)
}

// mayRename says whether c may move name in dir to newName in newDir: as
// a removal from dir, a removal of what newName names (else a creation)
// in newDir, and for a directory that changes parent, write permission
// on it (its ".." changes).
func (v *View) mayRename(c *fuse.Caller, sess *session, dir uint64, name string, newDir uint64, newName string, flags uint32) syscall.Errno {
	w := v.who(c)
	d, nd := sess.t.get(dir), sess.t.get(newDir)
	_, src := sess.t.lookup(dir, name)
	if d == nil || nd == nil || src == nil {
		return syscall.ENOENT
	}
	if e := v.mayDelete(w, d, src); e != 0 {
		return e
	}
	_, dst := sess.t.lookup(newDir, newName)
	if dst != nil {
		if e := v.mayDelete(w, nd, dst); e != 0 {
			return e
		}
	} else if e := v.may(w, nd, mayWrite|mayExec); e != 0 {
		return e
	}
	if dir != newDir {
		if src.isDir() {
			if e := v.may(w, src, mayWrite); e != 0 {
				return e
			}
		}
		if dst != nil && dst.isDir() && flags&unix.RENAME_EXCHANGE != 0 {
			if e := v.may(w, dst, mayWrite); e != 0 {
				return e
			}
		}
	}
	return 0
}

// mayOpen checks an open of k before the work done outside the store
// lock (a copy-on-write copy); Open checks again under the lock.
func (v *View) mayOpen(w *who, k nodeKey, flags uint32) syscall.Errno {
	v.s.mu.RLock()
	defer v.s.mu.RUnlock()
	sess, errno := v.live(k)
	if errno != 0 {
		return errno
	}
	n := sess.t.get(k.ino)
	if n == nil {
		return syscall.ENOENT
	}
	return v.may(w, n, openMask(flags))
}
