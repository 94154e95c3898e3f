// Package version says which build of Hearth is running: its version, the
// commit it was built from and the Go toolchain. The version is stamped
// at build time (scripts/package.sh and scripts/demo.sh pass
// -ldflags "-X hearth/internal/version.Version=..."); the commit comes
// from the same flag or, for a plain `go build` inside the repository,
// from the VCS stamp Go records in the binary. cmd/hearth, cmd/hearth-guest
// and appliance (for the API's version answer) import it.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Stamped at build time with -ldflags -X; see the package doc.
var (
	Version = "devel"
	Commit  = ""
)

// Info is a build's identity.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Dirty   bool   `json:"dirty,omitempty"` // built from a tree with uncommitted changes
	Go      string `json:"go"`
}

// Get returns this binary's Info.
func Get() Info {
	in := Info{Version: Version, Commit: Commit, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if in.Commit == "" {
					in.Commit = s.Value
				}
			case "vcs.modified":
				in.Dirty = s.Value == "true"
			}
		}
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	return in
}

// String is the one-line form: "hearth 1.2.0 (commit 81dc4af, go1.26.8)".
func (in Info) String() string {
	c := in.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if in.Dirty {
		c += "+dirty"
	}
	return fmt.Sprintf("%s (commit %s, %s)", in.Version, c, in.Go)
}
