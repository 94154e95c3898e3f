package remote

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"syscall"

	"hearth/fs"
)

// rel turns an SFTP path (absolute or relative to the view's root, which
// is the SFTP "/") into a path relative to the view, for os.Root. ".."
// cannot climb above the root: path.Clean of an absolute path drops it.
func rel(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q: %w", p, syscall.EINVAL)
	}
	p = path.Clean("/" + p)
	if p == "/" {
		return ".", nil
	}
	return p[1:], nil
}

// ErrBadUser means an SSH user names no session view.
var ErrBadUser = errors.New("bad workspace user: want SESSION or SESSION+FROM+TO+SIZE")

// viewUser is what an SSH user asks for: a session's view, with owners
// shifted as for a machine that runs in its own range of host ids.
type viewUser struct {
	session string
	ids     fs.IDShift
}

// parseUser reads "SESSION" or "SESSION+FROM+TO+SIZE" (fs.IDShift).
func parseUser(u string) (viewUser, error) {
	parts := strings.Split(u, "+")
	v := viewUser{session: parts[0]}
	if err := fs.ValidateID("session", v.session); err != nil {
		return viewUser{}, fmt.Errorf("%w: %w", ErrBadUser, err)
	}
	if len(parts) == 1 {
		return v, nil
	}
	if len(parts) != 4 {
		return viewUser{}, fmt.Errorf("%w: got %q", ErrBadUser, u)
	}
	var n [3]uint32
	for i, p := range parts[1:] {
		x, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return viewUser{}, fmt.Errorf("%w: %q: %w", ErrBadUser, p, err)
		}
		n[i] = uint32(x)
	}
	v.ids = fs.IDShift{From: n[0], To: n[1], Size: n[2]}
	if uint64(v.ids.From)+uint64(v.ids.Size) > 1<<32 || uint64(v.ids.To)+uint64(v.ids.Size) > 1<<32 {
		return viewUser{}, fmt.Errorf("%w: range %q passes 2^32", ErrBadUser, u)
	}
	return v, nil
}

// String is the SSH user that asks for v.
func (v viewUser) String() string {
	if v.ids == (fs.IDShift{}) {
		return v.session
	}
	return fmt.Sprintf("%s+%d+%d+%d", v.session, v.ids.From, v.ids.To, v.ids.Size)
}
