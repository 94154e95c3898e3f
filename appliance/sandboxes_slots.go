package appliance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"hearth/internal/atomicfile"
)

// Record slots. A create is acknowledged only once its sandbox's record
// is on disk for good, and an atomic write of a new file costs two
// journal commits (the file's fsync, then its directory's), the slowest
// part of a create from a prepared jail, stalling the claim's own file
// operations meanwhile. So files of recordSlotSize newlines are made,
// synced with their directory, ahead of time in <state_dir>/sandbox-slots;
// a new record overwrites one in place, padded with newlines to the same
// size, and is made durable with one fdatasync that commits no metadata
// (same blocks, same size), then renamed to sandboxes/<id>.json without
// waiting for that rename to be durable: until it is, the slot holds the
// record where a crash leaves it, and recoverSlots puts it in place at
// the next start. A record that does not fit, or a create that finds no
// slot ready, is written the usual way.

const (
	recordSlotSize = 4096 // one filesystem block: overwritten whole or not at all
	recordSlots    = 4    // kept ready
	// slotSettle is how long after a slot is used its replacement is
	// made: its two syncs, made at once, were journal commits in the
	// middle of the next steps of the create (the claim's renames) and
	// of its first commands.
	slotSettle = 250 * time.Millisecond
)

// slotPool is the slots ready for new records.
type slotPool struct {
	dir    string
	mu     sync.Mutex
	free   []string
	refill chan struct{} // asks fillSlots for more
}

func (m *sandboxManager) slotsDir() string {
	return filepath.Join(filepath.Dir(m.dir), "sandbox-slots")
}

// recoverSlots puts back in sandboxes/ the records a crash left in
// slots only, and removes the other slots: fillSlots makes new ones. It
// runs before recoverAll reads the records.
func (m *sandboxManager) recoverSlots() error {
	dir := m.slotsDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	moved := false
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if id := slotRecordID(p); id != "" {
			dst := filepath.Join(m.dir, id+".json")
			if _, err := os.Lstat(dst); errors.Is(err, os.ErrNotExist) {
				if err := os.Rename(p, dst); err != nil {
					return fmt.Errorf("recover sandbox %s's record from %s: %w", id, p, err)
				}
				m.log.Info("sandbox: record recovered from its slot", "id", id)
				moved = true
				continue
			}
		}
		os.Remove(p) // free, torn, or already in place
	}
	if moved {
		if err := atomicfile.SyncDir(m.dir); err != nil {
			return err
		}
	}
	m.slots = &slotPool{dir: dir, refill: make(chan struct{}, 1)}
	return nil
}

// slotRecordID is the id of the record slot p holds, "" if it holds
// none (a free slot, or one whose write a crash cut short).
func slotRecordID(p string) string {
	b, err := os.ReadFile(p)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	var rec sandboxRecord
	if json.Unmarshal(b, &rec) != nil || validSandboxID(rec.ID) != nil {
		return ""
	}
	return rec.ID
}

// fillSlots keeps recordSlots slots ready until the manager stops.
func (m *sandboxManager) fillSlots() {
	defer m.wg.Done()
	for {
		for m.slots.count() < recordSlots {
			p, err := newSlot(m.slots.dir)
			if err != nil {
				m.log.Warn("sandbox: prepare a record slot (creates write their records the slower way)", "err", err)
				break
			}
			m.slots.put(p)
		}
		select {
		case <-m.stop:
			return
		case <-m.slots.refill:
		}
		select {
		case <-m.stop:
			return
		case <-time.After(slotSettle):
		}
	}
}

// newSlot makes a free slot in dir, durable with its name.
func newSlot(dir string) (string, error) {
	f, err := os.CreateTemp(dir, "slot-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(bytes.Repeat([]byte{'\n'}, recordSlotSize))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = atomicfile.SyncDir(dir)
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("record slot: %w", err)
	}
	return f.Name(), nil
}

func (p *slotPool) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

func (p *slotPool) put(path string) {
	p.mu.Lock()
	p.free = append(p.free, path)
	p.mu.Unlock()
}

// take returns a free slot, "" if none is ready.
func (p *slotPool) take() string {
	if p == nil {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return ""
	}
	path := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return path
}

// used asks fillSlots for another slot. Called once the record is
// written: a slot made meanwhile would have its two syncs queue with
// the record's.
func (p *slotPool) used() {
	select {
	case p.refill <- struct{}{}:
	default:
	}
}

// saveNew writes a new sandbox's record durably: in a slot when one is
// ready and the record fits, else as save does.
func (m *sandboxManager) saveNew(rec *sandboxRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if len(b) <= recordSlotSize {
		if slot := m.slots.take(); slot != "" {
			err := writeSlot(slot, b, filepath.Join(m.dir, rec.ID+".json"))
			m.slots.used()
			if err == nil {
				m.changed()
				return nil
			}
			os.Remove(slot)
			m.log.Warn("sandbox: write the record in a slot; writing it the slower way", "id", rec.ID, "err", err)
		}
	}
	return m.save(rec)
}

// writeSlot overwrites slot with data padded to its size, syncs the
// data, and renames the slot to dst.
func writeSlot(slot string, data []byte, dst string) error {
	f, err := os.OpenFile(slot, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	buf := append(data, strings.Repeat("\n", recordSlotSize-len(data))...)
	_, err = f.WriteAt(buf, 0)
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(slot, dst)
	}
	return err
}
