package fs

import (
	"os"

	"golang.org/x/sys/unix"
)

// openFd opens p with the open flags given (and O_CLOEXEC), retrying on
// EINTR. The blobs are opened this way: os.OpenFile spends five more
// system calls on each regular file (non-blocking mode on and off, the
// poller's refusal), and the store opens one or two per small file.
func openFd(p string, flags int, perm uint32) (int, error) {
	for {
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, perm)
		if err != unix.EINTR {
			if err != nil {
				return -1, &os.PathError{Op: "open", Path: p, Err: err}
			}
			return fd, nil
		}
	}
}

// openBlobFile is os.OpenFile for a blob, with openFd's cost.
func openBlobFile(p string, flags int, perm uint32) (*os.File, error) {
	fd, err := openFd(p, flags, perm)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

func closeFd(fd int) error { return unix.Close(fd) }
