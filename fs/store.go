package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"hearth/internal/atomicfile"
)

// Options configure a Store.
type Options struct {
	// Dir is the state directory of the workspace: journal, checkpoint and
	// data blobs live under it. It is created if missing.
	Dir string
	// TidyInterval is how often blobs whose last reference is gone are
	// recycled, garbage is collected and a long journal is checkpointed.
	// (Every change reaches the journal file as it is made, so it
	// survives a SIGKILL of the daemon; fsync(2) on any file makes
	// everything before it durable against power loss too.) Default 50ms.
	TidyInterval time.Duration
	// CheckpointBytes is the journal size that triggers a checkpoint.
	// Default 64 MiB.
	CheckpointBytes int64
	// ReserveBytes of the state filesystem are kept (in the file
	// journal.reserve) for the journal records of deletions, so that
	// files and snapshots can still be deleted when the disk is full.
	// Default 1 MiB.
	ReserveBytes int64
}

// Quota limits one session's live tree. Zero means no limit.
type Quota struct {
	Bytes  int64 // sum of file sizes
	Inodes int64 // files, directories and links, the session directory included
}

// Store is the durable workspace tree. All methods are safe for concurrent
// use. Close it to flush and checkpoint.
type Store struct {
	dir string
	// damage: journals found damaged in their middle at open (Damage).
	damage []string
	opts   Options

	mu       sync.RWMutex
	holds    holdCache // SnapshotHolds' figures, its own lock
	sessions map[string]*session
	snaps    map[snapKey]*snapshot
	epoch    uint64 // bumped by every snapshot; see session.shared
	gen      uint64 // source of session incarnation numbers
	nextBlob uint64
	j        *journalWriter
	jseq     uint64 // sequence number of the current journal file
	deletes  []uint64
	fresh    *os.File        // see takeFresh
	pool     []uint64        // empty blobs made ahead; see newBlob
	reserved map[uint64]bool // blob ids made or being made but not yet in a tree: GC leaves them
	makeMore chan struct{}
	tidying  atomic.Bool // flushAndCollect is deleting or recycling blobs
	views    []*View
	closed   bool
	gcWanted bool

	tx        txn   // records logged and not yet committed; see commit.go
	nest      int   // depth of batches: commit writes only at depth 0
	freeing   bool  // the operation being logged frees space: it may use the reserve
	reserveOK bool  // journal.reserve holds ReserveBytes
	health    error // nil, or why the workspace is read-only; see Health

	syncMu  sync.Mutex // serialises fsync of the journal and checkpoints
	reflink bool       // backing filesystem clones files (FICLONE)
	events  *Bus

	stop chan struct{}
	wg   sync.WaitGroup
}

// session is one session's live state.
type session struct {
	name    string
	gen     uint64 // changes when the tree is replaced, so stale kernel nodes are refused
	created int64
	t       tree
	shared  uint64 // blobs born at or before this epoch may be in a snapshot: copy before writing
	quota   Quota
	writers map[uint64]int // inode -> open writable handles, in every view; not persisted
	open    map[uint64]int // inode -> open handles of any kind
}

func (sess *session) resetHandles() {
	sess.writers, sess.open = map[uint64]int{}, map[uint64]int{}
}

type snapKey struct{ scope, name string }

func (k snapKey) String() string { return k.scope + "/" + k.name }

func parseSnapKey(s string) snapKey {
	scope, name, _ := strings.Cut(s, "/")
	return snapKey{scope, name}
}

// snapshot holds frozen copies of one session (scope = its name) or of
// every session (scope "").
type snapshot struct {
	key     snapKey
	created int64
	epoch   uint64
	trees   map[string]*sessState
}

type sessState struct {
	t       tree
	quota   Quota
	created int64
}

