package fs

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// realJournal makes a journal with the Go API: sessions, files,
// directories, a snapshot, a branch, a restore, deletions and renames.
func realJournal(t testing.TB) []byte {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(Options{Dir: dir, TidyInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.CreateSession("a1", Owner{UID: 1000, GID: 1000}))
	must(s.CreateSession("b1", Owner{}))
	for i := range 4 {
		_, err := s.WriteFile("a1", fmt.Sprintf("outputs/f%d", i), strings.NewReader(strings.Repeat("x", i*100)), 0, Owner{UID: 1000})
		must(err)
	}
	must(s.MkdirAll("a1", "inputs/deep/er", Owner{}))
	must(s.SetQuota("b1", Quota{Bytes: 1 << 20, Inodes: 100}))
	must(s.Snapshot("a1", "v1"))
	must(s.Snapshot("", "all"))
	_, err = s.WriteFile("a1", "outputs/f1", strings.NewReader("replaced"), 0, Owner{})
	must(err)
	must(s.Branch("a1", "v1", "", "c1"))
	must(s.Restore("a1", "v1"))
	must(s.RenameSession("b1", "b2"))
	must(s.DeleteSnapshot("", "all"))
	must(s.DeleteSession("c1"))
	must(s.Sync())
	seqs, err := s.journalSeqs()
	if err != nil || len(seqs) != 1 {
		t.Fatalf("journals %v, %v; want one", seqs, err)
	}
	b, err := os.ReadFile(s.journalPath(seqs[0]))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// bareLoad loads a state directory as Open does, without the background
// goroutines, so that a fuzz run is cheap.
func bareLoad(dir string) (*Store, error) {
	s := &Store{dir: dir, opts: Options{Dir: dir, ReserveBytes: 4096}, sessions: map[string]*session{},
		snaps: map[snapKey]*snapshot{}, epoch: 1, nextBlob: 1, events: NewBus(),
		makeMore: make(chan struct{}, 1), reserved: map[uint64]bool{}}
	os.MkdirAll(filepath.Join(dir, "blobs"), 0o700)
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// dumpState prints everything the journal rebuilds, in a stable order.
func dumpState(s *Store) string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d gen %d\n", s.epoch, s.gen)
	dumpTree := func(t *tree) {
		var inos []uint64
		it := t.inodes.Iterator()
		for !it.Done() {
			ino, _, _ := it.Next()
			inos = append(inos, ino)
		}
		slices.Sort(inos)
		fmt.Fprintf(&b, " next %d bytes %d\n", t.next, t.bytes)
		for _, ino := range inos {
			n := t.get(ino)
			fmt.Fprintf(&b, " %d: %o %d:%d n%d s%d b%d/%d p%d %q %q", ino, n.mode, n.uid, n.gid, n.nlink, n.size, n.blob, n.birth, n.parent, n.target, n.dname)
			if n.entries != nil {
				e := n.entries.Iterator()
				for !e.Done() {
					name, child, _ := e.Next()
					fmt.Fprintf(&b, " %s=%d", name, child)
				}
			}
			keys := make([]string, 0, len(n.xattrs))
			for k := range n.xattrs {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(&b, " x%s=%q", k, n.xattrs[k])
			}
			b.WriteString("\n")
		}
	}
	names := make([]string, 0, len(s.sessions))
	for n := range s.sessions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		sess := s.sessions[n]
		fmt.Fprintf(&b, "session %s quota %v shared %d\n", n, sess.quota, sess.shared)
		dumpTree(&sess.t)
	}
	keys := make([]string, 0, len(s.snaps))
	for k := range s.snaps {
		keys = append(keys, k.String())
	}
	sort.Strings(keys)
	for _, k := range keys {
		sn := s.snaps[parseSnapKey(k)]
		fmt.Fprintf(&b, "snapshot %s epoch %d\n", k, sn.epoch)
		var in []string
		for n := range sn.trees {
			in = append(in, n)
		}
		sort.Strings(in)
		for _, n := range in {
			fmt.Fprintf(&b, " of %s quota %v\n", n, sn.trees[n].quota)
			dumpTree(&sn.trees[n].t)
		}
	}
	return b.String()
}

// reframe recomputes every frame's checksum, so that changed payloads
// reach decoding and apply instead of ending the replay.
func reframe(j []byte) []byte {
	var out []byte
	for len(j) > 0 {
		l, n := binary.Uvarint(j)
		if n <= 0 || l > uint64(len(j)-n) {
			return append(out, j...)
		}
		p := j[n : n+int(l)]
		out = binary.AppendUvarint(out, l)
		out = append(out, p...)
		out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(p, crcTable))
		j = j[min(len(j), n+int(l)+4):]
	}
	return out
}

