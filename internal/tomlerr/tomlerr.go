// Package tomlerr words TOML decoding errors for people: a syntax error
// with the line it is on and a pointer to it.
//
// Importers: agents (definitions), appliance (the config), image (recipes).
package tomlerr

import (
	"errors"

	"github.com/BurntSushi/toml"
)

// Describe is err's message: for a syntax error, with the line it is on,
// or without it where the TOML library cannot say. Its ErrorWithPosition
// panics on some inputs (a lone `"\` indexes a line before the first),
// which a fuzz target found in each file format using it.
func Describe(err error) (msg string) {
	var perr toml.ParseError
	if !errors.As(err, &perr) {
		return err.Error()
	}
	defer func() {
		if recover() != nil {
			msg = perr.Error()
		}
	}()
	return perr.ErrorWithPosition()
}
