package fs

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Limits on names, the same as Linux's.
const (
	MaxNameLen = 255
	MaxPathLen = 4096
)

// Reserved directory names inside a session.
const (
	InputsDir  = "inputs"
	OutputsDir = "outputs"
	HomeDir    = ".home" // private: hidden from other sessions' views
)

// Errors returned by the Go API. FUSE callers see the matching errno.
var (
	ErrNotFound      = errors.New("not found")
	ErrExists        = errors.New("already exists")
	ErrBadName       = errors.New("invalid name")
	ErrQuota         = errors.New("quota exceeded")
	ErrReadOnly      = errors.New("read-only")
	ErrNotDir        = errors.New("not a directory")
	ErrIsDir         = errors.New("is a directory")
	ErrSymlinkInPath = errors.New("path crosses a symbolic link")
	ErrNotEmpty      = errors.New("directory not empty")
	ErrClosed        = errors.New("workspace store is closed")
	ErrBusy          = errors.New("busy")
)

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidateID checks a session or snapshot id: 1-63 characters of lowercase
// letters, digits, '.', '_' and '-', starting with a letter or digit.
func ValidateID(kind, id string) error {
	if !idPattern.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("%w: %s id %q: use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", ErrBadName, kind, id)
	}
	return nil
}

// validName checks one path component as stored in a directory.
func validName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%w: %q is not a file name", ErrBadName, name)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: name is %d bytes, the limit is %d", ErrBadName, len(name), MaxNameLen)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("%w: %q contains '/' or NUL", ErrBadName, name)
	}
	return nil
}

// splitPath turns a slash-separated path relative to a session directory
// into its components. It refuses "..", NUL, empty paths and over-long ones,
// rather than cleaning them, so a caller never reaches a place it did not
// name.
func splitPath(p string) ([]string, error) {
	if len(p) > MaxPathLen {
		return nil, fmt.Errorf("%w: path is %d bytes, the limit is %d", ErrBadName, len(p), MaxPathLen)
	}
	var parts []string
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		if c == "" || c == "." {
			continue
		}
		if err := validName(c); err != nil {
			return nil, fmt.Errorf("path %q: %w", p, err)
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("%w: path %q names no file", ErrBadName, p)
	}
	return parts, nil
}
