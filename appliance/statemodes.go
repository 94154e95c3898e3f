package appliance

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// The state directory holds every session's events, the API token and
// the workspace: nobody but root may read it, whatever modes an operator
// (or scripts/demo.sh) gave it before the first start.

// secureStateDir makes the state directory (0700) if missing and tightens
// it and the files directly in it (0600) if they exist already looser.
// Subdirectories keep their modes: images and machines' layers have
// modes of their own, and the state directory's 0700 already keeps every
// other user out of them.
func secureStateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state_dir %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("state_dir %s: make it private: %w", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("state_dir %s: %w", dir, err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 == 0 {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Chmod(p, fi.Mode().Perm()&^0o077); err != nil {
			return fmt.Errorf("state file %s: make it private: %w", p, err)
		}
	}
	return nil
}

// createPrivate makes path an empty file readable by root only if it does
// not exist, so that what opens it next (SQLite, which gives its -wal and
// -shm files the database's mode) keeps that mode.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// stateModeProblems lists what in the state directory other users could
// read or enter, for the doctor.
func stateModeProblems(dir string) []string {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil // not made yet: the daemon makes it 0700
	}
	var out []string
	if fi.Mode().Perm()&0o077 != 0 {
		out = append(out, fmt.Sprintf("%s is mode %04o: other users can enter it (the daemon makes it 0700 when it starts)", dir, fi.Mode().Perm()))
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().Perm()&0o077 != 0 && (fi.Mode().IsRegular() || fi.Mode()&os.ModeSocket != 0) {
			out = append(out, fmt.Sprintf("%s is mode %04o: readable by others (the daemon makes it 0600 when it starts)", filepath.Join(dir, e.Name()), fi.Mode().Perm()))
		}
	}
	return out
}

// umaskMu serialises the daemon's own umask changes.
var umaskMu sync.Mutex

// listenPrivate listens on the unix socket sock, which is made mode 0600
// from the start (under umask 077) rather than chmod-ed after, when another
// user could already have connected.
func listenPrivate(sock string) (net.Listener, error) {
	umaskMu.Lock()
	old := syscall.Umask(0o077)
	ln, err := net.Listen("unix", sock)
	syscall.Umask(old)
	umaskMu.Unlock()
	return ln, err
}
