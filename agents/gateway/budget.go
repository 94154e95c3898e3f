package gateway

import (
	"slices"
	"sync"
)

// Level says how close an execution is to one of its limits.
type Level int

const (
	Allow Level = iota // under 90% of every limit
	Warn               // at 90% of a limit or more: time to wrap up
	Deny               // at 100% of a limit or more: no more model calls
)

// String is the level as budget events name it.
func (l Level) String() string {
	switch l {
	case Warn:
		return "warn"
	case Deny:
		return "exceeded"
	}
	return "allow"
}

// LimitUse is how much of one limit an execution has used.
type LimitUse struct {
	Limit string  // "usd", "turns", "wall_time" or "credits"
	Used  float64 // in the limit's unit
	Max   float64
	Level Level
	// Reason, when set, is why the call is refused instead of a limit's
	// figures (a denial that is not about money or turns, e.g. a store
	// that can no longer record calls).
	Reason string
}

// Decision is a budget's answer before a model call: the overall level
// and every limit at Warn or Deny, the denied ones first.
type Decision struct {
	Level  Level
	Limits []LimitUse
}

// Decide makes the Decision for a set of limit states, dropping those at
// Allow.
func Decide(uses ...LimitUse) Decision {
	var d Decision
	for _, u := range uses {
		if u.Level == Allow {
			continue
		}
		d.Level = max(d.Level, u.Level)
		d.Limits = append(d.Limits, u)
	}
	slices.SortStableFunc(d.Limits, func(a, b LimitUse) int { return int(b.Level - a.Level) })
	return d
}

// Budget is what the gateway asks before a model call and tells after
// it. The gateway runs one call at a time per execution, so a Budget sees
// Check, then at most one Charge, then the next Check; a Budget shared by
// several executions (a credit balance) must be safe for concurrent use.
type Budget interface {
	// Check says whether one more model call may go ahead: Allow, Warn
	// (the call goes ahead carrying a wrap-up instruction) or Deny (it is
	// refused and never reaches the provider).
	Check() Decision
	// Charge records a finished call: what it cost and the turns it used
	// (1 if the provider started a message, else 0).
	Charge(usd float64, turns int)
	// Remaining is the dollar limit with the least left of all the
	// budget's layers (the execution's own limit, the credits reserved
	// for it, a delegating parent's carve-out): its name ("usd",
	// "credits", ...), Used and Max in dollars, Level as Check would say.
	// limited is false when no layer limits dollars. The gateway bounds
	// every call's worst case by Max-Used before forwarding it (see
	// bound.go), so spend never passes Max; a layered budget returns the
	// use whose Max-Used is least (MinRemaining picks it).
	Remaining() (use LimitUse, limited bool)
}

// MinRemaining is the LimitUse with the least left (Max-Used) of those
// that are limited, for a Budget made of layers; limited is false when
// none is.
func MinRemaining(uses ...LimitUse) (use LimitUse, limited bool) {
	for _, u := range uses {
		if !limited || u.Max-u.Used < use.Max-use.Used {
			use, limited = u, true
		}
	}
	return use, limited
}

// WarnAt is the share of a limit from which a budget warns.
const WarnAt = 0.9

// Limits is a Budget held in memory: at most USD dollars and Turns model
// calls, each ignored when zero. Use a pointer; the zero value allows
// everything.
//
// The USD limit warns once spend reaches 90% and denies at 100%. The turn
// limit counts the call about to be made: it warns when that call brings
// the count to 90% or more (with Turns 5, the fifth call is warned) and
// denies once Turns calls were made.
type Limits struct {
	USD   float64
	Turns int

	mu    sync.Mutex
	usd   float64
	turns int
}

var _ Budget = (*Limits)(nil)

// Check implements Budget.
func (l *Limits) Check() Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	var uses []LimitUse
	if l.USD > 0 {
		u := LimitUse{Limit: "usd", Used: l.usd, Max: l.USD}
		switch {
		case l.usd >= l.USD:
			u.Level = Deny
		case l.usd >= WarnAt*l.USD:
			u.Level = Warn
		}
		uses = append(uses, u)
	}
	if l.Turns > 0 {
		u := LimitUse{Limit: "turns", Used: float64(l.turns), Max: float64(l.Turns)}
		switch {
		case l.turns >= l.Turns:
			u.Level = Deny
		case 10*(l.turns+1) >= 9*l.Turns: // integer form of (turns+1) >= 0.9*Turns
			u.Level = Warn
		}
		uses = append(uses, u)
	}
	return Decide(uses...)
}

// Charge implements Budget.
func (l *Limits) Charge(usd float64, turns int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.usd += usd
	l.turns += turns
}

// Remaining implements Budget: the USD limit, if there is one.
func (l *Limits) Remaining() (LimitUse, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.USD <= 0 {
		return LimitUse{}, false
	}
	u := LimitUse{Limit: "usd", Used: l.usd, Max: l.USD}
	switch {
	case l.usd >= l.USD:
		u.Level = Deny
	case l.usd >= WarnAt*l.USD:
		u.Level = Warn
	}
	return u, true
}

// Raise adds usd (> 0) to the USD limit (a top-up) and returns the new
// limit. A budget without a USD limit is left without one.
func (l *Limits) Raise(usd float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.USD > 0 && usd > 0 {
		l.USD += usd
	}
	return l.USD
}

// Spent is what has been charged so far.
func (l *Limits) Spent() (usd float64, turns int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usd, l.turns
}

// unlimited is the Budget of an execution registered without one.
type unlimited struct{}

func (unlimited) Check() Decision             { return Decision{} }
func (unlimited) Charge(float64, int)         {}
func (unlimited) Remaining() (LimitUse, bool) { return LimitUse{}, false }
