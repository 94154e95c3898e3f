// Package money is the rule for amounts of dollars that every part of
// Hearth checks alike: the store's credit ledger (agents/store), which
// counts whole micro-dollars, and the client (hearth/client), which checks
// flags before sending them, so that both refuse the same amounts with
// the same words.
package money

import (
	"fmt"
	"math"
)

// MicrosPerUSD is the ledger's resolution: it counts micro-dollars.
const MicrosPerUSD = 1_000_000

// Min is the ledger's unit, one micro-dollar: a smaller amount would be
// recorded as $0, and a budget of $0 is no budget at all.
const Min = 1.0 / MicrosPerUSD

// Max is the largest amount taken: far beyond any real budget, and small
// enough that sums of micro-dollars stay in an int64.
const Max = 1e9

// Micros rounds usd to whole micro-dollars, half away from zero.
func Micros(usd float64) int64 {
	if usd >= 0 {
		return int64(usd*MicrosPerUSD + 0.5)
	}
	return int64(usd*MicrosPerUSD - 0.5)
}

// Check refuses an amount of dollars the ledger cannot hold exactly
// enough: NaN, infinite, negative, over Max, or not zero but under Min.
// Zero passes (callers say whether it means "none"). The error says what
// to give instead; callers prefix the key or flag.
func Check(usd float64) error {
	switch {
	case math.IsNaN(usd) || math.IsInf(usd, 0):
		return fmt.Errorf("%v is not a number of dollars: give one like 5 or 0.25", usd)
	case usd < 0:
		return fmt.Errorf("%v is negative: give a positive number of dollars", usd)
	case usd > Max:
		return fmt.Errorf("%v is more than the most the ledger takes ($%.0f)", usd, float64(Max))
	case usd > 0 && Micros(usd) == 0:
		return fmt.Errorf("%v is less than the ledger's unit, $0.000001: give at least that", usd)
	}
	return nil
}