// Open opens (or creates) the store in opts.Dir, replaying the checkpoint
// and journal, and removes data blobs that nothing references (left by a
// crash between making a blob and journaling it).
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("open workspace store: no state directory given")
	}
	if opts.TidyInterval <= 0 {
		opts.TidyInterval = 50 * time.Millisecond
	}
	if opts.CheckpointBytes <= 0 {
		opts.CheckpointBytes = 64 << 20
	}
	if opts.ReserveBytes <= 0 {
		opts.ReserveBytes = 1 << 20
	}
	for _, d := range []string{opts.Dir, filepath.Join(opts.Dir, "blobs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open workspace store: %w", err)
		}
	}
	s := &Store{dir: opts.Dir, opts: opts, sessions: map[string]*session{}, snaps: map[snapKey]*snapshot{},
		epoch: 1, nextBlob: 1, events: NewBus(), stop: make(chan struct{}), makeMore: make(chan struct{}, 1), reserved: map[uint64]bool{}}
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("open workspace store %s: %w", opts.Dir, err)
	}
	if err := s.makeReserve(); err != nil {
		s.journalFailed(err) // read-only until space is freed
	}
	s.reflink = probeReflink(filepath.Join(opts.Dir, "blobs"))
	s.wg.Add(2)
	go s.flusher()
	go s.blobMaker()
	s.wakeMaker()
	return s, nil
}

func (s *Store) blobPath(id uint64) string {
	return filepath.Join(s.dir, "blobs", strconv.FormatUint(id, 16))
}

func (s *Store) journalPath(seq uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("journal.%016x", seq))
}

