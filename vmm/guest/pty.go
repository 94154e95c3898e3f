package guest

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/creack/pty"
)

// runPTY runs cmd on a new terminal: the process gets it as stdin, stdout
// and stderr and as its controlling terminal; what it writes comes back as
// stdout frames.
func (s *Server) runPTY(ctx context.Context, req *ExecRequest, cmd *exec.Cmd, stdin io.Reader, out *frameWriter) ExitStatus {
	size := &pty.Winsize{Rows: req.Rows, Cols: req.Cols}
	if size.Rows == 0 || size.Cols == 0 {
		size.Rows, size.Cols = 24, 80
	}
	cmd.SysProcAttr.Setpgid = false // Setsid (below) makes its own group
	s.mu.Lock()
	tty, err := pty.StartWithAttrs(cmd, size, &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: cmd.SysProcAttr.Credential})
	if err == nil {
		s.procs[cmd.Process.Pid] = cmd
		s.ptys[cmd.Process.Pid] = tty
	}
	s.mu.Unlock()
	if err != nil {
		close(out.started)
		return ExitStatus{Code: -1, Error: err.Error()}
	}
	pid := cmd.Process.Pid
	defer func() {
		s.mu.Lock()
		delete(s.ptys, pid)
		s.mu.Unlock()
		s.untrack(pid)
	}()
	out.frame(FrameStarted, []byte(strconv.Itoa(pid)))
	close(out.started)
	if req.Stdin {
		go io.Copy(tty, stdin)
	}
	copied := make(chan struct{})
	go func() {
		io.Copy(streamWriter{out, FrameStdout}, tty) // ends with EIO once the process and its children close the terminal
		close(copied)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var st ExitStatus
	select {
	case err := <-done:
		st = exitStatus(cmd, err, false)
	case <-ctx.Done():
		syscall.Kill(-pid, syscall.SIGKILL)
		st = exitStatus(cmd, <-done, ctx.Err() == context.DeadlineExceeded)
	}
	select { // the last output, unless a background child keeps the terminal
	case <-copied:
	case <-time.After(time.Second):
	}
	tty.Close()
	return st
}

// resize changes the terminal size of a running PTY exec.
func (s *Server) resize(w http.ResponseWriter, r *http.Request) {
	pid, _ := strconv.Atoi(r.PathValue("pid"))
	rows, err1 := strconv.ParseUint(r.URL.Query().Get("rows"), 10, 16)
	cols, err2 := strconv.ParseUint(r.URL.Query().Get("cols"), 10, 16)
	if err1 != nil || err2 != nil || rows == 0 || cols == 0 {
		fail(w, http.StatusBadRequest, "bad_request", "resize: want rows and cols, both positive")
		return
	}
	s.mu.Lock()
	tty := s.ptys[pid]
	s.mu.Unlock()
	if tty == nil {
		fail(w, http.StatusNotFound, "not_found", "resize: no running PTY exec %d", pid)
		return
	}
	if err := pty.Setsize(tty, &pty.Winsize{Rows: uint16(rows), Cols: uint16(cols)}); err != nil {
		fail(w, http.StatusConflict, "gone", "resize %d: %v", pid, err)
		return
	}
	reply(w, map[string]uint64{"rows": rows, "cols": cols})
}
