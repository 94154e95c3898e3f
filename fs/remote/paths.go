package remote

import (
	"fmt"
	"path"
	"strings"
	"syscall"
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
