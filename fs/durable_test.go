package fs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// mountRaw mounts a view that the test unmounts itself (before Close);
// cleanup unmounts it too in case the test stops early.
func mountRaw(t testing.TB, s *Store, dir string, opts ViewOptions) *View {
	t.Helper()
	requireFUSE(t)
	v, err := s.Mount(dir, opts)
	if err != nil {
		t.Fatalf("Mount(%s, %+v) = %v", dir, opts, err)
	}
	t.Cleanup(func() { v.Unmount() })
	return v
}

func sessionIDs(s *Store) []string {
	var ids []string
	for _, si := range s.Sessions() {
		ids = append(ids, si.ID)
	}
	return ids
}

func snapshotNames(t testing.TB, s *Store, id string) []string {
	t.Helper()
	infos, err := s.Snapshots(id)
	if err != nil {
		t.Fatalf("Snapshots(%q) = %v", id, err)
	}
	var names []string
	for _, in := range infos {
		names = append(names, in.Name)
	}
	return names
}

func TestPersistAcrossRestart(t *testing.T) {
	requireFUSE(t)
	tmp := t.TempDir()
	state, mnt := filepath.Join(tmp, "state"), filepath.Join(tmp, "mnt")
	s := openStore(t, state)
	for _, id := range []string{"a", "b", "c", "d"} {
		mustSession(t, s, id)
	}
	if err := s.SetQuota("a", Quota{Bytes: 1 << 20, Inodes: 1000}); err != nil {
		t.Fatal(err)
	}
	v := mountRaw(t, s, mnt, ViewOptions{Host: true})
	a := filepath.Join(mnt, "a/outputs")
	steps := []func() error{
		func() error { return os.WriteFile(filepath.Join(a, "m1"), []byte("mount 1"), 0o644) },
		func() error { return os.Mkdir(filepath.Join(a, "dir"), 0o750) },
		func() error { return os.WriteFile(filepath.Join(a, "dir/m2"), []byte("mount 2"), 0o644) },
		func() error { return os.Symlink("dir/m2", filepath.Join(a, "ln")) },
		func() error { return os.Chmod(filepath.Join(a, "m1"), 0o600) },
		func() error { return os.Link(filepath.Join(a, "m1"), filepath.Join(a, "hard")) },
		func() error { return unix.Setxattr(filepath.Join(a, "m1"), "user.k", []byte("v"), 0) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d through the mount: %v", i, err)
		}
	}
	put(t, s, "b", "inputs/w1", "api 1")
	put(t, s, "c", "outputs/c1", "c's file")
	put(t, s, "d", "outputs/d1", strings.Repeat("d", 100000))
	mustSnapshot(t, s, "a", "s1")
	if err := os.WriteFile(filepath.Join(a, "m1"), []byte("mount 1 v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustSnapshot(t, s, "b", "bs")
	mustSnapshot(t, s, "", "whole")
	if err := s.RenameSession("b", "b2"); err != nil {
		t.Fatalf("RenameSession = %v", err)
	}
	if err := s.DeleteSession("c"); err != nil {
		t.Fatalf("DeleteSession = %v", err)
	}
	put(t, s, "b2", "inputs/w2", "api 2")
	if err := os.WriteFile(filepath.Join(mnt, "d/outputs/d2"), []byte("last"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Handles are released asynchronously after close.
	eventually(t, 2*time.Second, func() error {
		for _, si := range s.Sessions() {
			if si.ID == "d" && si.Bytes != 100004 {
				return fmt.Errorf("session d holds %d bytes, want 100004", si.Bytes)
			}
		}
		return nil
	})
	before := s.Sessions()
	if err := v.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := s.ReadFile("a", "", "outputs/m1", 0); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadFile after Close = %v, want ErrClosed", err)
	}

	check := func(t *testing.T, s *Store) {
		t.Helper()
		if got, want := sessionIDs(s), []string{"a", "b2", "d"}; !slices.Equal(got, want) {
			t.Errorf("Sessions() = %q, want %q", got, want)
		}
		after := s.Sessions()
		for i := range min(len(before), len(after)) {
			b, a := before[i], after[i]
			if a.ID != b.ID || a.Files != b.Files || a.Bytes != b.Bytes || a.Quota != b.Quota || !a.Created.Equal(b.Created) {
				t.Errorf("session after restart = %+v, want %+v", a, b)
			}
		}
		for _, f := range []struct{ sess, snap, p, want string }{
			{"a", "", "outputs/m1", "mount 1 v2"},
			{"a", "", "outputs/hard", "mount 1 v2"},
			{"a", "", "outputs/dir/m2", "mount 2"},
			{"a", "s1", "outputs/m1", "mount 1"},
			{"a", "s1", "outputs/dir/m2", "mount 2"},
			{"b2", "", "inputs/w1", "api 1"},
			{"b2", "", "inputs/w2", "api 2"},
			{"b2", "bs", "inputs/w1", "api 1"},
			{"d", "", "outputs/d1", strings.Repeat("d", 100000)},
			{"d", "", "outputs/d2", "last"},
		} {
			wantFile(t, s, f.sess, f.snap, f.p, f.want)
		}
		wantGone(t, s, "b2", "bs", "inputs/w2")
		if _, err := s.ReadFile("c", "", "outputs/c1", 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("ReadFile in deleted session c = %v, want ErrNotFound", err)
		}
		if got := snapshotNames(t, s, "a"); !slices.Equal(got, []string{"s1"}) {
			t.Errorf("Snapshots(a) = %q, want [s1]", got)
		}
		if got := snapshotNames(t, s, "b2"); !slices.Equal(got, []string{"bs"}) {
			t.Errorf("Snapshots(b2) = %q, want [bs]", got)
		}
		infos, err := s.Snapshots("")
		if err != nil || len(infos) != 1 || infos[0].Name != "whole" || !slices.Equal(infos[0].Sessions, []string{"a", "b", "c", "d"}) {
			t.Errorf("Snapshots(\"\") = %+v, %v, want whole of [a b c d]", infos, err)
		}
	}
	s2 := openStore(t, state)
	t.Run("first-restart", func(t *testing.T) { check(t, s2) })

	// Attributes come back too.
	v2 := mountRaw(t, s2, mnt, ViewOptions{Host: true})
	fi, err := os.Lstat(filepath.Join(a, "m1"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode of m1 after restart = %v, %v, want 0600", fi.Mode(), err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Nlink != 2 {
		t.Errorf("m1 after restart: Sys() = %+v, want 2 links", fi.Sys())
	}
	if fi, err := os.Stat(filepath.Join(a, "dir")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("mode of dir after restart = %v, %v, want 0750", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(a, "ln")); err != nil || target != "dir/m2" {
		t.Errorf("Readlink(ln) after restart = %q, %v, want dir/m2", target, err)
	}
	buf := make([]byte, 16)
	if n, err := unix.Getxattr(filepath.Join(a, "m1"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("Getxattr(m1, user.k) after restart = %q, %v, want v", buf[:n], err)
	}
	if got, err := os.ReadFile(filepath.Join(a, "ln")); err != nil || string(got) != "mount 2" {
		t.Errorf("ReadFile(ln) after restart = %q, %v, want %q", got, err, "mount 2")
	}
	// A restart after a restart, with new changes on top.
	if err := s2.Restore("b2", "bs"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "d/outputs/d3"), []byte("second run"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := v2.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	s3 := openStore(t, state)
	defer s3.Close()
	wantGone(t, s3, "b2", "", "inputs/w2")
	wantFile(t, s3, "b2", "", "inputs/w1", "api 1")
	wantFile(t, s3, "d", "", "outputs/d3", "second run")
	wantFile(t, s3, "a", "s1", "outputs/m1", "mount 1")
	// The whole-tree snapshot still brings back the deleted session c.
	if err := s3.Restore("", "whole"); err != nil {
		t.Fatalf("Restore(\"\", whole) after restarts = %v", err)
	}
	if got, want := sessionIDs(s3), []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("Sessions() after whole-tree Restore = %q, want %q", got, want)
	}
	wantFile(t, s3, "c", "", "outputs/c1", "c's file")
	wantFile(t, s3, "b", "", "inputs/w1", "api 1")
	wantFile(t, s3, "a", "", "outputs/m1", "mount 1 v2")
}

// Crash helper protocol: the child prints these lines on stdout.
const (
	crashEnvState = "HEARTH_CRASH_HELPER" // state directory; set only in the child
	crashEnvMount = "HEARTH_CRASH_MNT"
	crashEnvMode  = "HEARTH_CRASH_MODE" // "serve" or "writer"
	crashLifetime = 2 * time.Minute     // the child gives up if nobody kills it
)

func crashContent(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("file %d;", i)), 1+i%37)
}

func bigByte(off int64) byte { return byte(off % 251) }

// TestCrashHelper is the child process of the crash tests; it does nothing
// unless HEARTH_CRASH_HELPER is set.
func TestCrashHelper(t *testing.T) {
	state := os.Getenv(crashEnvState)
	if state == "" {
		return
	}
	if err := crashChild(state, os.Getenv(crashEnvMount), os.Getenv(crashEnvMode)); err != nil {
		fmt.Fprintln(os.Stderr, "crash helper:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

// crashChild is a child process of the crash tests. Mode "serve" owns the
// store and serves a host view at mnt until it is killed; mode "writer"
// writes through that mount (see crashWriter). They are separate processes,
// as the daemon and a machine are: a process SIGKILLed while one of its own
// threads waits on its own FUSE mount cannot exit (the request is never
// answered and the device is never closed), and a writer started by the
// server would inherit its /dev/fuse descriptor (see
// TestMountFDNotInherited) and keep the dead connection open.
func crashChild(state, mnt, mode string) error {
	if mode == "writer" {
		return crashWriter(mnt)
	}
	deadline := time.Now().Add(crashLifetime)
	s, err := Open(Options{Dir: state})
	if err != nil {
		return err
	}
	if err := s.CreateSession("s", Owner{}); err != nil {
		return err
	}
	if _, err := s.WriteFile("s", "inputs/base.txt", strings.NewReader("base content"), 0, Owner{}); err != nil {
		return err
	}
	if err := s.Snapshot("s", "pre"); err != nil {
		return err
	}
	if _, err := s.Mount(mnt, ViewOptions{Host: true}); err != nil {
		return err
	}
	fmt.Println("mounted")
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("not killed in time")
}

// crashWriter writes through the mount at mnt: it rewrites the file the
// snapshot holds, then writes files, fsyncing each and saying so on
// stdout, while it keeps writing a big file it never syncs.
func crashWriter(mnt string) error {
	deadline := time.Now().Add(crashLifetime)
	out := filepath.Join(mnt, "s/outputs")
	f, err := os.OpenFile(filepath.Join(mnt, "s/inputs/base.txt"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString("changed base"); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	f.Close()
	fmt.Println("base changed")
	go func() {
		f, err := os.Create(filepath.Join(out, "big"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "big:", err)
			return
		}
		chunk := make([]byte, 64<<10)
		var off int64
		for time.Now().Before(deadline) {
			for i := range chunk {
				chunk[i] = bigByte(off + int64(i))
			}
			n, err := f.Write(chunk)
			off += int64(n)
			if err != nil {
				fmt.Fprintln(os.Stderr, "big:", err)
				return
			}
			if off > 1<<30 { // enough: start over
				f.Truncate(0)
				f.Seek(0, io.SeekStart)
				off = 0
			}
		}
	}()
	for i := 0; time.Now().Before(deadline); i++ {
		f, err := os.Create(filepath.Join(out, fmt.Sprintf("f%05d", i)))
		if err != nil {
			return err
		}
		if _, err := f.Write(crashContent(i)); err != nil {
			return err
		}
		if i%2 == 1 { // odd files are only closed: a killed daemon keeps them too
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Printf("closed %d\n", i)
			continue
		}
		if err := f.Sync(); err != nil {
			return err
		}
		fmt.Printf("synced %d\n", i)
		if err := f.Close(); err != nil {
			return err
		}
	}
	return errors.New("not killed in time")
}

type crashChildProc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *bytes.Buffer

	mu     sync.Mutex
	waited chan struct{}
	exited bool
}

// startCrashChild runs TestCrashHelper in a child process.
func startCrashChild(t *testing.T, state, mnt, mode string) *crashChildProc {
	t.Helper()
	requireFUSE(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), crashEnvState+"="+state, crashEnvMount+"="+mnt, crashEnvMode+"="+mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // so the writer dies with it
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &crashChildProc{cmd: cmd, lines: make(chan string, 1024), stderr: &bytes.Buffer{}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !c.kill(10 * time.Second) {
			t.Errorf("crash helper %s (pid %d) did not exit after SIGKILL", mode, cmd.Process.Pid)
		}
		// Whatever happened, leave no mount behind for TempDir's cleanup.
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	return c
}

// kill SIGKILLs the helper and its writer and waits up to timeout for the
// helper to exit; it reports whether it did.
func (c *crashChildProc) kill(timeout time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return true
	}
	syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	if c.waited == nil {
		c.waited = make(chan struct{})
		go func() { c.cmd.Wait(); close(c.waited) }()
	}
	select {
	case <-c.waited:
		c.exited = true
		return true
	case <-time.After(timeout):
		return false
	}
}

// waitLine waits for a line for which fn is true; it fails if the child
// ends or takes too long.
func (c *crashChildProc) waitLine(t *testing.T, timeout time.Duration, fn func(string) bool) {
	t.Helper()
	tm := time.After(timeout)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.kill(10 * time.Second)
				t.Fatalf("crash helper ended early: %v\nstderr:\n%s", c.cmd.ProcessState, c.stderr)
			}
			if fn(l) {
				return
			}
		case <-tm:
			c.kill(10 * time.Second)
			t.Fatalf("crash helper: no expected line within %v\nstderr:\n%s", timeout, c.stderr)
		}
	}
}

// parseSynced reads the writer's "synced N" and "closed N" lines.
func parseSynced(l string) (int, bool) {
	rest, ok := strings.CutPrefix(l, "synced ")
	if !ok {
		rest, ok = strings.CutPrefix(l, "closed ")
	}
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil
}

// TestCrashSafety SIGKILLs the process that serves a mount while another
// writes through it, and checks that every file the writer had fsynced or
// closed survives (the daemon died, not the machine), and so does a
// snapshot taken before.
func TestCrashSafety(t *testing.T) {
	tmp := t.TempDir()
	state, mnt := filepath.Join(tmp, "state"), filepath.Join(tmp, "mnt")
	server := startCrashChild(t, state, mnt, "serve")
	server.waitLine(t, 60*time.Second, func(l string) bool { return l == "mounted" })
	writer := startCrashChild(t, state, mnt, "writer")
	const wantSynced = 200
	synced := map[int]bool{}
	writer.waitLine(t, 90*time.Second, func(l string) bool {
		if i, ok := parseSynced(l); ok {
			synced[i] = true
		}
		return len(synced) >= wantSynced
	})
	if !server.kill(10 * time.Second) {
		t.Fatal("the serving process did not exit after SIGKILL")
	}
	// The writer's requests now fail; stop it too.
	if !writer.kill(10 * time.Second) {
		t.Fatal("the writer did not exit after SIGKILL")
	}
	for l := range writer.lines { // lines printed before the kill count too
		if i, ok := parseSynced(l); ok {
			synced[i] = true
		}
	}
	if err := CleanStaleMount(mnt); err != nil {
		t.Fatalf("CleanStaleMount(%s) = %v", mnt, err)
	}
	if _, err := os.Stat(mnt); err != nil {
		t.Fatalf("Stat(%s) after CleanStaleMount = %v", mnt, err)
	}

	s := openStore(t, state)
	defer s.Close()
	if got := sessionIDs(s); !slices.Equal(got, []string{"s"}) {
		t.Fatalf("Sessions() after the crash = %q, want [s]", got)
	}
	for i := range synced {
		p := fmt.Sprintf("outputs/f%05d", i)
		got, err := s.ReadFile("s", "", p, 0)
		if err != nil || !bytes.Equal(got, crashContent(i)) {
			t.Errorf("synced file %s after the crash: ReadFile = %d bytes %.40q..., %v, want %d bytes", p, len(got), got, err, len(crashContent(i)))
		}
	}
	wantFile(t, s, "s", "", "inputs/base.txt", "changed base")
	wantFile(t, s, "s", "pre", "inputs/base.txt", "base content")
	if got := snapshotNames(t, s, "s"); !slices.Equal(got, []string{"pre"}) {
		t.Errorf("Snapshots(s) after the crash = %q, want [pre]", got)
	}
	// The unsynced big file may hold any prefix of what was written, but
	// nothing else.
	if big, err := s.ReadFile("s", "", "outputs/big", 0); err == nil {
		for off, b := range big {
			if b != bigByte(int64(off)) {
				t.Errorf("outputs/big after the crash: byte %d of %d is %d, want %d", off, len(big), b, bigByte(int64(off)))
				break
			}
		}
	} else if !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadFile(outputs/big) after the crash = %v", err)
	}
	// Sizes agree with contents, through a new mount at the same place.
	v := mountRaw(t, s, mnt, ViewOptions{Session: "s"})
	defer v.Unmount()
	for _, i := range []int{0, wantSynced / 2, wantSynced - 1} {
		p := filepath.Join(mnt, fmt.Sprintf("s/outputs/f%05d", i))
		fi, err := os.Stat(p)
		if err != nil || fi.Size() != int64(len(crashContent(i))) {
			t.Errorf("Stat(%s) after the crash = %v, %v, want size %d", p, fi, err, len(crashContent(i)))
		}
	}
	// The store keeps working.
	put(t, s, "s", "outputs/after", "after the crash")
	wantFile(t, s, "s", "", "outputs/after", "after the crash")
}

// mountsAt counts the mounts at dir.
func mountsAt(t testing.TB, dir string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

// TestStaleMountCleanedByMount: a mount whose server was SIGKILLed is
// detached by the next Mount at the same place, whether that comes at once
// or after the kernel's cached attributes of the mount root expired.
func TestStaleMountCleanedByMount(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{
		{"immediately", 0}, // the kernel still has the dead root's attributes cached
		{"after-attr-timeout", 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			state, mnt := filepath.Join(tmp, "state"), filepath.Join(tmp, "mnt")
			c := startCrashChild(t, state, mnt, "serve")
			c.waitLine(t, 60*time.Second, func(l string) bool { return l == "mounted" })
			if !c.kill(10 * time.Second) {
				t.Fatal("crash helper did not exit after SIGKILL")
			}
			if tc.delay > 0 {
				time.Sleep(tc.delay)
				if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) {
					t.Fatalf("Stat(%s) of a dead mount = %v, want ENOTCONN", mnt, err)
				}
			}
			s := openStore(t, state)
			defer s.Close()
			v, err := s.Mount(mnt, ViewOptions{Host: true})
			if err != nil {
				t.Fatalf("Mount over a stale mount = %v", err)
			}
			defer v.Unmount()
			if n := mountsAt(t, mnt); n != 1 {
				t.Errorf("%d mounts at %s after Mount, want 1 (the stale one detached)", n, mnt)
			}
			if got, err := os.ReadFile(filepath.Join(mnt, "s/inputs/base.txt")); err != nil || string(got) != "base content" {
				t.Errorf("ReadFile(base.txt) through the new mount = %q, %v, want %q", got, err, "base content")
			}
			// A live mount is left alone.
			if err := CleanStaleMount(mnt); err != nil {
				t.Errorf("CleanStaleMount of a live mount = %v", err)
			}
			if _, err := os.Stat(filepath.Join(mnt, "s")); err != nil {
				t.Errorf("the live mount after CleanStaleMount: %v", err)
			}
			if err := v.Unmount(); err != nil {
				t.Fatal(err)
			}
			// After the unmount the plain directory is back.
			ents, err := os.ReadDir(mnt)
			if err != nil || len(ents) != 0 {
				t.Errorf("ReadDir(%s) after Unmount = %v, %v, want an empty directory", mnt, ents, err)
			}
		})
	}
}

// TestMountFDNotInherited: a process started after a Mount (a machine's
// VMM, say) must not inherit the mount's /dev/fuse descriptor, or the
// connection outlives the server: a SIGKILLed daemon's mount then never
// reports ENOTCONN, and requests in flight hang.
func TestMountFDNotInherited(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	mountView(t, s, ViewOptions{Host: true})
	out, err := exec.Command("/bin/sh", "-c", `ls -l /proc/$$/fd`).Output()
	if err != nil {
		t.Skipf("cannot list a child's descriptors: %v", err)
	}
	if strings.Contains(string(out), "/dev/fuse") {
		t.Errorf("a child process holds the mount's /dev/fuse:\n%s", out)
	}
}
