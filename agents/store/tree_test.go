package store

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite"
)

// TestExecutionTree builds root -> two children -> a grandchild and
// checks depth, the children's listing, and that every change of an
// execution's figures reaches its ancestors' totals exactly.
func TestExecutionTree(t *testing.T) {
	s := openTest(t)
	root := newExec(t, s)
	root = setStatus(t, s, root.ID, Running)
	child := func(parent string) Execution {
		t.Helper()
		sess, err := s.CreateSession(ctx, Session{Agent: "writer"})
		if err != nil {
			t.Fatal(err)
		}
		e, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Parent: parent, Depth: 7, Prompt: "part"})
		if err != nil {
			t.Fatalf("CreateExecution with parent %s: %v", parent, err)
		}
		return setStatus(t, s, e.ID, Running)
	}
	a, b := child(root.ID), child(root.ID)
	g := child(a.ID)
	if a.Depth != 1 || b.Depth != 1 || g.Depth != 2 || root.Depth != 0 || a.Parent != root.ID || g.Parent != a.ID {
		t.Fatalf("depths root %d a %d b %d g %d, parents %q %q; want 0 1 1 2 (the store's, not the caller's 7)",
			root.Depth, a.Depth, b.Depth, g.Depth, a.Parent, g.Parent)
	}
	kids, err := s.Children(ctx, root.ID)
	if err != nil || len(kids) != 2 || kids[0].ID != a.ID || kids[1].ID != b.ID {
		t.Fatalf("Children(root) = %v, %v; want [%s %s]", ids(kids), err, a.ID, b.ID)
	}
	if list, _ := s.ListExecutions(ctx, ExecutionFilter{Parent: a.ID}); len(list) != 1 || list[0].ID != g.ID {
		t.Errorf("ListExecutions(parent=%s) = %v, want [%s]", a.ID, ids(list), g.ID)
	}
	charge := func(id string, usd float64, in int64) {
		t.Helper()
		if _, err := s.UpdateExecution(ctx, id, func(e *Execution) error {
			e.USD += usd
			e.Tokens.Input += in
			e.Tokens.Output += 2 * in
			e.TotalUSD = 99 // ignored: the store keeps totals
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	charge(g.ID, 0.125, 100)
	charge(a.ID, 0.25, 10)
	charge(b.ID, 0.0625, 1000)
	charge(root.ID, 0.5, 1)
	charge(g.ID, 0.000001, 3) // a later charge of the grandchild
	want := map[string]struct {
		usd float64
		in  int64
	}{
		root.ID: {0.5 + 0.25 + 0.0625 + 0.125 + 0.000001, 1 + 10 + 1000 + 100 + 3},
		a.ID:    {0.25 + 0.125 + 0.000001, 10 + 100 + 3},
		b.ID:    {0.0625, 1000},
		g.ID:    {0.125 + 0.000001, 103},
	}
	for id, w := range want {
		e, err := s.GetExecution(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if toMicros(e.TotalUSD) != toMicros(w.usd) || e.TotalTokens.Input != w.in || e.TotalTokens.Output != 2*w.in {
			t.Errorf("%s: total $%v, %d in, %d out; want $%v, %d, %d", id, e.TotalUSD, e.TotalTokens.Input, e.TotalTokens.Output, w.usd, w.in, 2*w.in)
		}
	}
	if _, err := s.UpdateExecution(ctx, a.ID, func(e *Execution) error { e.Parent = b.ID; return nil }); !errors.Is(err, ErrInvalid) {
		t.Errorf("changing a parent = %v, want ErrInvalid", err)
	}
	setStatus(t, s, b.ID, Completed)
	sess, _ := s.CreateSession(ctx, Session{Agent: "writer"})
	if _, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Parent: b.ID}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a child of an ended execution: %v, want ErrInvalid", err)
	}
	if _, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Parent: "exec-00000000"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("a child of an unknown execution: %v, want ErrNotFound", err)
	}
}

func ids(list []Execution) []string {
	var out []string
	for _, e := range list {
		out = append(out, e.ID)
	}
	return out
}

