// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// _DEV_IOC_CLONE is FUSE_DEV_IOC_CLONE, _IOR(229, 0, uint32_t): attach a
// newly opened /dev/fuse to the connection of the descriptor given.
const _DEV_IOC_CLONE = 0x8004e500

// CloneDevice opens /dev/fuse again and attaches it to this server's
// connection (FUSE_DEV_IOC_CLONE). The kernel hands each request to one
// of the connection's descriptors that reads, and ends the connection
// only when the last of them is closed: a process holding the clone
// keeps the mount alive after this one exits. Requests this server read
// but had not answered when its own descriptor closes fail with
// ECONNABORTED. The clone is close-on-exec and blocking.
func (ms *Server) CloneDevice() (*os.File, error) {
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("clone FUSE device: %w", err)
	}
	var errno syscall.Errno
	if cerr := ms.fuseFD.withFD(func(src int) {
		from := uint32(src)
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), _DEV_IOC_CLONE, uintptr(unsafe.Pointer(&from)))
	}); cerr != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("clone FUSE device: %w", cerr)
	}
	if errno != 0 {
		syscall.Close(fd)
		return nil, fmt.Errorf("clone FUSE device: %w", errno)
	}
	return os.NewFile(uintptr(fd), "/dev/fuse"), nil
}

// Retire stops passing requests to the file system: from now on each
// request that expects an answer is answered ESTALE, and the others
// (FORGET, INTERRUPT) are dropped. The readers go on until the
// connection ends. A kernel that gets ESTALE for an open or a path
// lookup walks the path again from its start, revalidating every name,
// so a process caught with this mount's names in the middle of a path
// walk lands on whatever is mounted there now. Irreversible.
func (ms *Server) Retire() {
	ms.protocolServer.retired.Store(true)
}
