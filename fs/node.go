package fs

import (
	"maps"
	"syscall"

	"github.com/benbjohnson/immutable"
)

const rootIno = 1 // a session directory is inode 1 of its tree

// node is one version of an inode. Nodes are never changed once they are in
// a tree: a change makes a new node, so a snapshot that still points at the
// old tree keeps seeing the old version.
type node struct {
	mode   uint32 // type and permission bits, as in stat(2)
	uid    uint32
	gid    uint32
	nlink  uint32
	rdev   uint32
	size   int64
	atime  int64 // unix nanoseconds
	mtime  int64
	ctime  int64
	blob   uint64 // regular files: id of the data blob; 0 means none yet
	birth  uint64 // epoch the blob was made in; see session.shared
	parent uint64 // directories: the parent's inode, for ".."
	target string // symlinks
	dname  string // directories: their own name, for event paths (directories have one parent)

	entries *immutable.SortedMap[string, uint64] // directories
	xattrs  map[string][]byte                    // copied on change, never written in place
}

func (n *node) isDir() bool     { return n.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (n *node) isRegular() bool { return n.mode&syscall.S_IFMT == syscall.S_IFREG }

// clone returns a shallow copy to modify before it is put in a tree.
func (n *node) clone() *node {
	c := *n
	return &c
}

func (n *node) withXattr(name string, value []byte) *node {
	c := n.clone()
	c.xattrs = maps.Clone(n.xattrs)
	if c.xattrs == nil {
		c.xattrs = map[string][]byte{}
	}
	if value == nil {
		delete(c.xattrs, name)
	} else {
		c.xattrs[name] = append([]byte(nil), value...)
	}
	return c
}

// xattrBytes is what n's extended attributes hold: names and values, as
// Linux filesystems count them against the one block (64 KiB at most)
// they keep for an inode's attributes.
func (n *node) xattrBytes() int64 {
	var b int64
	for k, v := range n.xattrs {
		b += int64(len(k) + len(v))
	}
	return b
}

// usage is what n counts against a session's byte quota: a regular
// file's size, and every node's extended attributes, which the store
// keeps in memory and in the journal.
func (n *node) usage() int64 {
	u := n.xattrBytes()
	if n.isRegular() {
		u += n.size
	}
	return u
}

var emptyEntries = immutable.NewSortedMap[string, uint64](nil)

// tree is one session's namespace: an immutable map from inode number to
// node. Copying a tree value is a snapshot.
type tree struct {
	inodes *immutable.Map[uint64, *node]
	next   uint64 // next free inode number
	bytes  int64  // sum of regular file sizes and extended attributes (node.usage)
}

func newTree(now int64, uid, gid uint32) tree {
	root := &node{mode: syscall.S_IFDIR | 0o755, uid: uid, gid: gid, nlink: 2,
		atime: now, mtime: now, ctime: now, parent: rootIno, entries: emptyEntries}
	t := tree{inodes: immutable.NewMap[uint64, *node](nil), next: rootIno + 1}
	t.inodes = t.inodes.Set(rootIno, root)
	return t
}

func (t *tree) get(ino uint64) *node {
	n, _ := t.inodes.Get(ino)
	return n
}

// put stores n as the new version of ino and keeps the byte count.
func (t *tree) put(ino uint64, n *node) {
	if old := t.get(ino); old != nil {
		t.bytes -= old.usage()
	}
	t.bytes += n.usage()
	t.inodes = t.inodes.Set(ino, n)
	if ino >= t.next {
		t.next = ino + 1
	}
}

// drop removes ino from the tree.
func (t *tree) drop(ino uint64) {
	if old := t.get(ino); old != nil {
		t.bytes -= old.usage()
	}
	t.inodes = t.inodes.Delete(ino)
}

func (t *tree) lookup(dir uint64, name string) (uint64, *node) {
	d := t.get(dir)
	if d == nil || d.entries == nil {
		return 0, nil
	}
	ino, ok := d.entries.Get(name)
	if !ok {
		return 0, nil
	}
	return ino, t.get(ino)
}

// setEntry points name in directory dir at ino (or removes it when ino is 0)
// and returns the new directory node, already put.
func (t *tree) setEntry(dir uint64, name string, ino uint64) *node {
	d := t.get(dir).clone()
	if ino == 0 {
		d.entries = d.entries.Delete(name)
	} else {
		d.entries = d.entries.Set(name, ino)
	}
	t.put(dir, d)
	return d
}

// files is the number of inodes in the tree, the session directory included.
func (t *tree) files() int64 { return int64(t.inodes.Len()) }

// blobs calls fn for every data blob the tree references.
func (t *tree) blobs(fn func(blob uint64, size int64)) {
	it := t.inodes.Iterator()
	for !it.Done() {
		_, n, _ := it.Next()
		if n.blob != 0 {
			fn(n.blob, n.size)
		}
	}
}
