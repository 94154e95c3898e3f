package fs

import (
	"os"
	"unsafe"

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

// setMtime dates the file open as fd modified at mtime (unix ns), leaving
// its access time: futimens(3), which x/sys does not wrap.
func setMtime(fd uintptr, mtime int64) error {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime)}
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, fd, 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
