package fs

import "fmt"

// ShiftOwners gives every file of the live sessions owned by a user or
// group id in from..from+size-1 the id at the same place in to..: the
// appliance moves the workspace off an old range of host ids this way
// (the jail tier's machines ran as 100000-165535, a range Debian and
// Ubuntu give the first user in /etc/subuid). Snapshots keep the ids they
// were taken with. It returns how many inodes changed.
func (s *Store) ShiftOwners(from, to, size uint32) (int, error) {
	if uint64(from)+uint64(size) > 1<<32 || uint64(to)+uint64(size) > 1<<32 {
		return 0, fmt.Errorf("shift owners %d-%d to %d: the ranges leave 32-bit ids", from, uint64(from)+uint64(size)-1, to)
	}
	shift := IDShift{From: from, To: to, Size: size}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	changed := 0
	for _, sess := range s.sessions {
		var inos []uint64
		it := sess.t.inodes.Iterator()
		for !it.Done() {
			ino, n, _ := it.Next()
			if shift.out(n.uid) != n.uid || shift.out(n.gid) != n.gid {
				inos = append(inos, ino)
			}
		}
		for _, ino := range inos {
			n := sess.t.get(ino).clone()
			n.uid, n.gid = shift.out(n.uid), shift.out(n.gid)
			s.log(&record{op: opPut, sess: sess.name, ino: ino, n: n})
			s.changedInode(nil, sess, ino)
		}
		changed += len(inos)
	}
	return changed, nil
}
