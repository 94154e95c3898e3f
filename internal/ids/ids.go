// Package ids is the one rule for the names Hearth gives the things it
// runs and keeps by name on disk: machines and their checkpoints (vmm and
// its drivers), sandboxes and their jobs (appliance) and agents (agents).
//
// A name is 1-63 lowercase letters, digits or '-', starting with a
// letter: it is safe as a file name and a cgroup, never reads as a number
// or a command-line option, and has no '.' to collide with the suffixes
// the drivers add (.ext4, .partial, .json). Two rules used to disagree on
// the first character (agents wanted a letter, machines and sandboxes
// also took a digit); the stricter is kept. Workspace sessions and
// snapshots are path components with a wider rule of their own
// (fs.ValidateID).
package ids

import (
	"fmt"
	"regexp"
)

// Rule says what a valid name is, for error messages.
const Rule = "1-63 lowercase letters, digits or '-', starting with a letter"

var pattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// Valid says whether name follows the rule.
func Valid(name string) bool { return pattern.MatchString(name) }

// Check returns an error naming what (such as "machine id") and saying
// the rule unless name follows it.
func Check(what, name string) error {
	if !Valid(name) {
		return fmt.Errorf("%s %q: use %s", what, name, Rule)
	}
	return nil
}