// FuzzJournalReplay damages a journal (a flipped byte, a cut tail) and
// replays it. Replay must never panic; every record before the damage must
// be in the state it rebuilds, nothing after it; and an operation made
// after the replay must survive the next one (the damaged tail was cut, so
// new records do not hide behind it). With reframe set the damage gets a
// valid checksum, which exercises decoding and apply: they may refuse the
// journal with an error, never panic.
func FuzzJournalReplay(f *testing.F) {
	j := realJournal(f)
	f.Add(j, uint32(0), byte(0), uint32(len(j)), false)
	f.Add(j, uint32(len(j)/2), byte(0x40), uint32(len(j)), false)
	f.Add(j, uint32(0), byte(0), uint32(len(j)-3), false)
	f.Add(j, uint32(len(j)/3), byte(1), uint32(len(j)), true)
	f.Add(j, uint32(17), byte(0xff), uint32(len(j)), true)
	// A flip that makes a valid frame (empty payload, checksum 0) which
	// does not decode: a refusal, as with reframed damage.
	f.Add([]byte{1, 0, 0, 0, 0}, uint32(0), byte(1), uint32(5), false)
	// Records a damaged journal could hold with a valid checksum: about
	// sessions, snapshots and nodes that do not exist, or without a node.
	for _, r := range []*record{
		{op: opSessionRename, sess: "nope", name: "x"},
		{op: opQuota, sess: "nope"},
		{op: opSnapshotTree, snap: "nope/x", sess: "nope"},
		{op: opBranch, sess: "nope", name: "x", name2: "y", snap: "z"},
		{op: opRestore, sess: "nope", name: "x"},
		{op: opPut, sess: "a1", ino: 5},
		{op: opEntry, sess: "a1", ino: 9, name: "x", child: 2},
		{op: opDrop, sess: "a1", ino: 99},
		{op: 200},
	} {
		w := &journalWriter{}
		w.append(&record{op: opSession, sess: "a1"})
		w.append(&record{op: opPut, sess: "a1", ino: 9, n: &node{mode: 0o100644, nlink: 1}})
		w.append(r)
		f.Add(w.buf, uint32(0), byte(0), uint32(len(w.buf)), false)
	}
	// A group cut short, and one that claims more records than follow.
	w := &journalWriter{}
	w.append(&record{op: opSession, sess: "a1"})
	w.append(&record{op: opBatch, a: 3})
	w.append(&record{op: opPut, sess: "a1", ino: 2, n: &node{mode: 0o100644, nlink: 1}})
	w.append(&record{op: opEntry, sess: "a1", ino: rootIno, name: "f", child: 2})
	f.Add(w.buf, uint32(0), byte(0), uint32(len(w.buf)), false)
	w.append(&record{op: opBatch, a: 1 << 40})
	f.Add(w.buf, uint32(0), byte(0), uint32(len(w.buf)), true)
	f.Fuzz(func(t *testing.T, journal []byte, at uint32, xor byte, cut uint32, reframed bool) {
		if len(journal) > 1<<16 {
			return
		}
		damaged := bytes.Clone(journal)
		end := int(cut) % (len(damaged) + 1)
		damageAt := end
		if xor != 0 && len(damaged) > 0 {
			p := int(at) % len(damaged)
			damaged[p] ^= xor
			damageAt = min(damageAt, p)
		}
		damaged = damaged[:end]
		if damageAt < end && frameIntact(damaged, frameStart(journal, damageAt)) {
			// The flipped byte left its frame's checksum valid: the
			// fuzzer, which writes the whole journal, made a collision
			// that real damage makes once in 2^32. That is the reframed
			// case, where a refusal is a right answer.
			reframed = true
		}
		if reframed {
			damaged = reframe(damaged)
		}
		got, err := replayDir(t, damaged)
		if reframed {
			if err == nil {
				got.j.f.Close()
			}
			return // no panic is all that is asked
		}
		want, werr := replayDir(t, journal[:damageAt])
		if werr != nil {
			return // the undamaged prefix is itself refused: nothing to compare
		}
		defer want.j.f.Close()
		if err != nil {
			t.Fatalf("replay of a journal damaged at %d failed (%v), though its intact prefix replays", damageAt, err)
		}
		if g, w := dumpState(got), dumpState(want); g != w {
			t.Fatalf("replay of a journal damaged at %d rebuilt\n%s\nwant (its intact prefix)\n%s", damageAt, g, w)
		}
		// The journal goes on: a new operation survives the next replay.
		name := "after-damage"
		if got.sessions[name] != nil {
			name = "after-damage2"
		}
		if err := got.CreateSession(name, Owner{}); err != nil {
			got.j.f.Close()
			if got.sessions[name] != nil {
				t.Fatalf("CreateSession failed (%v) but the session is there", err)
			}
			return // e.g. a damaged state refuses it cleanly
		}
		before := dumpState(got)
		got.j.f.Close()
		again, err := bareLoad(got.dir)
		if err != nil {
			t.Fatalf("replay after an operation on the repaired journal: %v", err)
		}
		defer again.j.f.Close()
		if after := dumpState(again); after != before {
			t.Fatalf("operation after the damage lost by the next replay:\n%s\nwant\n%s", after, before)
		}
	})
}