// TestCarveCredits moves part of a root's reservation to a child and the
// unspent rest back, and checks the ledger: every entry, and the
// balance's invariant (added = available + reserved + spent).
func TestCarveCredits(t *testing.T) {
	s := openTest(t)
	if err := s.AddCredits(ctx, 10, "test"); err != nil {
		t.Fatal(err)
	}
	root := newExec(t, s)
	kid := newExec(t, s)
	if err := s.Reserve(ctx, root.ID, 4); err != nil {
		t.Fatal(err)
	}
	if err := s.Carve(ctx, root.ID, kid.ID, 5); !errors.Is(err, ErrInsufficientCredits) {
		t.Errorf("carving $5 from a $4 reservation: %v, want ErrInsufficientCredits", err)
	}
	if err := s.Carve(ctx, root.ID, kid.ID, 1.5); err != nil {
		t.Fatal(err)
	}
	check := func(when string, avail, reserved, spent, rootHeld, kidHeld float64) {
		t.Helper()
		a, r, sp, err := s.Balance(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rh, _ := s.Reserved(ctx, root.ID)
		kh, _ := s.Reserved(ctx, kid.ID)
		if toMicros(a) != toMicros(avail) || toMicros(r) != toMicros(reserved) || toMicros(sp) != toMicros(spent) ||
			toMicros(rh) != toMicros(rootHeld) || toMicros(kh) != toMicros(kidHeld) {
			t.Errorf("%s: available %v reserved %v spent %v, root holds %v, child %v; want %v %v %v %v %v",
				when, a, r, sp, rh, kh, avail, reserved, spent, rootHeld, kidHeld)
		}
		if toMicros(a)+toMicros(r)+toMicros(sp) != toMicros(10) {
			t.Errorf("%s: available + reserved + spent = %v, want the $10 added", when, a+r+sp)
		}
	}
	check("carved", 6, 4, 0, 2.5, 1.5)
	if err := s.Spend(ctx, kid.ID, 0.4); err != nil {
		t.Fatal(err)
	}
	check("child spent", 6, 3.6, 0.4, 2.5, 1.1)
	if err := s.GiveBack(ctx, kid.ID, root.ID); err != nil {
		t.Fatal(err)
	}
	check("given back", 6, 3.6, 0.4, 3.6, 0)
	if err := s.Spend(ctx, root.ID, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, root.ID); err != nil {
		t.Fatal(err)
	}
	check("root ended", 8.6, 0, 1.4, 0, 0)
	var kinds []string
	entries, _ := s.CreditEntries(ctx, kid.ID)
	for _, e := range entries {
		kinds = append(kinds, string(e.Kind)+" "+e.Note)
	}
	want := []string{"reserved moved from " + root.ID, "spent ", "released moved to " + root.ID}
	if !slices.Equal(kinds, want) {
		t.Errorf("child's ledger %q, want %q", kinds, want)
	}
}

// TestMigrateParentToPrevious opens a store left at schema 1 with a
// resume in it: the execution it resumed is its Previous now, and it
// has no delegating parent.
func TestMigrateParentToPrevious(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hearth.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
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
		fmt.Sprintf("PRAGMA application_id = %d", applicationID),
		"INSERT INTO sessions (id, agent, created) VALUES ('session-1', 'analyst', 1)",
		"INSERT INTO executions (id, session_id, agent, kind, prompt, status, created, usd_micros, input_tokens) VALUES ('exec-00000001', 'session-1', 'analyst', 'run', 'a', 'completed', 1, 250000, 7)",
		"INSERT INTO executions (id, session_id, agent, kind, parent_id, prompt, status, created) VALUES ('exec-00000002', 'session-1', 'analyst', 'resume', 'exec-00000001', 'b', 'completed', 2)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first, _ := s.GetExecution(ctx, "exec-00000001")
	e, err := s.GetExecution(ctx, "exec-00000002")
	if err != nil || e.Previous != "exec-00000001" || e.Parent != "" || e.Depth != 0 {
		t.Errorf("migrated resume = %+v, %v; want previous exec-00000001, no parent", e, err)
	}
	if first.TotalUSD != 0.25 || first.TotalTokens.Input != 7 {
		t.Errorf("migrated totals $%v %d, want its own $0.25 and 7", first.TotalUSD, first.TotalTokens.Input)
	}
}
