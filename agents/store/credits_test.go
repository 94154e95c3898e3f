package store

import (
	"errors"
	"math"
	"sync"
	"testing"
)

func wantBalance(t *testing.T, s *Store, step string, available, reserved, spent float64) {
	t.Helper()
	a, r, sp, err := s.Balance(ctx)
	if err != nil || a != available || r != reserved || sp != spent {
		t.Errorf("%s: Balance() = %v, %v, %v, %v; want %v, %v, %v", step, a, r, sp, err, available, reserved, spent)
	}
}

func TestCreditLedger(t *testing.T) {
	s := openTest(t)
	a, b := newExec(t, s), newExec(t, s)
	wantBalance(t, s, "empty", 0, 0, 0)
	if err := s.Reserve(ctx, a.ID, 1); !errors.Is(err, ErrInsufficientCredits) {
		t.Errorf("Reserve with no credits = %v, want ErrInsufficientCredits", err)
	}
	if err := s.AddCredits(ctx, 10, "alice: initial top-up"); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, "added 10", 10, 0, 0)
	if err := s.Reserve(ctx, a.ID, 4); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, "a reserved 4", 6, 4, 0)
	for range 10 { // float drift would show here: ten spends of $0.1
		if err := s.Spend(ctx, a.ID, 0.1); err != nil {
			t.Fatal(err)
		}
	}
	wantBalance(t, s, "a spent 1", 6, 3, 1)
	if err := s.Reserve(ctx, b.ID, 6.000001); !errors.Is(err, ErrInsufficientCredits) {
		t.Errorf("Reserve beyond available = %v, want ErrInsufficientCredits", err)
	}
	if err := s.Reserve(ctx, b.ID, 6); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, "b reserved the rest", 0, 9, 1)
	// b's last call overruns its reservation: recorded honestly.
	if err := s.Spend(ctx, b.ID, 6.5); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, "b overspent by 0.5", -0.5, 3, 7.5)
	if err := s.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, "b released nothing", -0.5, 3, 7.5)
	if err := s.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, "a released 3, twice", 2.5, 0, 7.5)
	// Spend after release (a late metered call) comes from available.
	if err := s.Spend(ctx, a.ID, 0.25); err != nil {
		t.Fatal(err)
	}
	wantBalance(t, s, "late spend", 2.25, 0, 7.75)

	entries, err := s.CreditEntries(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[1].Kind != CreditSpent || entries[1].USD != 6.5 || entries[1].FromReservation != 6 {
		t.Errorf("b's entries = %+v, want reserved 6 then spent 6.5 of which 6 from the reservation", entries)
	}
	all, _ := s.CreditEntries(ctx, "")
	if len(all) != 16 || all[0].Note != "alice: initial top-up" {
		t.Errorf("ledger has %d entries starting %+v, want 16 starting with the top-up", len(all), all[0])
	}
	if _, err := s.w.Exec("DELETE FROM credit_entries"); err == nil {
		t.Errorf("deleting ledger entries succeeded, want the ledger append-only")
	}

	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"add zero", s.AddCredits(ctx, 0, ""), ErrInvalid},
		{"add negative", s.AddCredits(ctx, -5, ""), ErrInvalid},
		{"add NaN", s.AddCredits(ctx, math.NaN(), ""), ErrInvalid},
		{"add under the unit", s.AddCredits(ctx, 1e-9, ""), ErrInvalid},
		{"add infinity", s.AddCredits(ctx, math.Inf(1), ""), ErrInvalid},
		{"reserve under the unit", s.Reserve(ctx, a.ID, 1e-7), ErrInvalid},
		{"spend negative", s.Spend(ctx, a.ID, -1), ErrInvalid},
		{"reserve unknown", s.Reserve(ctx, "exec-00000000", 1), ErrNotFound},
		{"spend unknown", s.Spend(ctx, "exec-00000000", 1), ErrNotFound},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	wantBalance(t, s, "after refused calls", 2.25, 0, 7.75)
}

// TestReserveRace has executions race for the last credits: the ones
// that fit win, the others get ErrInsufficientCredits, never both.
func TestReserveRace(t *testing.T) {
	s := openTest(t)
	for round := range 20 {
		if err := s.AddCredits(ctx, 5, "round"); err != nil {
			t.Fatal(err)
		}
		execs := []Execution{newExec(t, s), newExec(t, s), newExec(t, s)}
		var (
			wg           sync.WaitGroup
			mu           sync.Mutex
			won, refused int
		)
		for _, e := range execs {
			wg.Go(func() {
				err := s.Reserve(ctx, e.ID, 3)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won++
				case errors.Is(err, ErrInsufficientCredits):
					refused++
				default:
					t.Errorf("Reserve: %v", err)
				}
			})
		}
		wg.Wait()
		if won != 1 || refused != 2 {
			t.Fatalf("round %d: %d won, %d refused; want exactly one winner", round, won, refused)
		}
		wantBalance(t, s, "after race", 2, 3, float64(5*round))
		for _, e := range execs {
			s.Release(ctx, e.ID)
		}
		// Spend the rest so that the next round starts from 0 available.
		if err := s.Spend(ctx, execs[0].ID, 5); err != nil {
			t.Fatal(err)
		}
	}
}
