package fs

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// An operation applies its records as it logs them (later checks read the
// state earlier records made) and commits them at its end with one
// journal write. If that write fails (a full disk), the operation is
// undone in memory and fails with the write's errno: nothing is
// acknowledged that the journal does not hold.

// ErrNoSpace says the workspace is read-only because its journal cannot
// grow: deleting files or snapshots frees space, and writes work again.
var ErrNoSpace = errors.New("workspace read-only: no space left for its journal")

// txn is what undoing the logged but uncommitted records needs.
type txn struct {
	open       bool
	epoch, gen uint64
	gcWanted   bool
	deletes    int // len(s.deletes) before
	mark       int // len(s.j.buf) before
	records    int
	undo       []undoStep
}

// undoStep puts back what one record changed: a tree, or (for the rare
// session and snapshot records) the session and snapshot tables.
type undoStep struct {
	t   *tree
	old tree
	all *stateCopy
}

type stateCopy struct {
	sessions map[string]*session
	sessVals map[*session]session
	snaps    map[snapKey]*snapshot
	snapVals map[*snapshot]snapshot
}

// remember saves what r will change; the caller holds s.mu.
func (s *Store) remember(r *record) {
	if !s.tx.open {
		s.tx = txn{open: true, epoch: s.epoch, gen: s.gen, gcWanted: s.gcWanted,
			deletes: len(s.deletes), mark: len(s.j.buf), undo: s.tx.undo[:0]}
	}
	s.tx.records++
	switch r.op {
	case opPut, opEntry, opDrop:
		if t, err := s.target(r); err == nil {
			s.tx.undo = append(s.tx.undo, undoStep{t: t, old: *t})
		}
	default:
		c := &stateCopy{sessions: maps.Clone(s.sessions), sessVals: map[*session]session{},
			snaps: maps.Clone(s.snaps), snapVals: map[*snapshot]snapshot{}}
		for _, sess := range s.sessions {
			c.sessVals[sess] = *sess
		}
		for _, sn := range s.snaps {
			v := *sn
			v.trees = maps.Clone(sn.trees)
			c.snapVals[sn] = v
		}
		s.tx.undo = append(s.tx.undo, undoStep{all: c})
	}
}

// rollback undoes the uncommitted records, newest first.
func (s *Store) rollback() {
	for i := len(s.tx.undo) - 1; i >= 0; i-- {
		u := s.tx.undo[i]
		if u.all == nil {
			*u.t = u.old
			continue
		}
		s.sessions, s.snaps = u.all.sessions, u.all.snaps
		for p, v := range u.all.sessVals {
			*p = v
		}
		for p, v := range u.all.snapVals {
			*p = v
		}
	}
	s.epoch, s.gen = s.tx.epoch, s.tx.gen
	s.deletes = s.deletes[:s.tx.deletes]
	// Blobs made for the operation (nextBlob stays past them, so ids are
	// never reused) now belong to nothing: let the collector have them.
	s.gcWanted = true
	s.j.discard(s.tx.mark)
	clear(s.tx.undo)
	s.tx = txn{undo: s.tx.undo[:0]}
	s.freeing = false
}

// batch makes the operations called until end one commit: end(true)
// commits them all, end(false) undoes them all. The caller holds s.mu.
func (s *Store) batch() (end func(ok bool) syscall.Errno) {
	s.nest++
	return func(ok bool) syscall.Errno {
		s.nest--
		if !ok {
			s.abort()
			return 0
		}
		return s.commit()
	}
}

// abort undoes an operation that logged records and then failed.
func (s *Store) abort() {
	if s.nest > 0 {
		return
	}
	if s.tx.open {
		s.rollback()
	}
	s.freeing = false
}

// commit writes the operation's records to the journal, or undoes the
// operation and returns why it could not. Inside a batch it does nothing.
func (s *Store) commit() syscall.Errno {
	if s.nest > 0 {
		return 0
	}
	if !s.tx.open {
		s.freeing = false
		return 0
	}
	if s.tx.records > 1 {
		// A crash (power loss) may keep part of one write(2): replay
		// must then drop the whole operation, not apply half of it.
		s.j.group(s.tx.mark, s.tx.records)
	}
	if err := s.writeJournal(); err != nil {
		s.rollback()
		var e syscall.Errno
		if errors.As(err, &e) {
			return e
		}
		return syscall.EIO
	}
	clear(s.tx.undo)
	s.tx = txn{undo: s.tx.undo[:0]}
	s.freeing = false
	return 0
}

