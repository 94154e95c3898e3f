package store

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// CreditKind says what a ledger entry records.
type CreditKind string

const (
	CreditAdded    CreditKind = "added"    // a person added credits
	CreditReserved CreditKind = "reserved" // a starting execution set credits aside
	CreditReleased CreditKind = "released" // the unused rest of a reservation came back
	CreditSpent    CreditKind = "spent"    // metered model spend charged to an execution
)

// CreditEntry is one line of the credit ledger, which is append-only.
type CreditEntry struct {
	ID        int64      `json:"id"`
	Time      time.Time  `json:"time"`
	Kind      CreditKind `json:"kind"`
	Execution string     `json:"execution,omitempty"`
	USD       float64    `json:"usd"`
	// FromReservation is the part of a spend taken from the execution's
	// reservation; the rest (USD - FromReservation) overran it.
	FromReservation float64 `json:"from_reservation,omitempty"`
	Note            string  `json:"note,omitempty"`
}

// Balance returns the appliance's credits: available to reserve (added -
// reserved - spent; negative when spend overran reservations by the calls
// in flight), reserved by executions and not yet spent or released, and
// spent in all.
func (s *Store) Balance(ctx context.Context) (available, reserved, spent float64, err error) {
	var a, r, sp int64
	err = s.r.QueryRowContext(ctx, "SELECT added, reserved, spent FROM credit_totals").Scan(&a, &r, &sp)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("credit balance: %w", err)
	}
	return toUSD(a - r - sp), toUSD(r), toUSD(sp), nil
}

// amount converts a positive dollar amount to micro-dollars.
func amount(op string, usd float64) (int64, error) {
	if !(usd > 0) || math.IsInf(usd, 0) || usd > math.MaxInt64/microsPerUSD {
		return 0, fmt.Errorf("%s: %w: amount %v must be a positive number of dollars", op, ErrInvalid, usd)
	}
	return toMicros(usd), nil
}

// wholeAmount is amount for what a person gives (credits added, a
// budget reserved): one under the ledger's unit would be recorded as $0,
// so it is refused. Metered spend may be smaller and rounds.
func wholeAmount(op string, usd float64) (int64, error) {
	if err := CheckUSD(usd); err != nil {
		return 0, fmt.Errorf("%s: %w: amount %w", op, ErrInvalid, err)
	}
	return amount(op, usd)
}

// AddCredits adds usd (> 0) to the balance, with a note saying who and why.
func (s *Store) AddCredits(ctx context.Context, usd float64, note string) error {
	m, err := wholeAmount("add credits", usd)
	if err != nil {
		return err
	}
	_, err = s.w.ExecContext(ctx, "INSERT INTO credit_entries (time, kind, micros, note) VALUES (?, ?, ?, ?)",
		time.Now().UnixNano(), CreditAdded, m, note)
	if err = s.wrote(err); writeFailure(err) {
		return fmt.Errorf("add credits: %w: %w", ErrWriteFailed, err)
	} else if err != nil {
		return fmt.Errorf("add credits: %w", err)
	}
	return nil
}

// Reserve sets usd (> 0) aside for an execution, or fails with
// ErrInsufficientCredits when less than usd is available; the check and
// the reservation are one transaction, so of two executions racing for
// the last credits exactly one wins. Reserving again for the same
// execution adds to its reservation.
func (s *Store) Reserve(ctx context.Context, execution string, usd float64) error {
	m, err := wholeAmount("reserve credits for "+execution, usd)
	if err != nil {
		return err
	}
	return s.creditTx(ctx, "reserve credits for "+execution, execution, false, func(ctx context.Context, tx *sql.Tx) error {
		var available int64
		err := tx.QueryRowContext(ctx, "SELECT added - reserved - spent FROM credit_totals").Scan(&available)
		if err != nil {
			return err
		}
		if available < m {
			return fmt.Errorf("%w: $%.6f available, $%.6f asked", ErrInsufficientCredits, toUSD(available), usd)
		}
		return insertEntry(ctx, tx, CreditReserved, execution, m, 0)
	})
}

// Spend charges usd (> 0) of metered spend to an execution. It comes out
// of the execution's reservation first; the part beyond it (the call in
// flight when a limit was reached, or spend with no reservation) is still
// recorded, from the available balance, which may go negative by it.
func (s *Store) Spend(ctx context.Context, execution string, usd float64) error {
	m, err := amount("spend credits for "+execution, usd)
	if err != nil {
		return err
	}
	return s.creditTx(ctx, "spend credits for "+execution, execution, true, func(ctx context.Context, tx *sql.Tx) error {
		held, err := outstanding(ctx, tx, execution)
		if err != nil {
			return err
		}
		return insertEntry(ctx, tx, CreditSpent, execution, m, min(held, m))
	})
}

// Release returns the unspent rest of an execution's reservation to the
// available balance, when the execution ends. Idempotent: with nothing
// reserved it records nothing.
func (s *Store) Release(ctx context.Context, execution string) error {
	return s.creditTx(ctx, "release credits of "+execution, execution, true, func(ctx context.Context, tx *sql.Tx) error {
		_, err := release(ctx, tx, execution, time.Now())
		return err
	})
}

func release(ctx context.Context, tx *sql.Tx, execution string, now time.Time) (int64, error) {
	held, err := outstanding(ctx, tx, execution)
	if err != nil || held == 0 {
		return 0, err
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO credit_entries (time, kind, execution_id, micros) VALUES (?, ?, ?, ?)",
		now.UnixNano(), CreditReleased, execution, held)
	if err != nil {
		return 0, fmt.Errorf("release credits of %s: %w", execution, err)
	}
	return held, nil
}

