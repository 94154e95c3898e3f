package fs

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// op names one kind of change. The journal holds records; apply (store.go)
// is the only code that changes the store's state, live or on replay, so a
// replayed journal rebuilds exactly the state it recorded.
type op uint8

const (
	opHeader         op = iota + 1 // checkpoint header: counters
	opSession                      // create session sess
	opSessionDelete                // delete session sess
	opSessionRename                // rename session sess to name
	opQuota                        // set quota of sess
	opPut                          // store node n as ino in sess (or in a snapshot's copy)
	opEntry                        // set entry name in directory ino to child (0 removes it)
	opDrop                         // remove inode ino
	opSnapshot                     // take snapshot name of scope sess ("" is the whole tree)
	opSnapshotTree                 // checkpoint: add session name to snapshot (scope sess) from the live tree
	opSnapshotDelete               // delete snapshot name of scope sess
	opRestore                      // restore scope sess from snapshot name
	opBranch                       // new session name2 from session name in snapshot (scope sess)
	opBatch                        // the next a records are one operation: replay applies all or none
)

// record is one journal entry. Fields a kind does not use stay zero, and
// zero varints cost one byte each.
type record struct {
	op    op
	sess  string // the session (or snapshot scope) the record is about
	name  string // entry name, snapshot name, or new session name
	name2 string
	snap  string // when set, opPut/opEntry/opDrop change this snapshot's copy of sess
	ino   uint64
	child uint64
	time  int64
	a, b  uint64 // opQuota: bytes, inodes; opHeader: epoch, gen
	c     uint64 // opHeader: next blob
	n     *node
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func (r *record) encode(b []byte) []byte {
	b = append(b, byte(r.op))
	b = appendString(b, r.sess)
	b = appendString(b, r.name)
	b = appendString(b, r.name2)
	b = appendString(b, r.snap)
	for _, v := range []uint64{r.ino, r.child, uint64(r.time), r.a, r.b, r.c} {
		b = binary.AppendUvarint(b, v)
	}
	if r.n == nil {
		return append(b, 0)
	}
	n := r.n
	b = append(b, 1)
	for _, v := range []uint64{uint64(n.mode), uint64(n.uid), uint64(n.gid), uint64(n.nlink), uint64(n.rdev),
		uint64(n.size), uint64(n.atime), uint64(n.mtime), uint64(n.ctime), n.blob, n.birth, n.parent} {
		b = binary.AppendUvarint(b, v)
	}
	b = appendString(b, n.target)
	b = appendString(b, n.dname)
	b = binary.AppendUvarint(b, uint64(len(n.xattrs)))
	for k, v := range n.xattrs {
		b = appendString(b, k)
		b = appendString(b, string(v))
	}
	return b
}

var errCorrupt = errors.New("corrupt journal record")

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	l := d.uvarint()
	if d.err != nil || l > uint64(len(d.b)) {
		d.err = errCorrupt
		return ""
	}
	s := string(d.b[:l])
	d.b = d.b[l:]
	return s
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = errCorrupt
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func decodeRecord(b []byte) (*record, error) {
	d := &decoder{b: b}
	r := &record{op: op(d.byte())}
	r.sess, r.name, r.name2, r.snap = d.string(), d.string(), d.string(), d.string()
	r.ino, r.child, r.time = d.uvarint(), d.uvarint(), int64(d.uvarint())
	r.a, r.b, r.c = d.uvarint(), d.uvarint(), d.uvarint()
	if d.byte() == 1 {
		n := &node{}
		n.mode, n.uid, n.gid = uint32(d.uvarint()), uint32(d.uvarint()), uint32(d.uvarint())
		n.nlink, n.rdev = uint32(d.uvarint()), uint32(d.uvarint())
		n.size, n.atime, n.mtime, n.ctime = int64(d.uvarint()), int64(d.uvarint()), int64(d.uvarint()), int64(d.uvarint())
		n.blob, n.birth, n.parent = d.uvarint(), d.uvarint(), d.uvarint()
		n.target, n.dname = d.string(), d.string()
		if k := d.uvarint(); k > 0 && d.err == nil {
			n.xattrs = make(map[string][]byte, min(k, 1024))
			for range k {
				if d.err != nil {
					break
				}
				name := d.string()
				n.xattrs[name] = []byte(d.string())
			}
		}
		r.n = n
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errCorrupt
	}
	return r, nil
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// journalWriter appends framed records: uvarint length, payload, CRC-32C.
// A torn last frame (a crash mid-append) fails its CRC and ends the replay.
//
// Records collect in buf until flush writes them with one write(2). A
// failed write (a full disk) is cut back to the last whole record, so the
// file never holds a torn frame that later records would follow (replay
// stops at the first bad frame: they would be lost), and the writer keeps
// no sticky error: the next flush tries again.
type journalWriter struct {
	f      *os.File
	buf    []byte // framed records not yet written
	enc    []byte
	good   int64 // file offset just past the last record written whole
	torn   bool  // a failed write left bytes past good that are not cut yet
	n      int64 // bytes written since the file was opened
	stream bool  // write out every MiB (checkpoints) instead of on flush only
	err    error // first error of a streaming writer
}

// newJournalWriter appends to f, whose intact records end at good.
func newJournalWriter(f *os.File, good int64) *journalWriter {
	return &journalWriter{f: f, good: good}
}

func (j *journalWriter) append(r *record) {
	j.buf = j.frame(j.buf, r)
	if j.stream && len(j.buf) >= 1<<20 {
		if err := j.flush(); err != nil && j.err == nil {
			j.err = err
		}
	}
}

// flush writes the buffered records. On failure the file is cut back to
// its last whole record (or will be, before the next write) and the
// records stay buffered: the caller retries or discards them.
func (j *journalWriter) flush() error {
	if j.torn {
		if err := j.f.Truncate(j.good); err != nil {
			return fmt.Errorf("cut torn journal record: %w", err)
		}
		j.torn = false
	}
	if len(j.buf) == 0 {
		return nil
	}
	n, err := j.f.Write(j.buf) // O_APPEND: at the end, which is good
	if err == nil {
		j.good += int64(n)
		j.n += int64(n)
		j.buf = j.buf[:0]
		return nil
	}
	if n > 0 {
		j.torn = j.f.Truncate(j.good) != nil
	}
	return err
}

// frame appends r, framed, to b.
func (j *journalWriter) frame(b []byte, r *record) []byte {
	j.enc = r.encode(j.enc[:0])
	b = binary.AppendUvarint(b, uint64(len(j.enc)))
	b = append(b, j.enc...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(j.enc, crcTable))
}

// group makes the n records buffered from offset mark on one operation
// for replay, by putting an opBatch record before them.
func (j *journalWriter) group(mark, n int) {
	hdr := j.frame(nil, &record{op: opBatch, a: uint64(n)})
	j.buf = append(j.buf, hdr...)
	copy(j.buf[mark+len(hdr):], j.buf[mark:len(j.buf)-len(hdr)])
	copy(j.buf[mark:], hdr)
}

// discard drops buffered records from offset mark on.
func (j *journalWriter) discard(mark int) { j.buf = j.buf[:mark] }

// readJournal calls fn for each intact record of r in order; the records
// of an opBatch group only once the whole group is there. It returns the
// offset just past the last intact record or group, so a torn tail (a
// partial group included) can be cut off.
func readJournal(r io.Reader, fn func(*record) error) (int64, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var off, pos int64 // past the last complete record or group; past the last frame read
	var group []*record
	want := 0 // records the open group still lacks
	for {
		rec, n, err := readFrame(br)
		if n == 0 {
			return off, nil // clean end, or a torn frame
		}
		if err != nil {
			return off, fmt.Errorf("journal offset %d: %w", pos, err)
		}
		pos += n
		switch {
		case rec.op == opBatch && want > 0:
			return off, fmt.Errorf("journal offset %d: group inside a group: %w", pos-n, errCorrupt)
		case rec.op == opBatch:
			want, group = int(min(rec.a, 1<<30)), group[:0]
			if want == 0 {
				off = pos
			}
			continue
		case want > 0:
			group = append(group, rec)
			if want--; want > 0 {
				continue
			}
		default:
			group = append(group[:0], rec)
		}
		for _, g := range group {
			if err := fn(g); err != nil {
				return off, fmt.Errorf("journal offset %d: %w", pos-n, err)
			}
		}
		off = pos
	}
}

// readFrame reads one framed record and its size; size 0 means the end of
// the intact frames (the end of r, or a torn or damaged frame).
func readFrame(br *bufio.Reader) (*record, int64, error) {
	l, err := binary.ReadUvarint(br)
	if err != nil || l > 64<<20 {
		return nil, 0, nil
	}
	frame := make([]byte, l+4)
	if _, err := io.ReadFull(br, frame); err != nil {
		return nil, 0, nil
	}
	payload := frame[:l]
	if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(frame[l:]) {
		return nil, 0, nil
	}
	rec, err := decodeRecord(payload)
	return rec, int64(uvarintLen(l)) + int64(l) + 4, err
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}
