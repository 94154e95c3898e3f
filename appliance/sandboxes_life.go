package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"hearth/fs"
	"hearth/vmm"
	"hearth/vmm/guest"
)

// recoverAll re-attaches to the machines of every sandbox record, like
// Nomad's RecoverTask: a machine that is gone leaves its sandbox stopped
// (shown by ls, removed by destroy); a live one gets its workspace view
// mounted again and, if its record says so, is paused again.
func (m *sandboxManager) recoverAll() {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		m.log.Warn("sandboxes: read records", "err", err)
		return
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(id, ".") {
			continue
		}
		rec, err := m.load(id)
		if err != nil {
			m.log.Warn("sandbox: unreadable record, skipped", "id", id, "err", err)
			continue
		}
		s := m.recoverOne(rec)
		m.boxes[id] = s
	}
}

func (m *sandboxManager) load(id string) (sandboxRecord, error) {
	var rec sandboxRecord
	b, err := os.ReadFile(filepath.Join(m.dir, id+".json"))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err == nil && rec.ID != id {
		err = fmt.Errorf("record names sandbox %q", rec.ID)
	}
	return rec, err
}

func (m *sandboxManager) recoverOne(rec sandboxRecord) *sandbox {
	s := &sandbox{rec: rec, last: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mach, attached, err := m.recoverMachine(ctx, s)
	if err != nil {
		if !errors.Is(err, vmm.ErrNotFound) {
			m.log.Warn("sandbox: recover", "id", rec.ID, "err", err)
		}
		m.log.Warn("sandbox: its machine is gone after the restart; marked stopped (remove it with `hearth sandboxes destroy ID`)", "id", rec.ID)
		s.exitSeen = true
		return s
	}
	s.m = mach
	if rec.Session == "" {
		attached = true
	} else if !attached {
		attached = m.attachView(ctx, s)
	}
	switch rec.Paused {
	case "":
	case pausedRestart:
		m.resumeAfterRestart(ctx, s, attached)
	default:
		if err := mach.Pause(ctx); err != nil {
			m.log.Warn("sandbox: pause again after the restart", "id", rec.ID, "err", err)
		}
	}
	m.log.Info("sandbox recovered", "id", rec.ID, "image", rec.Image, "session", rec.Session, "status", s.status())
	return s
}

// recoverMachine recovers s's machine. A driver that can put the new
// workspace view in place before the machine runs again gets it then
// (attached): a VM paused across the restart is resumed for a moment
// while its driver reaches its agent, and must not write into the dead
// view meanwhile.
func (m *sandboxManager) recoverMachine(ctx context.Context, s *sandbox) (mach vmm.Machine, attached bool, err error) {
	wr, ok := m.driver.(vmm.WorkspaceRecoverer)
	if !ok || s.rec.Session == "" {
		mach, err = m.driver.Recover(ctx, s.rec.ID)
		return mach, false, err
	}
	if err := m.mountView(s); err != nil {
		m.log.Warn("sandbox: mount workspace view", "id", s.rec.ID, "err", err)
		mach, err = m.driver.Recover(ctx, s.rec.ID)
		return mach, false, err
	}
	mach, err = wr.RecoverWithWorkspace(ctx, s.rec.ID, s.view.Dir())
	if errors.Is(err, vmm.ErrNoWorkspace) {
		mach, err = m.driver.Recover(ctx, s.rec.ID)
		return mach, false, err
	}
	if err != nil {
		s.view.Unmount()
		s.view = nil
	}
	return mach, err == nil, err
}

// mountView mounts a new workspace view for s: the machine still holds
// the old one, whose connection ended with the old daemon.
func (m *sandboxManager) mountView(s *sandbox) error {
	ids, err := viewIDs(m.driver, s.rec.ID)
	if err == nil {
		s.view, err = m.store.Mount(m.viewDir(s.rec.ID), fs.ViewOptions{Session: s.rec.Session, IDs: ids})
	}
	return err
}

// attachView puts a new workspace view (mounted here if need be) in
// place of the dead one in s's recovered machine, and reports whether it
// did.
func (m *sandboxManager) attachView(ctx context.Context, s *sandbox) bool {
	if s.view == nil {
		if err := m.mountView(s); err != nil {
			m.log.Warn("sandbox: mount workspace view", "id", s.rec.ID, "err", err)
			return false
		}
	}
	wa, ok := s.m.(vmm.WorkspaceAttacher)
	if !ok {
		m.log.Warn("sandbox: its machine cannot take a new workspace view; /workspace/agents in it is gone until it is recreated", "id", s.rec.ID, "driver", m.driver.Name())
		return false
	}
	if err := wa.AttachWorkspace(ctx, s.view.Dir()); err != nil {
		m.log.Warn("sandbox", "id", s.rec.ID, "err", err)
		return false
	}
	return true
}

// freezeForRestart pauses a running sandbox whose workspace view is about
// to end with this daemon, and records why, for the next daemon's
// resumeAfterRestart. If the pause fails the machine runs on, and its
// workspace writes fail until the next daemon attaches a new view.
func (m *sandboxManager) freezeForRestart(s *sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Hang up on the agent first, while it runs: a VM's agent learns of
	// it from its port, and one paused meanwhile would take the next
	// daemon's session for the rest of this one.
	s.m.Guest().Close()
	time.Sleep(hangupGrace)
	open, err := m.pauseQuiet(ctx, s)
	if err != nil {
		m.log.Warn("sandbox: pause while no daemon serves its workspace; its workspace writes fail until the next daemon starts", "id", s.rec.ID, "err", err)
		return
	}
	if open > 0 {
		m.log.Warn("sandbox: paused with files open in its workspace: their next read or write fails after the restart (reopened, they work)", "id", s.rec.ID, "open", open)
	}
	s.rec.Paused = pausedRestart
	if err := m.save(&s.rec); err != nil {
		// Unrecorded, the next daemon would not know to resume it.
		m.log.Warn("sandbox: record the pause for the restart; resuming it", "id", s.rec.ID, "err", err)
		if err := s.m.Resume(ctx); err != nil {
			m.log.Warn("sandbox", "id", s.rec.ID, "err", err)
		}
		s.rec.Paused = ""
		return
	}
	m.log.Info("sandbox paused until the next daemon serves its workspace", "id", s.rec.ID)
}

// hangupGrace is how long a machine runs after the stopping daemon hung
// up on its agent, for the agent to see it, before it is paused.
const hangupGrace = 200 * time.Millisecond

// quietWait bounds how long pauseQuiet looks for a moment when no file
// is open in a sandbox's workspace and no path is being resolved.
const quietWait = 3 * time.Second

// lookupGap is how long before a pause the view must have resolved no
// name: a process of the machine caught between resolving a path and
// opening it (or between two steps of the path) holds node ids of the
// dying view, and its open fails after the restart. Under QEMU's
// software emulation on a loaded host a path's steps were seen a few
// milliseconds apart; the three writers of the pause test resolve a path
// every 33 ms on average, and still leave a moment this quiet in about
// one try of five.
const lookupGap = 50 * time.Millisecond

// pauseQuiet pauses s's machine at a moment when no file is open through
// its workspace view and no name was resolved in it for lookupGap, if
// one comes within quietWait: a file open across a restart belongs to
// the dead view, so the write of a process caught between its open and
// its close would fail (it is told), and so would the open of one caught
// resolving the path. Each try pauses, lets the requests and closes
// already made reach the view, and resumes if a file is still open or a
// name was resolved too recently. It returns how many files were open at
// the pause it kept.
func (m *sandboxManager) pauseQuiet(ctx context.Context, s *sandbox) (int, error) {
	deadline := time.Now().Add(quietWait)
	for {
		if err := s.m.Pause(ctx); err != nil {
			return 0, err
		}
		paused := time.Now()
		open := s.view.OpenFiles()
		// A close's release, and a request the machine sent just before
		// it stopped, reach the view shortly after.
		for settle := paused.Add(100 * time.Millisecond); open > 0 && time.Now().Before(settle); open = s.view.OpenFiles() {
			time.Sleep(5 * time.Millisecond)
		}
		if open == 0 {
			time.Sleep(10 * time.Millisecond)
			open = s.view.OpenFiles()
		}
		resolving := s.view.LastLookup().After(paused.Add(-lookupGap))
		if open == 0 && !resolving {
			return 0, nil
		}
		if time.Now().After(deadline) {
			if resolving {
				m.log.Warn("sandbox: paused while its workspace was resolving a path: a file being opened then fails after the restart (reopened, it works)", "id", s.rec.ID)
			}
			return open, nil
		}
		if err := s.m.Resume(ctx); err != nil {
			return open, nil // still paused: keep this pause
		}
		time.Sleep(time.Duration(5+rand.IntN(30)) * time.Millisecond)
	}
}

// resumeAfterRestart resumes a sandbox the last daemon paused for its
// restart, now that its new view is attached (if it has a session). If
// the view is not attached, or the resume fails, it is left paused as if
// for being idle: the next exec or file call resumes it.
func (m *sandboxManager) resumeAfterRestart(ctx context.Context, s *sandbox, attached bool) {
	s.rec.Paused = pausedIdle
	if !attached {
		m.log.Warn("sandbox: left paused after the restart: its workspace view is not attached", "id", s.rec.ID)
	} else if err := s.m.Resume(ctx); err != nil {
		m.log.Warn("sandbox: resume after the restart", "id", s.rec.ID, "err", err)
	} else {
		s.rec.Paused = ""
		m.log.Info("sandbox resumed after the restart", "id", s.rec.ID)
	}
	if err := m.save(&s.rec); err != nil {
		m.log.Warn("sandbox", "id", s.rec.ID, "err", err)
	}
}

// idleLoop pauses sandboxes that have been idle for their idle timeout.
func (m *sandboxManager) idleLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.tick)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			for _, s := range m.list() {
				m.pauseIfIdle(s)
			}
		}
	}
}

