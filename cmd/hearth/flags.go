package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	flag "github.com/spf13/pflag"

	"hearth/client"
)

// Flags that refuse at the door what the daemon would take wrongly: a
// budget of NaN, of $0 or under the ledger's unit (which would be no
// limit at all), a negative timeout or turn count (silently ignored).
// The flag package names the flag in the error.

// usdFlag is --budget: dollars, more than zero and at least the ledger's
// unit when given.
type usdFlag float64

func (f *usdFlag) Type() string { return "USD" }

func (f *usdFlag) String() string { return strconv.FormatFloat(float64(*f), 'f', -1, 64) }

func (f *usdFlag) Set(v string) error {
	usd, err := parseUSD(v)
	if err != nil {
		return err
	}
	*f = usdFlag(usd)
	return nil
}

// onBudgetFlag is --on-budget: stop or pause.
type onBudgetFlag string

func (f *onBudgetFlag) Type() string { return "stop|pause" }

func (f *onBudgetFlag) String() string { return string(*f) }

func (f *onBudgetFlag) Set(v string) error {
	if v != "stop" && v != "pause" {
		return fmt.Errorf("%q: use stop (end the execution at the limit) or pause (wait for 'hearth agents topup')", v)
	}
	*f = onBudgetFlag(v)
	return nil
}

// parseUSD reads a positive number of dollars, "12.50" or "$12.50".
func parseUSD(v string) (float64, error) {
	usd, err := strconv.ParseFloat(strings.TrimPrefix(strings.TrimSpace(v), "$"), 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number of dollars (like 5 or 0.25)", v)
	}
	if err := client.CheckUSD(usd); err != nil {
		return 0, err
	}
	if usd == 0 {
		return 0, fmt.Errorf("$0 would leave no budget: give a positive number of dollars, or no flag for the agent's limit")
	}
	return usd, nil
}

// positiveDuration is --timeout: a duration above zero.
type positiveDuration time.Duration

func (d *positiveDuration) Type() string { return "DURATION" }

func (d *positiveDuration) String() string { return time.Duration(*d).String() }

func (d *positiveDuration) Set(v string) error {
	t, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%q is not a duration (like 90s, 10m or 1h)", v)
	}
	if t <= 0 {
		return fmt.Errorf("%v: give a positive duration (like 10m), or no flag for the agent's limit", t)
	}
	*d = positiveDuration(t)
	return nil
}

// positiveInt is --max-calls: a count above zero.
type positiveInt int

func (n *positiveInt) Type() string { return "N" }

func (n *positiveInt) String() string { return strconv.Itoa(int(*n)) }

func (n *positiveInt) Set(v string) error {
	i, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%q is not a whole number", v)
	}
	if i <= 0 {
		return fmt.Errorf("%d: give a positive number, or no flag for the agent's limit", i)
	}
	*n = positiveInt(i)
	return nil
}

// deprecatedName is a flag's old name: it sets the same value, and
// notes that it was used so the command can say it is deprecated.
type deprecatedName struct {
	v    flag.Value
	used *bool
}

func (d *deprecatedName) Type() string { return d.v.Type() }

func (d *deprecatedName) String() string {
	if d.v == nil {
		return ""
	}
	return d.v.String()
}

func (d *deprecatedName) Set(v string) error {
	*d.used = true
	return d.v.Set(v)
}
