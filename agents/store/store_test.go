package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"hearth/agents/stream"
)

var ctx = context.Background()

// openTest opens a store that is closed when the test ends: in a fresh
// SQLite file, or, when the test runs inside the PostgreSQL conformance
// suite (TestPostgresConformance), in a fresh PostgreSQL database.
func openTest(t testing.TB) *Store {
	t.Helper()
	s, err := openerFor(t)(t)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// newExec creates a session of agent "analyst" with one execution in it.
func newExec(t testing.TB, s *Store) Execution {
	t.Helper()
	sess, err := s.CreateSession(ctx, Session{Agent: "analyst"})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	e, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Prompt: "analyze q2.csv"})
	if err != nil {
		t.Fatalf("CreateExecution: %v", err)
	}
	return e
}

func setStatus(t testing.TB, s *Store, id string, st Status) Execution {
	t.Helper()
	e, err := s.UpdateExecution(ctx, id, func(e *Execution) error { e.Status = st; return nil })
	if err != nil {
		t.Fatalf("UpdateExecution(%s, %s): %v", id, st, err)
	}
	return e
}

func TestOpenMigratesAndReopens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hearth.db")
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%q) on no file: %v", path, err)
	}
	v, err := s.SchemaVersion(ctx)
	if want := newestMigration(t); err != nil || v != want {
		t.Fatalf("SchemaVersion = %d, %v; want %d, nil", v, err, want)
	}
	e := newExec(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	s, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	if got, err := s.GetExecution(ctx, e.ID); err != nil || got.Prompt != e.Prompt {
		t.Fatalf("GetExecution after reopen = %+v, %v; want %+v", got, err, e)
	}
	var mode string
	if err := s.w.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var fk int
	if err := s.r.QueryRow("PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d, %v; want 1", fk, err)
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte("this is not a database, it is a shopping list: eggs, milk, flour\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign.db")
	execSQL(t, foreign, "CREATE TABLE recipes (name TEXT)")
	newer := filepath.Join(dir, "newer.db")
	s, err := Open(newer)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	execSQL(t, newer, "INSERT INTO goose_db_version (version_id, is_applied) VALUES (99, 1)")
	mangled := filepath.Join(dir, "mangled.db")
	s, err = Open(mangled)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	mangle(t, mangled)
	held := filepath.Join(dir, "held.db")
	s, err = Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	for _, tc := range []struct {
		name, path string
		want       error
	}{
		{"not sqlite", garbage, ErrCorrupt},
		{"corrupt store", mangled, ErrCorrupt},
		{"another program's database", foreign, ErrNotStore},
		{"newer schema", newer, ErrSchemaTooNew},
		{"open elsewhere", held, ErrLocked},
		{"bad path", filepath.Join(dir, "a?b.db"), ErrInvalid},
		{"missing directory", filepath.Join(dir, "no", "such", "hearth.db"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(tc.path)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%q) = nil error, want one", tc.path)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Open(%q) = %v, want %v", tc.path, err, tc.want)
			}
			t.Logf("Open(%q) = %v", filepath.Base(tc.path), err)
		})
	}
}

// mangle overwrites the schema page of a database file after its header.
func mangle(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	junk := make([]byte, 3000)
	for i := range junk {
		junk[i] = byte(i*7 + 3)
	}
	if _, err := f.WriteAt(junk, 100); err != nil {
		t.Fatal(err)
	}
}

// execSQL runs one statement on a database file directly.
func execSQL(t *testing.T, path, q string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	s, err := Open(filepath.Join(t.TempDir(), "hearth.db"))
	if err != nil {
		t.Fatal(err)
	}
	e := newExec(t, s)
	if _, err := s.Append(ctx, stream.New(e.Session, e.ID, stream.Text, map[string]string{"text": "hi"})); err != nil {
		t.Fatal(err)
	}
	var subs []*Subscription
	for range 3 {
		sub, err := s.Subscribe(e.ID, 0) // never read: stays replaying, blocked
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	all, err := s.SubscribeAll()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, sub := range append(subs, all) {
		for range sub.C {
		}
		if !errors.Is(sub.Err(), ErrClosed) {
			t.Errorf("Err() after store Close = %v, want ErrClosed", sub.Err())
		}
	}
	if _, err := s.Append(ctx, stream.New(e.Session, e.ID, stream.Text, nil)); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Subscribe(e.ID, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want ErrClosed", err)
	}
	if _, err := s.SubscribeAll(); !errors.Is(err, ErrClosed) {
		t.Errorf("SubscribeAll after Close = %v, want ErrClosed", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

func TestMoney(t *testing.T) {
	for _, usd := range []float64{0.1, 0.2, 0.3, 1e-6, 12.345678, 1234.5} {
		if got := toUSD(toMicros(usd)); got != usd {
			t.Errorf("toUSD(toMicros(%v)) = %v", usd, got)
		}
	}
	var sum int64
	for range 10 {
		sum += toMicros(0.1)
	}
	if sum != toMicros(1) {
		t.Errorf("ten times $0.1 = %d micros, want %d", sum, toMicros(1))
	}
}

// newestMigration is the version of the last embedded migration file
// (00002_claims.sql is 2).
func newestMigration(t *testing.T) int64 {
	t.Helper()
	ents, err := migrations.ReadDir("migrations")
	if err != nil || len(ents) == 0 {
		t.Fatalf("embedded migrations: %d, %v", len(ents), err)
	}
	name := ents[len(ents)-1].Name()
	v, err := strconv.ParseInt(name[:strings.IndexByte(name, '_')], 10, 64)
	if err != nil {
		t.Fatalf("migration %s: %v", name, err)
	}
	return v
}