// pauseIfIdle pauses s if nothing used it for its idle timeout: no API
// call, no exec or file call in flight, and no background job running.
func (m *sandboxManager) pauseIfIdle(s *sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed || s.exitSeen {
		return
	}
	if s.stopped() {
		s.exitSeen = true
		m.log.Warn("sandbox: its machine stopped by itself (see the driver's audit log); destroy the sandbox to clean up", "id", s.rec.ID)
		return
	}
	idle := time.Duration(s.rec.IdleTimeout)
	if idle <= 0 || s.rec.Paused != "" || s.active > 0 || time.Since(s.last) < idle {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	jobs, err := s.m.Guest().Jobs(ctx)
	if err != nil {
		m.log.Warn("sandbox: list jobs before an idle pause", "id", s.rec.ID, "err", err)
		return
	}
	for _, j := range jobs {
		if j.State == guest.JobRunning {
			s.last = time.Now() // busy: look again after another idle period
			return
		}
	}
	if err := s.m.Pause(ctx); err != nil {
		m.log.Warn("sandbox: idle pause", "id", s.rec.ID, "err", err)
		return
	}
	s.rec.Paused = pausedIdle
	if err := m.save(&s.rec); err != nil {
		m.log.Warn("sandbox", "id", s.rec.ID, "err", err)
	}
	m.log.Info("sandbox paused; the next exec or file call resumes it", "id", s.rec.ID, "by", pausedIdle, "idle", idle)
}

// abortFUSE ends the FUSE connection of the view mounted at dir, through
// the fusectl filesystem (mounted if need be). A machine holding the view
// in its own mount namespace would otherwise keep the connection, and
// unmounting the view would wait for it forever.
func abortFUSE(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("abort workspace view %s: %w", dir, err)
	}
	// fusectl names a connection by the kernel's dev_t (major<<20|minor).
	conn := fmt.Sprint(unix.Major(st.Dev)<<20 | unix.Minor(st.Dev))
	const ctl = "/sys/fs/fuse/connections"
	abort := filepath.Join(ctl, conn, "abort")
	if _, err := os.Stat(abort); errors.Is(err, os.ErrNotExist) {
		if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("abort workspace view %s: mount fusectl: %w", dir, err)
		}
	}
	if err := os.WriteFile(abort, []byte("1"), 0o200); err != nil {
		return fmt.Errorf("abort workspace view %s: %w", dir, err)
	}
	return nil
}
