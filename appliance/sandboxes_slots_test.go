package appliance

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// slotManager is a sandbox manager with only what record slots need.
func slotManager(t *testing.T) *sandboxManager {
	t.Helper()
	state := t.TempDir()
	m := &sandboxManager{dir: filepath.Join(state, "sandboxes"), log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		dirty: make(chan struct{}, 1)}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return m
}

// writeSlotFile puts content in a slot file, padded as writeSlot pads it.
func writeSlotFile(t *testing.T, m *sandboxManager, name, content string) {
	t.Helper()
	if err := os.MkdirAll(m.slotsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	content += strings.Repeat("\n", recordSlotSize-len(content))
	if err := os.WriteFile(filepath.Join(m.slotsDir(), name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func recordJSON(t *testing.T, id, image string) string {
	t.Helper()
	b, err := json.Marshal(sandboxRecord{ID: id, Image: image})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRecoverSlots: a record a crash left in its slot only is put in
// place at the next start; a slot whose record is in place already, a
// free slot and a torn one are removed, and the record in place is kept.
func TestRecoverSlots(t *testing.T) {
	m := slotManager(t)
	writeSlotFile(t, m, "slot-a", recordJSON(t, "a", "base"))
	writeSlotFile(t, m, "slot-b", recordJSON(t, "b", "old"))
	if err := os.WriteFile(filepath.Join(m.dir, "b.json"), []byte(recordJSON(t, "b", "new")), 0o600); err != nil {
		t.Fatal(err)
	}
	writeSlotFile(t, m, "slot-free", "")
	torn := recordJSON(t, "c", "base")
	writeSlotFile(t, m, "slot-torn", torn[:len(torn)/2])

	if err := m.recoverSlots(); err != nil {
		t.Fatalf("recoverSlots() = %v", err)
	}
	for id, image := range map[string]string{"a": "base", "b": "new"} {
		rec, err := m.load(id)
		if err != nil || rec.Image != image {
			t.Errorf("load(%q) = %+v, %v, want image %q", id, rec, err, image)
		}
	}
	if _, err := os.Stat(filepath.Join(m.dir, "c.json")); err == nil {
		t.Errorf("a torn slot's record was put in place")
	}
	if ents, _ := os.ReadDir(m.slotsDir()); len(ents) != 0 {
		t.Errorf("slots left after recovery: %v", ents)
	}
}

// TestSaveNewInSlot: a new record goes through a slot and reads back
// whole; one too large for a slot, or one with no slot ready, is
// written all the same.
func TestSaveNewInSlot(t *testing.T) {
	m := slotManager(t)
	if err := m.recoverSlots(); err != nil {
		t.Fatal(err)
	}
	slot, err := newSlot(m.slotsDir())
	if err != nil {
		t.Fatal(err)
	}
	m.slots.put(slot)
	big := map[string]string{"BIG": strings.Repeat("x", recordSlotSize)}
	for _, rec := range []sandboxRecord{
		{ID: "small", Image: "base", Env: map[string]string{"A": "1"}}, // takes the slot
		{ID: "large", Image: "base", Env: big},                         // does not fit
		{ID: "later", Image: "base"},                                   // no slot left
	} {
		if err := m.saveNew(&rec); err != nil {
			t.Fatalf("saveNew(%s) = %v", rec.ID, err)
		}
		got, err := m.load(rec.ID)
		if err != nil || got.Image != rec.Image || len(got.Env) != len(rec.Env) || got.Env["BIG"] != rec.Env["BIG"] {
			t.Errorf("load(%s) = %+v, %v, want %+v", rec.ID, got, err, rec)
		}
	}
	if _, err := os.Stat(slot); err == nil {
		t.Errorf("the slot used is still among the free ones: %s", slot)
	}
	if m.slots.count() != 0 {
		t.Errorf("%d slots free after one was taken, want 0", m.slots.count())
	}
}

// TestFillSlots: the pool is filled at start, and a slot used is
// replaced once the create that used it has had its time.
func TestFillSlots(t *testing.T) {
	m := slotManager(t)
	if err := m.recoverSlots(); err != nil {
		t.Fatal(err)
	}
	m.stop = make(chan struct{})
	m.wg.Add(1)
	go m.fillSlots()
	defer func() { close(m.stop); m.wg.Wait() }()
	waitSlots := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.slots.count() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d slots ready after 10 s, want %d", m.slots.count(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitSlots(recordSlots)
	rec := sandboxRecord{ID: "one", Image: "base"}
	if err := m.saveNew(&rec); err != nil {
		t.Fatal(err)
	}
	if m.slots.count() != recordSlots-1 {
		t.Fatalf("%d slots ready just after one was used, want %d", m.slots.count(), recordSlots-1)
	}
	waitSlots(recordSlots)
	if ents, _ := os.ReadDir(m.slotsDir()); len(ents) != recordSlots {
		t.Errorf("%d files in the slots directory, want %d", len(ents), recordSlots)
	}
}