// journalErr is the Go API's error for a commit that failed with e: the
// store's health (wrapping ErrNoSpace) when that says why.
func (s *Store) journalErr(op string, e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	if s.health != nil {
		return fmt.Errorf("%s: %w", op, s.health)
	}
	return errOf(op, e)
}

// finish commits what a code path logged and neither committed nor
// undid. The caller holds s.mu.
func (s *Store) finish() {
	if s.nest == 0 && s.tx.open {
		s.commit()
	}
}

// writeJournal writes the buffered records. An operation that frees space
// (s.freeing) may use the space kept in reserve for it, which is how an
// operator gets out of a full disk; other operations first need the
// reserve back.
func (s *Store) writeJournal() error {
	if !s.reserveOK && !s.freeing {
		if err := s.makeReserve(); err != nil {
			return s.journalFailed(err)
		}
	}
	err := s.j.flush()
	if err != nil && s.freeing && s.reserveOK && errors.Is(err, syscall.ENOSPC) {
		s.dropReserve()
		err = s.j.flush()
	}
	if err != nil {
		return s.journalFailed(err)
	}
	if s.health != nil && s.reserveOK {
		s.setHealth(nil)
	}
	return nil
}

// journalFailed marks the workspace read-only for the reason err gives
// and returns err.
func (s *Store) journalFailed(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		s.setHealth(fmt.Errorf("%w on %s (delete files or snapshots to free space): %w", ErrNoSpace, s.dir, err))
	} else {
		s.setHealth(fmt.Errorf("workspace read-only: write journal in %s: %w", s.dir, err))
	}
	return err
}

// setHealth records whether the workspace takes writes and announces a
// change as an OpHealth event. The caller holds s.mu.
func (s *Store) setHealth(err error) {
	if (err == nil) == (s.health == nil) {
		s.health = err
		return
	}
	s.health = err
	msg := "workspace writable again"
	if err != nil {
		msg = err.Error()
	}
	s.events.publish(Event{Op: OpHealth, Path: msg})
}

// Health is nil while the workspace takes writes, else why not: an error
// wrapping ErrNoSpace when its journal found no space. It clears by itself
// once space is freed.
func (s *Store) Health() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.health
}

const reserveName = "journal.reserve"

func (s *Store) reservePath() string { return filepath.Join(s.dir, reserveName) }

// SpaceHealth tells, without opening it, whether the store in dir could
// write its journal when it last ran (its reserve was there), and how many
// bytes are free on its filesystem. It is for the doctor; a running store
// answers Health.
func SpaceHealth(dir string) (free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("workspace state %s: %w", dir, err)
	}
	free = int64(st.Bavail) * st.Bsize
	if _, err := os.Stat(filepath.Join(dir, reserveName)); errors.Is(err, os.ErrNotExist) {
		return free, fmt.Errorf("%w on %s (its reserve is gone; %d bytes free): delete files or snapshots (hearth workspace snapshot-rm) to free space", ErrNoSpace, dir, free)
	}
	return free, nil
}

// makeReserve allocates the space kept for journal records of deletions.
// The caller holds s.mu (or owns s).
func (s *Store) makeReserve() error {
	f, err := os.OpenFile(s.reservePath(), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("make journal reserve: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, s.opts.ReserveBytes)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		_, err = f.WriteAt(make([]byte, s.opts.ReserveBytes), 0)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name()) // a partial reserve holds space nobody may use
		return fmt.Errorf("make journal reserve: %w", err)
	}
	s.reserveOK = true
	return nil
}

func (s *Store) dropReserve() {
	os.Remove(s.reservePath())
	s.reserveOK = false
}

// refillReserve, from the flusher, brings the reserve back once space is
// free, which makes the workspace writable again.
func (s *Store) refillReserve() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.reserveOK {
		return
	}
	if s.makeReserve() == nil {
		s.setHealth(nil)
	}
}
