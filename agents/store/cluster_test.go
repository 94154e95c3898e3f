package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	sqlite3 "modernc.org/sqlite/lib"

	"hearth/agents/stream"
)

// openNodes opens n Stores (nodes node-0, node-1, ...) on one fresh
// PostgreSQL database, closed when t ends.
func openNodes(t testing.TB, dbURL string, n int) []*Store {
	t.Helper()
	var nodes []*Store
	for i := range n {
		s, err := OpenPostgres(ctx, dbURL, PostgresOptions{Node: fmt.Sprintf("node-%d", i)})
		if err != nil {
			t.Fatalf("OpenPostgres node-%d: %v", i, err)
		}
		t.Cleanup(func() { s.Close() })
		nodes = append(nodes, s)
	}
	return nodes
}

// TestPostgresLedgerAcrossNodes: three nodes reserve, spend and release
// against one balance at once; the totals row and the entries agree
// exactly afterwards, and no reservation ever took more than was there.
func TestPostgresLedgerAcrossNodes(t *testing.T) {
	_, dbURL := startPG(t)
	nodes := openNodes(t, dbURL, 3)
	const perNode, reserve, spend = 20, 0.5, 0.125
	if err := nodes[0].AddCredits(ctx, 12, "top-up"); err != nil { // room for 24 of the 60 reservations
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for _, s := range nodes {
		execs := make([]Execution, perNode)
		for i := range execs {
			execs[i] = newExec(t, s)
		}
		wg.Go(func() {
			for _, e := range execs {
				err := s.Reserve(ctx, e.ID, reserve)
				if errors.Is(err, ErrInsufficientCredits) {
					continue
				} else if err != nil {
					t.Errorf("Reserve on %s: %v", s.node, err)
					return
				}
				mu.Lock()
				won++
				mu.Unlock()
				if err := s.Spend(ctx, e.ID, spend); err != nil {
					t.Errorf("Spend: %v", err)
				}
				if err := s.Release(ctx, e.ID); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	avail, reserved, spent, err := nodes[1].Balance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantSpent := float64(won) * spend
	if reserved != 0 || spent != wantSpent || avail != 12-wantSpent {
		t.Errorf("balance = %v available, %v reserved, %v spent; want %v, 0, %v (%d reservations won)",
			avail, reserved, spent, 12-wantSpent, wantSpent, won)
	}
	// The totals row agrees with the entries, summed independently.
	entries, err := nodes[2].CreditEntries(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var added, res, sp int64
	for _, c := range entries {
		switch c.Kind {
		case CreditAdded:
			added += toMicros(c.USD)
		case CreditReserved:
			res += toMicros(c.USD)
		case CreditReleased:
			res -= toMicros(c.USD)
		case CreditSpent:
			sp += toMicros(c.USD)
			res -= toMicros(c.FromReservation)
		}
	}
	if toUSD(added-sp) != avail || res != 0 || toUSD(sp) != spent {
		t.Errorf("entries sum to added %d, reserved %d, spent %d; totals row says %v/%v/%v", added, res, sp, avail, reserved, spent)
	}
	// Every reservation was for money that was there: with releases in
	// between, more than 24 can win, but never more than all 60.
	if won < 24 || won > 3*perNode {
		t.Errorf("%d reservations won, want between 24 and %d", won, 3*perNode)
	}
	t.Logf("%d of %d reservations won across 3 nodes", won, 3*perNode)
}

// TestPostgresReserveNeverOverdraws: with no releases, exactly as many
// reservations win across three nodes as the balance holds.
func TestPostgresReserveNeverOverdraws(t *testing.T) {
	_, dbURL := startPG(t)
	nodes := openNodes(t, dbURL, 3)
	if err := nodes[0].AddCredits(ctx, 10, "top-up"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for _, s := range nodes {
		execs := make([]Execution, 10)
		for i := range execs {
			execs[i] = newExec(t, s)
		}
		for _, e := range execs {
			wg.Go(func() {
				err := s.Reserve(ctx, e.ID, 1)
				if err != nil && !errors.Is(err, ErrInsufficientCredits) {
					t.Errorf("Reserve: %v", err)
				}
				if err == nil {
					mu.Lock()
					won++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	avail, reserved, _, err := nodes[2].Balance(ctx)
	if err != nil || won != 10 || avail != 0 || reserved != 10 {
		t.Fatalf("%d of 30 won, balance %v available %v reserved (%v); want exactly 10, 0, 10", won, avail, reserved, err)
	}
}

// TestPostgresInterruptOwnOnly: a node restarting interrupts the
// executions it owns, not those another node is running.
func TestPostgresInterruptOwnOnly(t *testing.T) {
	_, dbURL := startPG(t)
	nodes := openNodes(t, dbURL, 2)
	mine, theirs := newExec(t, nodes[0]), newExec(t, nodes[1])
	setStatus(t, nodes[0], mine.ID, Running)
	setStatus(t, nodes[1], theirs.ID, Running)
	if mine.Node != "node-0" || theirs.Node != "node-1" {
		t.Fatalf("owners %q and %q, want node-0 and node-1", mine.Node, theirs.Node)
	}
	got, err := nodes[0].InterruptRunning(ctx)
	if err != nil || len(got) != 1 || got[0].ID != mine.ID {
		t.Fatalf("InterruptRunning on node-0 = %+v, %v; want only %s", got, err, mine.ID)
	}
	if e, _ := nodes[0].GetExecution(ctx, theirs.ID); e.Status != Running {
		t.Errorf("node-1's execution is %s after node-0 restarted, want running", e.Status)
	}
}

// TestPostgresFollowAcrossNodes: a subscriber on node B sees every event
// node A appends, in order, none lost or repeated, also across a
// PostgreSQL crash and restart: appends during the outage fail (none
// acknowledged is lost), and both nodes go on once it is back.
func TestPostgresFollowAcrossNodes(t *testing.T) {
	srv, dbURL := startPG(t)
	if srv == nil {
		t.Skip("PostgreSQL restart: HEARTH_TEST_POSTGRES names a shared server this test cannot restart")
	}
	nodes := openNodes(t, dbURL, 2)
	a, b := nodes[0], nodes[1]
	e := newExec(t, a)
	sub, err := b.Subscribe(e.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var acked []int64
	appendN := func(from, n int) {
		for i := range n {
			evs, err := a.Append(ctx, text(e, fmt.Sprint("event ", from+i)))
			if err == nil {
				acked = append(acked, evs[0].Seq)
			}
		}
	}
	appendN(0, 50)
	got := receive(t, sub, 50, nil)

	srv.Stop(t)
	// During the outage an append fails, within a bounded time.
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = a.Append(c, text(e, "during the outage"))
	cancel()
	if err == nil {
		t.Fatal("Append while PostgreSQL is down succeeded")
	}
	srv.Restart(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		evs, err := a.Append(ctx, text(e, "after the restart"))
		if err == nil {
			acked = append(acked, evs[0].Seq)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Append after the restart: still %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	appendN(100, 50)
	got = receive(t, sub, len(acked), got)
	for i, seq := range acked {
		if got[i] != seq {
			t.Fatalf("subscriber on B got seqs %v..., want the acknowledged %v...", got[:i+1], acked[:i+1])
		}
	}
	stored, err := b.Events(ctx, e.ID, 0, 0)
	if err != nil || len(stored) != len(acked) {
		t.Fatalf("B reads %d stored events (%v), want the %d acknowledged", len(stored), err, len(acked))
	}
}

// receive reads events from sub until it has want seqs in all, checking
// order and gaps, within a bounded time.
func receive(t *testing.T, sub *Subscription, want int, got []int64) []int64 {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for len(got) < want {
		select {
		case ev, ok := <-sub.C:
			if !ok {
				t.Fatalf("subscription ended after %d events: %v", len(got), sub.Err())
			}
			if len(got) > 0 && ev.Seq != got[len(got)-1]+1 {
				t.Fatalf("seq %d after %d: a gap or a repeat", ev.Seq, got[len(got)-1])
			}
			got = append(got, ev.Seq)
		case <-timeout:
			t.Fatalf("received %d events of %d after 60s", len(got), want)
		}
	}
	return got
}

// TestHostileStringsArePostgresParameters: strings an agent controls
// (its prompt, event types and payloads, claimed paths) reach PostgreSQL
// only as parameters: SQL, placeholders and quotes in them are stored
// verbatim and run nothing.
func TestHostileStringsArePostgresParameters(t *testing.T) {
	_, dbURL := startPG(t)
	s := openNodes(t, dbURL, 1)[0]
	hostile := []string{
		"'; DROP TABLE executions; --",
		"? ?1 $1 $2 ?? '?' \"?\"",
		"x'); DELETE FROM credit_entries; SELECT ('",
		"$$ LANGUAGE plpgsql; $$",
		"-- ? /* ? */",
	}
	sess, err := s.CreateSession(ctx, Session{Agent: "analyst"})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hostile {
		e, err := s.CreateExecution(ctx, Execution{Session: sess.ID, Prompt: h})
		if err != nil {
			t.Fatalf("CreateExecution(%q): %v", h, err)
		}
		payload, _ := json.Marshal(map[string]string{"text": h})
		evs, err := s.Append(ctx, stream.Event{Execution: e.ID, Type: stream.Type(h), Payload: payload})
		if err != nil {
			t.Fatalf("Append(%q): %v", h, err)
		}
		back, err := s.Events(ctx, e.ID, 0, 0)
		if err != nil || len(back) != 1 || string(back[0].Type) != h || string(back[0].Payload) != string(payload) || evs[0].Seq != 1 {
			t.Fatalf("event %q read back as %+v, %v", h, back, err)
		}
		if got, err := s.GetExecution(ctx, e.ID); err != nil || got.Prompt != h {
			t.Fatalf("prompt %q read back as %q, %v", h, got.Prompt, err)
		}
		setStatus(t, s, e.ID, Running)
		if _, err := s.AcquireClaim(ctx, "out/"+h, e.ID, time.Minute); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("AcquireClaim(%q): %v", h, err)
		}
	}
	list, err := s.ListExecutions(ctx, ExecutionFilter{})
	if err != nil || len(list) != len(hostile) {
		t.Fatalf("ListExecutions = %d, %v; want %d: the tables are whole", len(list), err, len(hostile))
	}
}

// TestOpenPostgresRefuses: bad URLs and unreachable servers are refused at
// the door with an error that says which and what to check.
func TestOpenPostgresRefuses(t *testing.T) {
	for _, u := range []string{"", "mysql://db/hearth", "postgres://host:notaport/db"} {
		if _, err := OpenPostgres(ctx, u, PostgresOptions{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("OpenPostgres(%q) = %v, want ErrInvalid", u, err)
		}
	}
	// A port nothing listens on (the discard port, closed here).
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := OpenPostgres(c, "postgres://hearth:secret@127.0.0.1:9/hearth?connect_timeout=5", PostgresOptions{})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("OpenPostgres(closed port) = %v, want ErrUnreachable", err)
	}
	if msg := err.Error(); strings.Contains(msg, "secret") {
		t.Errorf("the error shows the password: %s", msg)
	}
	_, err = OpenPostgres(c, "postgres://hearth@127.0.0.1:9/hearth?connect_timeout=5&password=secret", PostgresOptions{})
	if !errors.Is(err, ErrUnreachable) || strings.Contains(err.Error(), "secret") {
		t.Errorf("OpenPostgres(password in the query) = %v, want ErrUnreachable without the password", err)
	}
}

// TestHostileNotifications: whoever can connect to the database can send
// on the events channel; garbage, unknown executions and absurd seqs do
// not break a node's followers, which still get the real events.
func TestHostileNotifications(t *testing.T) {
	_, dbURL := startPG(t)
	nodes := openNodes(t, dbURL, 2)
	a, b := nodes[0], nodes[1]
	e := newExec(t, a)
	sub, err := b.Subscribe(e.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	all, err := b.SubscribeAll()
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	for _, payload := range []string{
		"not json", `{"node":"x","execution":"exec-nobody","first":1,"last":9}`,
		`{"node":"x","execution":"` + e.ID + `","first":-9223372036854775808,"last":9223372036854775807}`,
		`{"node":"x","execution":"'; DROP TABLE events; --","first":1,"last":2}`,
	} {
		if _, err := a.w.ExecContext(ctx, "SELECT pg_notify(?, ?)", eventsChannel, payload); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if _, err := a.Append(ctx, text(e, fmt.Sprint("real ", i))); err != nil {
			t.Fatal(err)
		}
	}
	receive(t, sub, 5, nil)
	got := 0
	timeout := time.After(60 * time.Second)
	for got < 5 {
		select {
		case _, ok := <-all.C:
			if !ok {
				t.Fatalf("SubscribeAll ended after %d events: %v", got, all.Err())
			}
			got++
		case <-timeout:
			t.Fatalf("SubscribeAll on B got %d of 5 events", got)
		}
	}
}

// TestPostgresNodeNameUnique: a second Store with a node name already
// open on the database is refused, as a second Store on one SQLite file
// is; once the first closes, the name is free.
func TestPostgresNodeNameUnique(t *testing.T) {
	_, dbURL := startPG(t)
	first := openNodes(t, dbURL, 1)[0]
	if _, err := OpenPostgres(ctx, dbURL, PostgresOptions{Node: "node-0"}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Store as node-0 = %v, want ErrLocked", err)
	}
	if _, err := OpenPostgres(ctx, dbURL, PostgresOptions{Node: "bad\nname"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("node name with a newline = %v, want ErrInvalid", err)
	}
	first.Close()
	again, err := OpenPostgres(ctx, dbURL, PostgresOptions{Node: "node-0"})
	if err != nil {
		t.Fatalf("node-0 after the first closed: %v", err)
	}
	again.Close()
}

// TestPostgresErrorClasses: PostgreSQL's SQLSTATEs map to the store's
// classes: constraint kinds to those SQLite reports, and the server
// failing to write (disk full, I/O, shutdown, connection lost) to a write
// failure, which is kept and retried; a caller's error is neither.
func TestPostgresErrorClasses(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		err         error
		write       bool
		unique, fk  bool
		description string
	}{
		{pg("23505"), false, true, false, "unique violation"},
		{pg("23503"), false, false, true, "foreign key violation"},
		{pg("23514"), false, false, false, "check violation"},
		{pg("53100"), true, false, false, "disk full"},
		{pg("58030"), true, false, false, "I/O error"},
		{pg("57P01"), true, false, false, "admin shutdown"},
		{pg("08006"), true, false, false, "connection failure"},
		{pg("25006"), true, false, false, "read-only transaction"},
		{pg("22P02"), false, false, false, "invalid text"},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true, false, false, "socket closed"},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true, false, false, "server down"},
		{ErrInvalid, false, false, false, "caller's error"},
	} {
		if got := writeFailure(tc.err); got != tc.write {
			t.Errorf("%s: writeFailure = %v, want %v", tc.description, got, tc.write)
		}
		if got := constraint(tc.err, sqlite3.SQLITE_CONSTRAINT_UNIQUE); got != tc.unique {
			t.Errorf("%s: unique = %v, want %v", tc.description, got, tc.unique)
		}
		if got := constraint(tc.err, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY); got != tc.fk {
			t.Errorf("%s: foreign key = %v, want %v", tc.description, got, tc.fk)
		}
	}
}

// TestPostgresSpendKeptAcrossRestart: metered spend and a release the
// database refuses while it is down are kept, reported as a write
// failure, and written once it is back: the ledger ends exact.
func TestPostgresSpendKeptAcrossRestart(t *testing.T) {
	srv, dbURL := startPG(t)
	if srv == nil {
		t.Skip("PostgreSQL restart: HEARTH_TEST_POSTGRES names a shared server this test cannot restart")
	}
	s := openNodes(t, dbURL, 1)[0]
	e := newExec(t, s)
	if err := s.AddCredits(ctx, 5, "top-up"); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(ctx, e.ID, 2); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Spend(c, e.ID, 0.75); !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("Spend while the server is down = %v, want ErrWriteFailed (kept)", err)
	}
	if err := s.Release(c, e.ID); !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("Release while the server is down = %v, want ErrWriteFailed (kept)", err)
	}
	if _, err := s.WriteError(); !errors.Is(err, ErrWriteFailed) {
		t.Errorf("WriteError during the outage = %v, want ErrWriteFailed", err)
	}
	srv.Restart(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		avail, reserved, spent, err := s.Balance(ctx)
		if err == nil && spent == 0.75 && reserved == 0 && avail == 4.25 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("balance 60s after the restart: %v available, %v reserved, %v spent, %v; want 4.25, 0, 0.75", avail, reserved, spent, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := s.WriteError(); err != nil {
		t.Errorf("WriteError once the kept writes went through = %v", err)
	}
}

// TestPostgresAppendOwnerOnly: a node appends only to the executions it
// owns (another's would collide with the owner's seqs and fail a whole
// group commit); once it adopts one, its seqs follow the stored ones.
func TestPostgresAppendOwnerOnly(t *testing.T) {
	_, dbURL := startPG(t)
	nodes := openNodes(t, dbURL, 2)
	a, b := nodes[0], nodes[1]
	e := newExec(t, a)
	if _, err := a.Append(ctx, text(e, "from a")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Append(ctx, text(e, "from b")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Append on a node that does not own the execution = %v, want ErrInvalid", err)
	}
	adopted, err := b.Adopt(ctx, e.ID)
	if err != nil || adopted.Node != "node-1" {
		t.Fatalf("Adopt = %+v, %v", adopted, err)
	}
	got, err := b.Append(ctx, text(e, "from b"))
	if err != nil || got[0].Seq != 2 {
		t.Fatalf("Append after Adopt = %v, %v; want seq 2", got, err)
	}
	setStatus(t, b, e.ID, Cancelled)
	if _, err := a.Adopt(ctx, e.ID); !errors.Is(err, ErrInvalidTransition) {
		t.Errorf("Adopt of an ended execution = %v, want ErrInvalidTransition", err)
	}
}

// TestPostgresInterruptElsewhere: a node ends interrupted another node's
// unfinished execution (that node died): its reservation is released and
// its error says why; an ended one is left as it is.
func TestPostgresInterruptElsewhere(t *testing.T) {
	_, dbURL := startPG(t)
	nodes := openNodes(t, dbURL, 2)
	a, b := nodes[0], nodes[1]
	if err := a.AddCredits(ctx, 5, "budget"); err != nil {
		t.Fatal(err)
	}
	e := newExec(t, a)
	setStatus(t, a, e.ID, Running)
	if err := a.Reserve(ctx, e.ID, 2); err != nil {
		t.Fatal(err)
	}
	got, ended, err := b.Interrupt(ctx, e.ID, "node-0 was declared dead")
	if err != nil || !ended || got.Status != Interrupted || got.Error != "node-0 was declared dead" || got.Ended.IsZero() {
		t.Fatalf("Interrupt = %+v, %v, %v; want interrupted with the reason", got, ended, err)
	}
	if avail, reserved, _, err := b.Balance(ctx); err != nil || reserved != 0 || avail != 5 {
		t.Errorf("balance after: %v available, %v reserved, %v; want the reservation released", avail, reserved, err)
	}
	again, ended, err := b.Interrupt(ctx, e.ID, "again")
	if err != nil || ended || again.Error != "node-0 was declared dead" {
		t.Errorf("Interrupt of an ended execution = %+v, %v, %v; want it left as it is", again, ended, err)
	}
	if _, _, err := b.Interrupt(ctx, "exec-nope", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Interrupt of no execution = %v, want ErrNotFound", err)
	}
}
