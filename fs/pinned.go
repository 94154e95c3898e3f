package fs

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// SnapshotHold is one of a session's snapshots and the bytes of file
// data it pins.
type SnapshotHold struct {
	Name    string
	Created time.Time
	// Holds is the bytes of the data blobs this snapshot references that
	// the next newer snapshot of the session (or, for the newest, its
	// live tree) does not: the versions the session has overwritten or
	// removed since. Their sum bounds what the session's snapshots pin
	// on disk beyond its live files (a blob gone from one tree does not
	// come back in a newer one, short of a restore, so it is counted
	// once), and deleting the oldest snapshots frees at most the sum of
	// theirs.
	Holds int64
}

// holdCache keeps each snapshot's Holds against the newer tree it was
// counted against, so that SnapshotHolds costs one tree walk per new
// snapshot, not one per snapshot, each time.
type holdCache struct {
	mu sync.Mutex
	m  map[snapKey]holdEntry
}

type holdEntry struct {
	created int64   // the snapshot's (a snapshot deleted and taken again under its name is another)
	against snapKey // the newer snapshot it was counted against
	at      int64   // and when that one was taken
	bytes   int64
}

// SnapshotHolds lists session id's snapshots, oldest first, with the
// bytes each pins (see SnapshotHold). Each snapshot's figure is counted
// once against its newer neighbour and kept, the newest one's against
// the live tree (usually the same tree: it was just taken), so a call
// costs a walk of the trees that changed, not of every snapshot.
func (s *Store) SnapshotHolds(id string) ([]SnapshotHold, error) {
	s.mu.RLock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		s.mu.RUnlock()
		return nil, fmt.Errorf("snapshot holds: %w", err)
	}
	live := sess.t
	type held struct {
		key     snapKey
		created int64
		t       tree
	}
	var snaps []held
	for k, sn := range s.snaps {
		if st := sn.trees[id]; k.scope == id && st != nil {
			snaps = append(snaps, held{k, sn.created, st.t})
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(snaps, func(a, b held) int {
		if a.created != b.created {
			return int(min(max(a.created-b.created, -1), 1))
		}
		return strings.Compare(a.key.name, b.key.name)
	})
	s.holds.mu.Lock()
	defer s.holds.mu.Unlock()
	if s.holds.m == nil {
		s.holds.m = map[snapKey]holdEntry{}
	}
	out := make([]SnapshotHold, len(snaps))
	kept := map[snapKey]bool{}
	for i, sn := range snaps {
		out[i] = SnapshotHold{Name: sn.key.name, Created: time.Unix(0, sn.created)}
		kept[sn.key] = true
		if i == len(snaps)-1 {
			out[i].Holds = dropped(sn.t, live) // against the live tree: never kept
			continue
		}
		next := snaps[i+1]
		e, ok := s.holds.m[sn.key]
		if !ok || e.created != sn.created || e.against != next.key || e.at != next.created {
			e = holdEntry{created: sn.created, against: next.key, at: next.created, bytes: dropped(sn.t, next.t)}
			s.holds.m[sn.key] = e
		}
		out[i].Holds = e.bytes
	}
	for k := range s.holds.m {
		if k.scope == id && !kept[k] {
			delete(s.holds.m, k) // deleted snapshots
		}
	}
	return out, nil
}

// dropped is the bytes of the blobs old references that newer does not
// have at the same inode.
func dropped(old, newer tree) int64 {
	if old.inodes == newer.inodes {
		return 0
	}
	var n int64
	it := old.inodes.Iterator()
	for !it.Done() {
		ino, nd, _ := it.Next()
		if nd.blob == 0 {
			continue
		}
		if now, ok := newer.inodes.Get(ino); !ok || now.blob != nd.blob {
			n += nd.size
		}
	}
	return n
}
