package appliance

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"hearth/fs"
)

// A stopping daemon retires the workspace views of the machines that
// outlive it (fs.View.Retire) instead of aborting their FUSE connections,
// and leaves them to a keeper process (fs.StartKeeper) that answers
// ESTALE on them. A process of such a machine caught holding names of
// the old view (between resolving a path under /workspace/agents and
// opening it, say) then walks its path again when it runs next, and
// finds the next daemon's view; with the connection aborted it would
// fail with ENOTCONN. The next daemon ends the keeper keeperGrace after
// it has resumed the machines (or when it stops itself), and from then
// on only a file opened through the old view, or a working directory in
// it, still fails.

// keeperGrace is how long the keepers a previous daemon left are kept
// after this one has attached its views and resumed the machines: a
// process caught mid-walk retries within moments of running again.
const keeperGrace = 30 * time.Second

// keepersDir holds an empty file named by the pid of each keeper a
// stopping daemon started. It sits among the records, which are *.json.
func (m *sandboxManager) keepersDir() string { return filepath.Join(m.dir, ".fuse-keepers") }

// startKeeper hands the retired views' connections to a keeper process
// and notes its pid for the next daemon. The connections are closed here
// either way: without a keeper they end with this process.
func (m *sandboxManager) startKeeper(conns []*os.File) {
	if len(conns) == 0 {
		return
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	p, err := fs.StartKeeper(conns)
	if err != nil {
		m.log.Warn("sandbox: no keeper for the retired workspace views: a process caught opening a workspace file at the restart fails with ENOTCONN", "err", err)
		return
	}
	defer p.Release()
	err = os.MkdirAll(m.keepersDir(), 0o700)
	if err == nil {
		err = os.WriteFile(filepath.Join(m.keepersDir(), strconv.Itoa(p.Pid)), nil, 0o600)
	}
	if err != nil {
		m.log.Warn("sandbox: note the workspace views' keeper for the next daemon; it lives until nothing holds the old views", "pid", p.Pid, "err", err)
		return
	}
	m.log.Info("retired workspace views left to a keeper until the next daemon has resumed the machines", "views", len(conns), "pid", p.Pid)
}

// endKeepersLater ends the keepers a previous daemon left keeperGrace
// from now, or at once when this daemon stops.
func (m *sandboxManager) endKeepersLater() {
	if len(m.keepers()) == 0 {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTimer(keeperGrace)
		defer t.Stop()
		select {
		case <-t.C:
		case <-m.stop:
		}
		m.endKeepers()
	}()
}

// endKeepers stops every keeper noted in keepersDir: its connections
// abort, and processes still holding names of those views get ENOTCONN.
func (m *sandboxManager) endKeepers() {
	for _, e := range m.keepers() {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && isKeeper(pid) {
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
				m.log.Warn("sandbox: end the workspace views' keeper", "pid", pid, "err", err)
			}
		}
		os.Remove(filepath.Join(m.keepersDir(), e.Name()))
	}
}

// keepers lists the keepers' notes. A directory that cannot be read is
// logged (its keepers then end only when their connections do).
func (m *sandboxManager) keepers() []os.DirEntry {
	ents, err := os.ReadDir(m.keepersDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("sandbox: list the workspace views' keepers", "dir", m.keepersDir(), "err", err)
	}
	return ents
}

// isKeeper reports whether pid is a keeper (and not a process that
// reused the number of one that ended).
func isKeeper(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := bytes.Split(b, []byte{0})
	return err == nil && len(args) > 1 && string(args[1]) == fs.KeeperArg
}
