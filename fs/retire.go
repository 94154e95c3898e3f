package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
)

// A view's FUSE connection ends with the process that serves it, and
// every process still holding one of its names then gets ENOTCONN: a
// machine that outlives a daemon restart, caught between resolving a
// path under /workspace/agents and opening it, would fail that open
// although the next daemon's view is mounted by the time it runs again.
//
// Retire and StartKeeper let the connection outlive the daemon instead,
// answering ESTALE. That is the error the kernel takes to mean "the names
// you hold are stale": an open, a stat or any other path call that gets
// it walks its path again from the start, revalidating every name, and
// lands on the view mounted there now. A machine's guest kernel does the
// same with ESTALE from virtiofsd. Only what cannot be walked again still
// fails: a file opened through the old view, or a working directory in it.

// Retire ends the view's service without ending its FUSE connection:
// from now on every request is answered ESTALE without reaching the
// store, the mount is detached where the view was mounted (other mounts
// of it, such as a VM's share, keep it until replaced), and the returned
// descriptor is a clone of the connection's device. Whoever holds it
// keeps the connection alive; give it to StartKeeper, which answers
// ESTALE once this process has exited. The view's request readers go on
// answering ESTALE until the connection ends. Unmount is a no-op after a
// successful Retire; after a failed one the view serves on.
func (v *View) Retire() (*os.File, error) {
	v.closeMu.Lock()
	defer v.closeMu.Unlock()
	if v.closed {
		return nil, fmt.Errorf("retire view at %s: %w", v.dir, ErrClosed)
	}
	clone, err := v.srv.CloneDevice()
	if err != nil {
		return nil, fmt.Errorf("retire view at %s: %w", v.dir, err)
	}
	v.srv.Retire()
	v.closed = true
	// A mount left behind answers ESTALE, which the next daemon's
	// CleanStaleMount takes for a dead one and detaches.
	syscall.Unmount(v.dir, syscall.MNT_DETACH)
	close(v.done) // the notifier stops: nothing may reach the kernel for this view but ESTALE
	v.forget()
	return clone, nil
}

// keeperEnv, set in its environment, makes a process started from a
// binary that imports this package a keeper (StartKeeper): this
// package's init serves the connections and exits, before main runs.
const keeperEnv = "HEARTH_FUSE_KEEPER"

// KeeperArg is the keeper's first argument, so that it can be told from
// other processes of the same binary (/proc/PID/cmdline).
const KeeperArg = "hearth-fuse-keeper"

func init() {
	if n, err := strconv.Atoi(os.Getenv(keeperEnv)); err == nil {
		os.Exit(keep(n))
	}
}

// StartKeeper starts a process (this binary, run again: /proc/self/exe)
// that holds conns, clones of retired views' connections (Retire), and
// answers every request on them ESTALE, as this process's own readers
// do since Retire (and go on doing until it exits). It
// runs in a session of its own, so it outlives this process, and ends
// when every connection has ended (the last process using the old mount
// let go of it) or on SIGTERM, which aborts the connections it holds
// last: processes still holding their names get ENOTCONN from then on.
// The caller may close conns once it returns.
func StartKeeper(conns []*os.File) (*os.Process, error) {
	if len(conns) == 0 {
		return nil, errors.New("start FUSE keeper: no connections")
	}
	cmd := exec.Command("/proc/self/exe", KeeperArg)
	cmd.Env = append(os.Environ(), keeperEnv+"="+strconv.Itoa(len(conns)))
	cmd.ExtraFiles = conns
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start FUSE keeper: %w", err)
	}
	return cmd.Process, nil
}

// keep is the keeper's main: it serves descriptors 3 to 3+n-1 and
// returns when all have ended, or exits on SIGTERM.
func keep(n int) int {
	if n <= 0 || n > 4096 {
		fmt.Fprintf(os.Stderr, "%s: %s=%d: want the number of descriptors from 3 on\n", KeeperArg, keeperEnv, n)
		return 2
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-term
		os.Exit(0) // closing the descriptors aborts the connections
	}()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(fd int) {
			defer wg.Done()
			answerStale(fd)
		}(3 + i)
	}
	wg.Wait()
	return 0
}

// keeperBuf is the size of the keeper's read buffer: the kernel refuses
// a read smaller than the largest request it may send, a write of the
// view's MaxWrite (1 MiB) with its headers.
const keeperBuf = 1<<20 + 64<<10

// answerStale answers each request read from fd ESTALE until the
// connection ends (ENODEV) or the descriptor fails.
func answerStale(fd int) {
	buf := make([]byte, keeperBuf)
	var out [outHeaderLen]byte
	for {
		n, err := syscall.Read(fd, buf)
		if err == syscall.EINTR || err == syscall.EAGAIN || err == syscall.ENOENT {
			continue // interrupted, or a request withdrawn before it was read
		}
		if err != nil {
			return // ENODEV: the connection ended
		}
		if staleReply(buf[:n], out[:]) {
			// ENOENT: the request was interrupted meanwhile. Nothing to do
			// about any other error either: the next read tells.
			syscall.Write(fd, out[:])
		}
	}
}

// The FUSE wire format (linux/fuse.h): a request starts with struct
// fuse_in_header (len u32, opcode u32, unique u64, nodeid u64, uid, gid,
// pid u32, total_extlen u16, padding u16), an answer with struct
// fuse_out_header (len u32, error i32, unique u64).
const (
	inHeaderLen  = 40
	outHeaderLen = 16

	opForget      = 2
	opInterrupt   = 36
	opBatchForget = 42
)

// staleReply fills out with the answer ESTALE to the request req and
// reports whether one is due: FORGET, BATCH_FORGET and INTERRUPT get
// none, nor does a request too short to carry its header or whose
// header's length disagrees with what was read.
func staleReply(req, out []byte) bool {
	if len(req) < inHeaderLen || len(out) < outHeaderLen {
		return false
	}
	if int(binary.LittleEndian.Uint32(req)) != len(req) {
		return false
	}
	switch binary.LittleEndian.Uint32(req[4:]) {
	case opForget, opBatchForget, opInterrupt:
		return false
	}
	binary.LittleEndian.PutUint32(out, outHeaderLen)
	errno := -int32(syscall.ESTALE)
	binary.LittleEndian.PutUint32(out[4:], uint32(errno))
	copy(out[8:16], req[8:16]) // unique
	return true
}