// frameStart is the offset of the frame of j that holds byte p: the
// first frame that is torn, fails its checksum or reaches past p.
func frameStart(j []byte, p int) int {
	off := 0
	for off <= p {
		l, n := binary.Uvarint(j[off:])
		if n <= 0 || l > uint64(len(j)-off-n) || len(j)-off-n-int(l) < 4 {
			return off
		}
		end := off + n + int(l) + 4
		if !frameIntact(j, off) || end > p {
			return off
		}
		off = end
	}
	return off
}

// frameIntact reports whether a whole frame with a valid checksum starts
// at offset off of j.
func frameIntact(j []byte, off int) bool {
	if off >= len(j) {
		return false
	}
	l, n := binary.Uvarint(j[off:])
	if n <= 0 || l > uint64(len(j)-off-n) || len(j)-off-n-int(l) < 4 {
		return false
	}
	payload := j[off+n : off+n+int(l)]
	return crc32.Checksum(payload, crcTable) == binary.LittleEndian.Uint32(j[off+n+int(l):])
}

// replayDir writes journal as a state directory's only journal and loads it.
func replayDir(t *testing.T, journal []byte) (*Store, error) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "journal.0000000000000001"), journal, 0o600); err != nil {
		t.Fatal(err)
	}
	return bareLoad(dir)
}

// TestTornGroupDroppedWhole: an operation's records are one group; a
// crash that kept only part of it (power loss mid-write) must not replay
// half an operation, and the cut must leave room for new records.
func TestTornGroupDroppedWhole(t *testing.T) {
	j := realJournal(t) // its multi-record operations are groups
	var groups int
	if _, err := readJournal(bytes.NewReader(j), func(*record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for rest := bufio.NewReader(bytes.NewReader(j)); ; {
		r, n, _ := readFrame(rest)
		if n == 0 {
			break
		}
		if r.op == opBatch {
			groups++
		}
	}
	if groups == 0 {
		t.Fatal("no opBatch group in a journal of multi-record operations")
	}
	w := &journalWriter{}
	w.append(&record{op: opSession, sess: "a1"})
	whole := int64(len(w.buf))
	w.append(&record{op: opBatch, a: 3})
	w.append(&record{op: opPut, sess: "a1", ino: 2, n: &node{mode: 0o100644, nlink: 1}})
	w.append(&record{op: opEntry, sess: "a1", ino: rootIno, name: "half", child: 2})
	s, err := replayDir(t, w.buf) // the group's third record never came
	if err != nil {
		t.Fatal(err)
	}
	if _, n := s.sessions["a1"].t.lookup(rootIno, "half"); n != nil || s.sessions["a1"].t.get(2) != nil {
		t.Fatal("replay applied part of a torn group")
	}
	if fi, err := s.j.f.Stat(); err != nil || fi.Size() != whole {
		t.Fatalf("journal cut to %v (%v), want %d: the torn group must go", fi.Size(), err, whole)
	}
	if err := s.CreateSession("b1", Owner{}); err != nil {
		t.Fatal(err)
	}
	s.j.f.Close()
	again, err := bareLoad(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer again.j.f.Close()
	if again.sessions["b1"] == nil || again.sessions["b1"].t.files() != 4 {
		t.Fatal("the operation after the cut did not replay whole")
	}
}
