package fs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUnmountBoundedWhileHeld unmounts a view that a machine's process
// still holds (a working directory in it from another mount namespace,
// as a detached machine has, or an open file), with the process killed
// from outside before, during or never, then mounts the view again at the
// same place. Unmount must return within its bound every time; the test's
// own wait is bounded too, so it can never hang.
func TestUnmountBoundedWhileHeld(t *testing.T) {
	requireFUSE(t)
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("needs sleep(1) for the holding process")
	}
	s := testStore(t)
	mustSession(t, s, "s1")
	if _, err := s.WriteFile("s1", "outputs/held", strings.NewReader("held"), 0, Owner{}); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	type kill int
	const (
		never kill = iota
		before
		during
	)
	cases := []struct {
		name    string
		otherNS bool // the holder has its own mount namespace (a copy of the mount)
		open    bool // the holder has a file open, else its working directory
		kill    kill
	}{
		{"cwd from another namespace", true, false, never},
		{"cwd from another namespace, killed during unmount", true, false, during},
		{"cwd from another namespace, killed before unmount", true, false, before},
		{"open file from another namespace", true, true, never},
		{"open file", false, true, never},
		{"open file, killed during unmount", false, true, during},
		{"cwd", false, false, never},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := s.Mount(mnt, ViewOptions{Host: true})
			if err != nil {
				t.Fatalf("mount (re-attach): %v", err)
			}
			if _, err := os.Stat(filepath.Join(mnt, "s1", "outputs", "held")); err != nil {
				t.Fatalf("re-attached view: %v", err)
			}
			// The shell enters the view after its exec (see doc.go).
			cmd := exec.Command("sh", "-c", `cd "$0" && exec sleep 1000`, filepath.Join(mnt, "s1", "outputs"))
			if c.open {
				f, err := os.Open(filepath.Join(mnt, "s1", "outputs", "held"))
				if err != nil {
					t.Fatal(err)
				}
				cmd.ExtraFiles = []*os.File{f}
				cmd.Args = []string{"sleep", "1000"}
				cmd.Path, _ = exec.LookPath("sleep")
				defer f.Close()
			}
			if c.otherNS {
				cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
			}
			if err := cmd.Start(); err != nil {
				t.Fatalf("start the holding process: %v", err)
			}
			if c.open {
				cmd.ExtraFiles[0].Close() // only the child holds it now
			}
			waited := make(chan struct{})
			go func() { cmd.Wait(); close(waited) }()
			defer func() {
				cmd.Process.Kill()
				select {
				case <-waited:
				case <-time.After(10 * time.Second):
					t.Errorf("the holding process did not end after SIGKILL")
				}
			}()
			if c.kill == before {
				cmd.Process.Kill()
				select {
				case <-waited:
				case <-time.After(10 * time.Second):
					t.Fatal("the holding process did not end in 10s after SIGKILL")
				}
			}
			if c.kill == during {
				time.AfterFunc(500*time.Millisecond, func() { cmd.Process.Kill() })
			}
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- v.Unmount() }()
			select {
			case err := <-done:
				t.Logf("Unmount returned in %v (%v)", time.Since(start).Round(time.Millisecond), err)
				if err != nil && c.kill != never {
					t.Errorf("Unmount = %v after the holder was killed", err)
				}
			case <-time.After(unmountBound + 5*time.Second):
				t.Fatalf("Unmount still blocked after %v (bound %v)", time.Since(start), unmountBound)
			}
		})
	}
	// The last re-attach works, and the view serves.
	v, err := s.Mount(mnt, ViewOptions{Host: true})
	if err != nil {
		t.Fatalf("mount after the holders: %v", err)
	}
	defer v.Unmount()
	if _, err := os.Stat(filepath.Join(mnt, "s1", "outputs", "held")); err != nil {
		t.Fatalf("view after the holders: %v", err)
	}
}
