// Package duration is the one Duration type of Hearth's files and wire
// formats: a time.Duration written as text ("90s", "1h30m") in TOML
// (hearth.toml, agent definitions) and JSON (the guest protocol, stored
// records). appliance, agents and vmm/guest name it as their own
// Duration, an alias of this one.
package duration

import (
	"fmt"
	"time"
)

// Duration is a time.Duration that reads and writes as text.
type Duration time.Duration

// MarshalText writes d as time.Duration.String does ("1m30s").
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what time.ParseDuration reads.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration: write it like 90s, 10m or 1h30m", b)
	}
	*d = Duration(v)
	return nil
}