// outstanding is what remains of an execution's reservations.
func outstanding(ctx context.Context, tx *sql.Tx, execution string) (int64, error) {
	var held int64
	err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(CASE kind WHEN 'reserved' THEN micros
		WHEN 'released' THEN -micros WHEN 'spent' THEN -from_reservation END), 0)
		FROM credit_entries WHERE execution_id = ?`, execution).Scan(&held)
	return held, err
}

func insertEntry(ctx context.Context, tx *sql.Tx, kind CreditKind, execution string, micros, fromReservation int64) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO credit_entries (time, kind, execution_id, micros, from_reservation)
		VALUES (?, ?, ?, ?, ?)`, time.Now().UnixNano(), kind, execution, micros, fromReservation)
	return err
}

// creditTx runs fn in a write transaction for execution, turning a
// foreign-key failure (no such execution) into ErrNotFound. With keep, a
// write the database refuses (ErrWriteFailed) is kept and retried, in
// order with the others kept, until the database takes it: spend that
// was metered is never dropped, and a reservation is released.
func (s *Store) creditTx(ctx context.Context, op, execution string, keep bool, fn func(context.Context, *sql.Tx) error) error {
	try := func(ctx context.Context) error {
		tx, err := s.beginWrite(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		return s.wrote(nil)
	}
	err := try(ctx)
	switch {
	case err == nil:
		return nil
	case constraint(err, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY):
		return fmt.Errorf("%s: execution %w", op, ErrNotFound)
	case writeFailure(err) && keep:
		s.wrote(err, execution)
		s.keep(op, try) // the retrier calls it with its own context
		return fmt.Errorf("%s: %w: %w (kept and written once the store can be written)", op, ErrWriteFailed, err)
	case writeFailure(err):
		s.wrote(err, execution)
		return fmt.Errorf("%s: %w: %w", op, ErrWriteFailed, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// CreditEntries returns the ledger entries of one execution, or of all
// when execution is "", oldest first.
func (s *Store) CreditEntries(ctx context.Context, execution string) ([]CreditEntry, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, time, kind, COALESCE(execution_id, ''), micros, from_reservation, note
		FROM credit_entries WHERE ?1 = '' OR execution_id = ?1 ORDER BY id`, execution)
	if err != nil {
		return nil, fmt.Errorf("credit entries: %w", err)
	}
	defer rows.Close()
	var out []CreditEntry
	for rows.Next() {
		var (
			c         CreditEntry
			t, m, frm int64
		)
		if err := rows.Scan(&c.ID, &t, &c.Kind, &c.Execution, &m, &frm, &c.Note); err != nil {
			return nil, fmt.Errorf("credit entries: %w", err)
		}
		c.Time, c.USD, c.FromReservation = time.Unix(0, t).UTC(), toUSD(m), toUSD(frm)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("credit entries: %w", err)
	}
	return out, nil
}

// Carve moves usd (> 0) of a parent execution's outstanding reservation
// to a child it delegates to, in one transaction: a released entry for
// the parent and a reserved entry for the child, each noting the other.
// The balance's available credits do not change: the child's budget is
// set aside out of the root's, never taken from the balance again. With
// less than usd outstanding for the parent it fails with
// ErrInsufficientCredits.
func (s *Store) Carve(ctx context.Context, parent, child string, usd float64) error {
	m, err := wholeAmount("carve credits for "+child, usd)
	if err != nil {
		return err
	}
	return s.creditTx(ctx, "carve credits for "+child+" from "+parent, child, false, func(ctx context.Context, tx *sql.Tx) error {
		held, err := outstanding(ctx, tx, parent)
		if err != nil {
			return err
		}
		if held < m {
			return fmt.Errorf("%w: the parent %s holds $%.6f of credits, $%.6f asked", ErrInsufficientCredits, parent, toUSD(held), usd)
		}
		return moveReservation(ctx, tx, parent, child, m)
	})
}

// GiveBack moves the rest of a child's reservation back to its parent's
// when the child ends (the other way of Carve): what the child did not
// spend is the parent's again, not the balance's. With nothing reserved
// it records nothing.
func (s *Store) GiveBack(ctx context.Context, child, parent string) error {
	return s.creditTx(ctx, "give credits of "+child+" back to "+parent, child, true, func(ctx context.Context, tx *sql.Tx) error {
		held, err := outstanding(ctx, tx, child)
		if err != nil || held <= 0 {
			return err
		}
		return moveReservation(ctx, tx, child, parent, held)
	})
}

func moveReservation(ctx context.Context, tx *sql.Tx, from, to string, micros int64) error {
	now := time.Now().UnixNano()
	_, err := tx.ExecContext(ctx, `INSERT INTO credit_entries (time, kind, execution_id, micros, note) VALUES (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)`,
		now, CreditReleased, from, micros, "moved to "+to, now, CreditReserved, to, micros, "moved from "+from)
	return err
}

// Reserved is what remains of an execution's reservations.
func (s *Store) Reserved(ctx context.Context, execution string) (float64, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("reserved credits of %s: %w", execution, err)
	}
	defer tx.Rollback()
	held, err := outstanding(ctx, tx, execution)
	if err != nil {
		return 0, fmt.Errorf("reserved credits of %s: %w", execution, err)
	}
	return toUSD(held), nil
}
