package store

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"
)

// TestMigrateAwaitingBudget: a database of the first schema, with an
// execution, its events and credit entries, is migrated to the second
// (executions rebuilt for the awaiting_budget status) with every row
// kept, its foreign keys whole and enforced again.
func TestMigrateAwaitingBudget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hearth.db")
	db, err := sql.Open("sqlite", dsn(path, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := claim(ctx, db); err != nil {
		t.Fatal(err)
	}
	sub, _ := migrationsFor(sqliteDialect)
	p, err := goose.NewProvider(goose.DialectSQLite3, db, sub, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO sessions (id, agent, created) VALUES ('session-1', 'analyst', 1)`,
		`INSERT INTO executions (id, session_id, agent, kind, prompt, status, created, limit_usd_micros, usd_micros)
			VALUES ('exec-1', 'session-1', 'analyst', 'run', 'go', 'running', 1, 2000000, 500000)`,
		`INSERT INTO executions (id, session_id, agent, kind, parent_id, prompt, status, created)
			VALUES ('exec-2', 'session-1', 'analyst', 'retry', 'exec-1', 'go', 'pending', 2)`,
		`INSERT INTO events (execution_id, seq, session_id, time, type, payload) VALUES ('exec-1', 1, 'session-1', 1, 'status', '{}')`,
		`INSERT INTO credit_entries (time, kind, execution_id, micros) VALUES (1, 'added', NULL, 5000000)`,
		`INSERT INTO credit_entries (time, kind, execution_id, micros) VALUES (1, 'reserved', 'exec-1', 2000000)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open migrates: %v", err)
	}
	defer s.Close()
	if v, err := s.SchemaVersion(ctx); err != nil || v != newestMigration(t) {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, newestMigration(t))
	}
	e, err := s.GetExecution(ctx, "exec-1")
	if err != nil || e.Status != Running || e.Limits.USD != 2 || e.USD != 0.5 || e.Limits.OnBudget != "" {
		t.Fatalf("exec-1 after the migration: %+v, %v", e, err)
	}
	if e2, err := s.GetExecution(ctx, "exec-2"); err != nil || e2.Previous != "exec-1" || e2.Parent != "" {
		t.Fatalf("exec-2 after the migration: %+v, %v", e2, err)
	}
	if evs, err := s.Events(ctx, "exec-1", 0, 0); err != nil || len(evs) != 1 {
		t.Fatalf("events after the migration: %v, %v", evs, err)
	}
	if avail, reserved, _, err := s.Balance(ctx); err != nil || avail != 3 || reserved != 2 {
		t.Fatalf("balance after the migration: %v, %v, %v", avail, reserved, err)
	}
	if _, err := s.UpdateExecution(ctx, "exec-1", func(e *Execution) error { e.Status = AwaitingBudget; return nil }); err != nil {
		t.Fatalf("to awaiting_budget: %v", err)
	}
	var fk int
	if err := s.w.QueryRow("PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("writer's foreign_keys = %d, %v; want 1 again", fk, err)
	}
	rows, err := s.w.Query("PRAGMA foreign_key_check")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	if rows.Next() {
		t.Error("foreign_key_check found rows pointing nowhere")
	}
	if _, err := s.w.Exec(`INSERT INTO events (execution_id, seq, session_id, time, type, payload) VALUES ('exec-nobody', 1, 's', 1, 'x', '{}')`); err == nil {
		t.Error("an event of no execution was stored: foreign keys are not enforced")
	}
}
