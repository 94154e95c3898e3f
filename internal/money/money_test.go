package money

import (
	"math"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		usd  float64
		want string // "" accepted, else a word of the error
	}{
		{0, ""}, {1, ""}, {0.25, ""}, {Min, ""}, {6e-7, ""}, {Max, ""},
		{math.NaN(), "not a number"}, {math.Inf(1), "not a number"}, {math.Inf(-1), "not a number"},
		{-1, "negative"}, {-1e-9, "negative"},
		{Max + 1, "more than the most"}, {math.MaxFloat64, "more than the most"},
		{4e-7, "less than the ledger's unit"}, {1e-9, "less than the ledger's unit"}, {math.SmallestNonzeroFloat64, "less than the ledger's unit"},
	} {
		err := Check(tc.usd)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Check(%v) = %v, want %q", tc.usd, err, tc.want)
		}
	}
}

func TestMicros(t *testing.T) {
	for _, tc := range []struct {
		usd  float64
		want int64
	}{{0, 0}, {1, 1_000_000}, {0.0000005, 1}, {0.0000004, 0}, {-0.0000005, -1}, {0.571356, 571356}} {
		if got := Micros(tc.usd); got != tc.want {
			t.Errorf("Micros(%v) = %d, want %d", tc.usd, got, tc.want)
		}
	}
}