// load rebuilds the state from the checkpoint and the journals after it,
// then opens a fresh journal.
func (s *Store) load() error {
	start := uint64(1)
	if f, err := os.Open(filepath.Join(s.dir, "checkpoint")); err == nil {
		_, err = readJournal(f, func(r *record) error {
			if r.op == opHeader {
				start = r.ino
			}
			return s.apply(r)
		})
		f.Close()
		if err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	seqs, err := s.journalSeqs()
	if err != nil {
		return err
	}
	last := start
	for _, seq := range seqs {
		if seq < start {
			os.Remove(s.journalPath(seq)) // already in the checkpoint
			continue
		}
		if err := s.replay(seq); err != nil {
			return err
		}
		last = seq
	}
	if err := s.reconcileBlobs(); err != nil {
		return err
	}
	// Continue in the newest journal: its intact prefix stays, a torn tail
	// was cut by replay.
	s.jseq = last
	f, err := os.OpenFile(s.journalPath(last), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	s.j = newJournalWriter(f, fi.Size())
	return nil
}

func (s *Store) journalSeqs() ([]uint64, error) {
	names, err := filepath.Glob(filepath.Join(s.dir, "journal.*"))
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, n := range names {
		if seq, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(n), "journal."), 16, 64); err == nil {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

func (s *Store) replay(seq uint64) error {
	f, err := os.OpenFile(s.journalPath(seq), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	good, err := readJournal(f, s.apply)
	if err != nil {
		return fmt.Errorf("journal %d: %w", seq, err)
	}
	if err := s.keepDamage(f, seq, good); err != nil {
		return fmt.Errorf("journal %d: %w", seq, err)
	}
	return f.Truncate(good) // drop a torn tail so new records follow intact ones
}

// keepDamage looks at what follows the last intact record of journal seq.
// A crash mid-append leaves a torn tail, which is cut without a word. But
// an intact record after the damage means the journal was damaged in its
// middle (a bad sector, a stray write): those bytes are kept in
// journal.<seq>.damaged before the cut, and Damage and hearth doctor say
// so, so that no finished operation is lost silently.
func (s *Store) keepDamage(f *os.File, seq uint64, good int64) error {
	fi, err := f.Stat()
	if err != nil || fi.Size() <= good {
		return err
	}
	tail := make([]byte, fi.Size()-good)
	if _, err := f.ReadAt(tail, good); err != nil {
		return fmt.Errorf("read past offset %d: %w", good, err)
	}
	at := intactFrameAfter(tail)
	if at < 0 {
		return nil // a torn tail
	}
	keep := s.journalPath(seq) + ".damaged"
	if err := os.WriteFile(keep, tail, 0o600); err != nil {
		return fmt.Errorf("keep the %d bytes after the damage at offset %d: %w", len(tail), good, err)
	}
	s.damage = append(s.damage, fmt.Sprintf("journal %d is damaged at offset %d: the operations after it "+
		"(an intact record %d bytes further) were not replayed; its last %d bytes are kept in %s",
		seq, good, at, len(tail), keep))
	return nil
}

// intactFrameAfter returns the offset of the first intact journal frame
// in b after its first byte, or -1.
func intactFrameAfter(b []byte) int {
	for off := 1; off < len(b); off++ {
		l, n := binary.Uvarint(b[off:])
		if n <= 0 || l == 0 || l > 1<<20 || uint64(len(b)-off-n) < l+4 {
			continue
		}
		payload := b[off+n : off+n+int(l)]
		if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(b[off+n+int(l):]) {
			continue
		}
		if _, err := decodeRecord(payload); err == nil {
			return off
		}
	}
	return -1
}

// Damage says, for each journal found damaged in its middle when the
// store was opened, what was not replayed and where its bytes are kept.
// Empty when every journal was intact or only torn at its end.
func (s *Store) Damage() []string { return slices.Clone(s.damage) }

// DamagedJournals lists the damaged journal tails kept in a store's
// state directory dir, for checks that run without opening it.
func DamagedJournals(dir string) []string {
	names, _ := filepath.Glob(filepath.Join(dir, "journal.*.damaged"))
	return names
}

// reconcileBlobs empties blob files nothing references into the pool (or
// deletes them) and sets the next blob id past every file on disk. Sizes of files written through
// passthrough and cut off by a crash are taken from their blobs.
func (s *Store) reconcileBlobs() error {
	live := s.referencedBlobs()
	ents, err := os.ReadDir(filepath.Join(s.dir, "blobs"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		id, err := strconv.ParseUint(e.Name(), 16, 64)
		if err != nil {
			continue
		}
		if id >= s.nextBlob {
			s.nextBlob = id + 1
		}
		if !live[id] {
			s.adopt(id)
		}
	}
	for _, sess := range s.sessions {
		s.fixSizes(sess)
	}
	return nil
}

// adopt puts an unreferenced blob (the last run's pool, or one a crash
// left between making it and journaling it) into the pool, emptied, or
// deletes it when the pool is full. The caller owns s.
func (s *Store) adopt(id uint64) {
	p := s.blobPath(id)
	if len(s.pool) >= recycleMax || empty(p) != nil {
		os.Remove(p)
		return
	}
	s.pool = append(s.pool, id)
	s.reserved[id] = true
}

// fixSizes makes live node sizes agree with their blobs (only files open
// for writing at a crash can disagree) and drops files that were unlinked
// but still open.
func (s *Store) fixSizes(sess *session) {
	it := sess.t.inodes.Iterator()
	var fix, orphans []uint64
	for !it.Done() {
		ino, n, _ := it.Next()
		if n.nlink == 0 && !n.isDir() {
			orphans = append(orphans, ino) // unlinked while open when the daemon died
			continue
		}
		if n.blob == 0 {
			continue
		}
		if fi, err := os.Stat(s.blobPath(n.blob)); err == nil && fi.Size() != n.size {
			fix = append(fix, ino)
		}
	}
	for _, ino := range orphans {
		s.log(&record{op: opDrop, sess: sess.name, ino: ino})
	}
	for _, ino := range fix {
		n := sess.t.get(ino).clone()
		if fi, err := os.Stat(s.blobPath(n.blob)); err == nil {
			n.size = fi.Size()
			n.mtime = fi.ModTime().UnixNano()
		}
		s.log(&record{op: opPut, sess: sess.name, ino: ino, n: n})
	}
}

// referencedBlobs returns every blob a live tree or a snapshot references.
// The caller holds s.mu, or owns s exclusively.
func (s *Store) referencedBlobs() map[uint64]bool {
	live := map[uint64]bool{}
	mark := func(b uint64, _ int64) { live[b] = true }
	for _, sess := range s.sessions {
		sess.t.blobs(mark)
	}
	for _, sn := range s.snaps {
		for _, st := range sn.trees {
			st.t.blobs(mark)
		}
	}
	return live
}

// log applies r and buffers it for the journal; the operation's commit
// writes it (see commit.go). The caller holds s.mu for writing. During
// load (s.j == nil) it only applies.
func (s *Store) log(r *record) {
	if s.j != nil {
		s.remember(r)
	}
	if err := s.apply(r); err != nil {
		panic(fmt.Sprintf("workspace store: apply %v: %v", r.op, err)) // a bug: callers validate first
	}
	if s.j != nil {
		s.j.append(r)
	}
}

// apply is the only code that changes the state.
func (s *Store) apply(r *record) error {
	switch r.op {
	case opHeader:
		s.epoch, s.gen, s.nextBlob = r.a, r.b, r.c
	case opSession:
		s.gen++
		sess := &session{name: r.sess, gen: s.gen, created: r.time, t: newTree(r.time, 0, 0), shared: r.a}
		sess.resetHandles()
		s.sessions[r.sess] = sess
	case opSessionDelete:
		delete(s.sessions, r.sess)
		for k := range s.snaps {
			if k.scope == r.sess {
				delete(s.snaps, k)
			}
		}
		s.gcWanted = true
	case opSessionRename:
		sess := s.sessions[r.sess]
		if sess == nil || s.sessions[r.name] != nil {
			return fmt.Errorf("rename of missing session %q, or to existing %q", r.sess, r.name)
		}
		delete(s.sessions, r.sess)
		s.gen++
		sess.name, sess.gen = r.name, s.gen
		s.sessions[r.name] = sess
		for k, sn := range s.snaps {
			if k.scope == r.sess {
				delete(s.snaps, k)
				sn.key.scope = r.name
				sn.trees = map[string]*sessState{r.name: sn.trees[r.sess]}
				s.snaps[sn.key] = sn
			}
		}
	case opQuota:
		if s.sessions[r.sess] == nil {
			return fmt.Errorf("quota of missing session %q", r.sess)
		}
		s.sessions[r.sess].quota = Quota{Bytes: int64(r.a), Inodes: int64(r.b)}
	case opPut, opEntry, opDrop:
		t, err := s.target(r)
		if err != nil {
			return err
		}
		switch r.op {
		case opPut:
			n := r.n
			if n == nil {
				return fmt.Errorf("node record for inode %d without a node", r.ino)
			}
			if n.blob >= s.nextBlob {
				s.nextBlob = n.blob + 1
			}
			if n.isDir() && (n.entries == nil || r.child == 1) {
				n.entries = emptyEntries
				if old := t.get(r.ino); old != nil && old.isDir() && r.child == 0 {
					n.entries = old.entries
				}
			}
			t.put(r.ino, n)
		case opEntry:
			if d := t.get(r.ino); d == nil || !d.isDir() || d.entries == nil {
				return fmt.Errorf("entry %q in missing directory %d", r.name, r.ino)
			}
			t.setEntry(r.ino, r.name, r.child)
		case opDrop:
			t.drop(r.ino)
		}
	case opSnapshot:
		return s.applySnapshot(r)
	case opSnapshotTree:
		sn := s.snaps[parseSnapKey(r.snap)]
		if sn == nil {
			return fmt.Errorf("tree of missing snapshot %s", r.snap)
		}
		st := &sessState{t: newTree(r.time, 0, 0), quota: Quota{int64(r.a), int64(r.b)}, created: r.time}
		if live := s.sessions[r.sess]; live != nil && r.child == 1 {
			st.t = live.t
		}
		sn.trees[r.sess] = st
	case opSnapshotDelete:
		delete(s.snaps, snapKey{r.sess, r.name})
		s.gcWanted = true
	case opRestore:
		return s.applyRestore(r)
	case opBranch:
		sn := s.snaps[snapKey{r.sess, r.name}]
		if sn == nil || sn.trees[r.name2] == nil || s.sessions[r.snap] != nil {
			return fmt.Errorf("branch %q from missing snapshot %s/%s of %q", r.snap, r.sess, r.name, r.name2)
		}
		st := sn.trees[r.name2]
		s.gen++
		sess := &session{name: r.snap, gen: s.gen, created: r.time, t: st.t, quota: st.quota, shared: s.epoch}
		sess.resetHandles()
		s.sessions[r.snap] = sess
		s.epoch++
	default:
		return fmt.Errorf("unknown journal record kind %d", r.op)
	}
	return nil
}

// target returns the tree a node record changes: a live session's, or a
// snapshot's copy of it.
func (s *Store) target(r *record) (*tree, error) {
	if r.snap == "" {
		sess := s.sessions[r.sess]
		if sess == nil {
			return nil, fmt.Errorf("record for missing session %q", r.sess)
		}
		return &sess.t, nil
	}
	sn := s.snaps[parseSnapKey(r.snap)]
	if sn == nil || sn.trees[r.sess] == nil {
		return nil, fmt.Errorf("record for missing snapshot %s of %q", r.snap, r.sess)
	}
	return &sn.trees[r.sess].t, nil
}

func (s *Store) applySnapshot(r *record) error {
	key := snapKey{r.sess, r.name}
	sn := &snapshot{key: key, created: r.time, trees: map[string]*sessState{}}
	s.snaps[key] = sn
	if r.child == 1 { // from a checkpoint: trees follow as opSnapshotTree records
		sn.epoch = r.ino
		return nil
	}
	sn.epoch = s.epoch
	for name, sess := range s.sessions {
		if key.scope != "" && name != key.scope {
			continue
		}
		sn.trees[name] = &sessState{t: sess.t, quota: sess.quota, created: sess.created}
		sess.shared = s.epoch
	}
	s.epoch++
	return nil
}

func (s *Store) applyRestore(r *record) error {
	sn := s.snaps[snapKey{r.sess, r.name}]
	if sn == nil {
		return fmt.Errorf("restore from missing snapshot %s/%s", r.sess, r.name)
	}
	if r.sess == "" { // the whole tree: sessions become exactly the snapshot's
		for name := range s.sessions {
			if sn.trees[name] == nil {
				s.apply(&record{op: opSessionDelete, sess: name})
			}
		}
	}
	for name, st := range sn.trees {
		s.gen++
		sess := s.sessions[name]
		if sess == nil {
			sess = &session{name: name, created: st.created, quota: st.quota}
			s.sessions[name] = sess
		}
		sess.gen, sess.t, sess.shared = s.gen, st.t, s.epoch
		sess.resetHandles()
	}
	s.epoch++
	s.gcWanted = true
	return nil
}

// flusher, every TidyInterval, deletes (or recycles) blobs whose last
// reference is durably gone, collects garbage after snapshots or sessions
// go away, and checkpoints a long journal.
func (s *Store) flusher() {
	defer s.wg.Done()
	tick := time.NewTicker(s.opts.TidyInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		if err := s.flushAndCollect(); err != nil {
			s.events.publish(Event{Op: OpError, Path: err.Error()})
		}
	}
}

func (s *Store) flushAndCollect() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.finish()
	// A failed write is retried here; a full journal must not stop the
	// deletions below, which are how space comes back.
	err := s.j.flush()
	deletes := s.deletes
	s.deletes = nil
	if len(deletes) > 0 {
		s.tidying.Store(true) // before the lock goes: deletes look done
		defer s.tidying.Store(false)
	}
	gc := s.gcWanted
	s.gcWanted = false
	big := s.j.n > s.opts.CheckpointBytes
	refill := !s.reserveOK
	s.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("write workspace journal: %w", err)
	}
	if len(deletes) > 0 {
		// The records that dropped these blobs must outlive the blobs.
		if serr := s.Sync(); serr != nil {
			s.mu.Lock()
			s.deletes = append(s.deletes, deletes...) // next time
			s.mu.Unlock()
			return errors.Join(err, serr)
		}
		s.recycle(deletes)
	}
	if gc {
		s.collectGarbage()
	}
	if refill {
		s.refillReserve()
	}
	if big && err == nil {
		return s.Checkpoint()
	}
	return err
}

// recycleMax bounds the pool that recycle fills: that many empty blob
// files (an inode each on the backing filesystem, no data) may wait for
// new files. A tree of small files deleted and written again (a build
// output, node_modules) then reuses its inodes: emptying a file costs
// the backing filesystem far less than deleting one and making another,
// and ext4 makes new inodes slowly while many were freed recently.
const recycleMax = 1 << 15

// empty truncates the file at p to nothing. It opens the file with
// O_TRUNC rather than truncate(2): ext4 marks a file cut to zero to have
// its next data flushed when it is closed (auto_da_alloc, for programs
// that rewrite a file in place), and closing it here, empty, clears the
// mark cheaply, so the new file's close does not wait for writeback.
func empty(p string) error {
	fd, err := openFd(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	return closeFd(fd)
}

// recycle empties dead blobs into the pool of blobs for new files, which
// spares the backing filesystem a delete and a create each, and deletes
// those the pool has no room for.
func (s *Store) recycle(dead []uint64) {
	for _, b := range dead {
		s.mu.Lock()
		room := !s.closed && len(s.reserved) < recycleMax // reserved includes the pool
		if room {
			s.reserved[b] = true
		}
		s.mu.Unlock()
		if !room || empty(s.blobPath(b)) != nil {
			if room {
				s.mu.Lock()
				delete(s.reserved, b)
				s.mu.Unlock()
			}
			os.Remove(s.blobPath(b))
			continue
		}
		s.mu.Lock()
		s.pool = append(s.pool, b)
		s.mu.Unlock()
	}
}

// Sync makes every change made so far durable.
func (s *Store) Sync() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.finish()
	err := s.j.flush()
	f := s.j.f
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("write workspace journal: %w", err)
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("sync workspace journal: %w", err)
	}
	return nil
}

// collectGarbage deletes blobs that neither a live tree nor a snapshot
// references any more. Trees are immutable, so they are walked unlocked.
func (s *Store) collectGarbage() {
	s.mu.RLock()
	var trees []tree
	for _, sess := range s.sessions {
		trees = append(trees, sess.t)
	}
	for _, sn := range s.snaps {
		for _, st := range sn.trees {
			trees = append(trees, st.t)
		}
	}
	limit := s.nextBlob
	live := map[uint64]bool{}
	for id := range s.reserved {
		live[id] = true
	}
	s.mu.RUnlock()
	for _, t := range trees {
		t.blobs(func(b uint64, _ int64) { live[b] = true })
	}
	ents, err := os.ReadDir(filepath.Join(s.dir, "blobs"))
	if err != nil {
		return
	}
	var dead []uint64
	for _, e := range ents {
		if id, err := strconv.ParseUint(e.Name(), 16, 64); err == nil && id < limit && !live[id] {
			dead = append(dead, id)
		}
	}
	if len(dead) == 0 || s.Sync() != nil {
		return
	}
	for _, b := range dead {
		os.Remove(s.blobPath(b))
	}
}

// Checkpoint writes the whole state to a new checkpoint file and starts a
// new journal, so a restart replays little. Snapshots are written as
// differences from the live tree, which keeps their sharing after a load.
func (s *Store) Checkpoint() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.finish()
	if err := s.j.flush(); err != nil {
		s.mu.Unlock()
		return err
	}
	next := s.jseq + 1
	nf, err := os.OpenFile(s.journalPath(next), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("checkpoint: %w", err)
	}
	old := s.j
	s.j, s.jseq = newJournalWriter(nf, 0), next
	state := s.captureLocked()
	s.mu.Unlock()

	if err := old.f.Sync(); err != nil {
		return fmt.Errorf("checkpoint: sync journal: %w", err)
	}
	old.f.Close()
	if err := s.writeCheckpoint(state, next); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for seq := next - 1; seq > 0; seq-- {
		if os.Remove(s.journalPath(seq)) != nil {
			break
		}
	}
	return nil
}

type capture struct {
	epoch, gen, nextBlob uint64
	sessions             []*session
	snaps                []*snapshot
}

func (s *Store) captureLocked() capture {
	c := capture{epoch: s.epoch, gen: s.gen, nextBlob: s.nextBlob}
	for _, sess := range s.sessions {
		cp := *sess
		c.sessions = append(c.sessions, &cp)
	}
	for _, sn := range s.snaps {
		cp := *sn
		cp.trees = map[string]*sessState{}
		for k, v := range sn.trees {
			st := *v
			cp.trees[k] = &st
		}
		c.snaps = append(c.snaps, &cp)
	}
	sort.Slice(c.sessions, func(i, j int) bool { return c.sessions[i].name < c.sessions[j].name })
	sort.Slice(c.snaps, func(i, j int) bool { return c.snaps[i].created < c.snaps[j].created })
	return c
}

func (s *Store) writeCheckpoint(c capture, startSeq uint64) error {
	path := filepath.Join(s.dir, "checkpoint")
	atomicfile.RemoveTemps(path) // a crash's, as large as a checkpoint; only this writes one
	return atomicfile.Write(path, 0o600, func(f *os.File) error {
		return writeCapture(f, c, startSeq)
	})
}

// writeCapture writes c to f as the records of a checkpoint.
func writeCapture(f *os.File, c capture, startSeq uint64) error {
	w := newJournalWriter(f, 0)
	w.stream = true
	w.append(&record{op: opHeader, ino: startSeq, a: c.epoch, b: c.gen, c: c.nextBlob})
	live := map[string]*tree{}
	for _, sess := range c.sessions {
		w.append(&record{op: opSession, sess: sess.name, time: sess.created, a: sess.shared})
		w.append(&record{op: opQuota, sess: sess.name, a: uint64(sess.quota.Bytes), b: uint64(sess.quota.Inodes)})
		writeTree(w, sess.name, "", &sess.t, nil)
		live[sess.name] = &sess.t
	}
	for _, sn := range c.snaps {
		w.append(&record{op: opSnapshot, sess: sn.key.scope, name: sn.key.name, time: sn.created, ino: sn.epoch, child: 1})
		for name, st := range sn.trees {
			base := live[name]
			r := &record{op: opSnapshotTree, snap: sn.key.String(), sess: name, time: st.created,
				a: uint64(st.quota.Bytes), b: uint64(st.quota.Inodes)}
			if base != nil {
				r.child = 1
			}
			w.append(r)
			writeTree(w, name, sn.key.String(), &st.t, base)
		}
	}
	return errors.Join(w.err, w.flush())
}

// writeTree writes t as records; with a base tree, only what differs.
func writeTree(w *journalWriter, sess, snap string, t, base *tree) {
	it := t.inodes.Iterator()
	for !it.Done() {
		ino, n, _ := it.Next()
		if base != nil && base.get(ino) == n {
			continue
		}
		w.append(&record{op: opPut, sess: sess, snap: snap, ino: ino, n: n, child: 1})
		if n.isDir() {
			e := n.entries.Iterator()
			for !e.Done() {
				name, child, _ := e.Next()
				w.append(&record{op: opEntry, sess: sess, snap: snap, ino: ino, name: name, child: child})
			}
		}
	}
	if base == nil {
		return
	}
	it = base.inodes.Iterator()
	for !it.Done() {
		ino, _, _ := it.Next()
		if t.get(ino) == nil {
			w.append(&record{op: opDrop, sess: sess, snap: snap, ino: ino})
		}
	}
}

// Close flushes, checkpoints and closes the store. Mounted views must be
// unmounted first. Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
	err := s.Checkpoint()
	s.mu.Lock()
	s.closed = true
	// The pool stays on disk for the next Open to adopt: deleting (and
	// later making again) thousands of empty files is what it saves.
	s.pool = nil
	s.finish()
	if ferr := s.j.flush(); err == nil {
		err = ferr
	}
	s.j.f.Close()
	s.mu.Unlock()
	s.events.Close()
	return err
}

// Events returns the bus that carries file events.
func (s *Store) Events() *Bus { return s.events }

// SubscribeSettled subscribes to the store's events like
// Events().Subscribe, for a subscriber that follows session, first
// settling the session's files open for writing through any view: what their writers wrote until now is recorded and announced to
// the subscribers before this one. The kernel tells the store that a file
// was closed on its own time, after close(2) has returned (a release);
// without this, the written event of a write finished before the call
// could reach the new subscriber as if the write came after it. Its
// written events are for writes after the call (a file still open is
// announced at its close, if written after the call).
func (s *Store) SubscribeSettled(session string, buf int) *Subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.views {
		v.settleWritersLocked(session)
	}
	return s.events.Subscribe(buf)
}

// Reflink reports whether the backing filesystem clones files, so that a
// file changed after a snapshot is not copied whole.
func (s *Store) Reflink() bool { return s.reflink }
