package fs

import (
	"fmt"
	"path"
	"strings"
	"syscall"
)

// Glob returns the regular files of session id whose paths (relative to
// the session, slash-separated) match pattern, as path.Match reads each
// component ("outputs/*.md"), sorted. It walks the store's tree, never a
// mount, and never follows a symbolic link: an agent that replaced a
// directory with a link to another session's files gets nothing listed
// through it.
func (s *Store) Glob(id, pattern string) ([]string, error) {
	parts := strings.Split(strings.Trim(path.Clean("/"+pattern), "/"), "/")
	for _, p := range parts {
		if _, err := path.Match(p, ""); err != nil || p == "" || p == ".." {
			return nil, fmt.Errorf("glob %q in session %q: %w: write a pattern like outputs/*.md", pattern, id, ErrBadName)
		}
	}
	s.mu.RLock()
	sess, err := s.sessionLocked(id)
	var t tree
	if err == nil {
		t = sess.t // immutable: walked after the lock is let go
	}
	s.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	var out []string
	globWalk(&t, rootIno, "", parts, &out)
	return out, nil
}

// globWalk matches parts[0] in directory dir (reached by prefix) and goes
// on into matching directories, or collects matching regular files when
// parts[0] is the last component. Entries come sorted from the tree.
func globWalk(t *tree, dir uint64, prefix string, parts []string, out *[]string) {
	d := t.get(dir)
	if d == nil || !d.isDir() {
		return
	}
	it := d.entries.Iterator()
	for !it.Done() {
		name, ino, _ := it.Next()
		if ok, _ := path.Match(parts[0], name); !ok {
			continue
		}
		n := t.get(ino)
		switch {
		case n == nil || n.mode&syscall.S_IFMT == syscall.S_IFLNK:
			// a link is never followed, nor listed
		case len(parts) > 1:
			globWalk(t, ino, prefix+name+"/", parts[1:], out)
		case n.isRegular():
			*out = append(*out, prefix+name)
		}
	}
}
