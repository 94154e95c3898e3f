package guest

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// siginfoPID reads si_pid from a siginfo filled by waitid(2): on Linux it
// follows si_signo, si_errno and si_code (three int32s) and 4 bytes of
// padding on 64-bit.
func siginfoPID(info *unix.Siginfo) int32 {
	return *(*int32)(unsafe.Add(unsafe.Pointer(info), 16))
}
