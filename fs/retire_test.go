package fs

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// retireChildEnv names the state and mount directories of
// TestRetireChild, the daemon of TestRetiredViewAnswersStale.
const retireChildEnv = "HEARTH_TEST_RETIRE_CHILD"

// TestRetireChild is a daemon that serves a view, run by
// TestRetiredViewAnswersStale as a process of its own: it mounts a host
// view with session s and s/outputs/f in it, says "ready", and on a line
// on stdin retires the view, starts its keeper, prints the keeper's pid
// and exits, as a stopping appliance does.
func TestRetireChild(t *testing.T) {
	dirs := os.Getenv(retireChildEnv)
	if dirs == "" {
		t.Skip("the daemon of TestRetiredViewAnswersStale; runs only as its child")
	}
	state, mnt, _ := strings.Cut(dirs, ":")
	s := openStore(t, state)
	mustSession(t, s, "s")
	v, err := s.Mount(mnt, ViewOptions{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "s/outputs/f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	conn, err := v.Retire()
	if err != nil {
		t.Fatal(err)
	}
	keeper, err := StartKeeper([]*os.File{conn})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	fmt.Println("keeper", keeper.Pid)
	s.Close()
}

// TestRetiredViewAnswersStale: a daemon (a process of its own) serves a
// view, and a process here holds a directory of it open and a file of it
// open, as a machine caught in a path walk holds names of it. The
// daemon retires the view and exits: the view's names now fail with
// ESTALE (which makes a kernel walk a path again), not ENOTCONN, and
// keep doing so while the keeper lives; the next view mounted at the
// same place serves a fresh walk. Once the keeper is stopped, the old
// names fail with ENOTCONN, as without a keeper, and the keeper is gone.
func TestRetiredViewAnswersStale(t *testing.T) {
	requireFUSE(t)
	state, mnt := filepath.Join(t.TempDir(), "state"), filepath.Join(t.TempDir(), "mnt")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestRetireChild$", "-test.v")
	cmd.Env = append(os.Environ(), retireChildEnv+"="+state+":"+mnt)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill(); syscall.Unmount(mnt, syscall.MNT_DETACH) })
	expect := func(prefix string) string {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the daemon ended before saying %q: %s", prefix, stderr.String())
				}
				if strings.HasPrefix(l, prefix) {
					return strings.TrimPrefix(l, prefix)
				}
			case <-timeout:
				t.Fatalf("the daemon did not say %q in 30s: %s", prefix, stderr.String())
			}
		}
	}
	expect("ready")
	dir, err := syscall.Open(filepath.Join(mnt, "s/outputs"), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(dir)
	file, err := os.Open(filepath.Join(mnt, "s/outputs/f"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()

	fmt.Fprintln(stdin, "retire")
	pid, err := strconv.Atoi(strings.TrimSpace(expect("keeper ")))
	if err != nil {
		t.Fatal(err)
	}
	keeper, _ := os.FindProcess(pid)
	t.Cleanup(func() { keeper.Kill() })
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("daemon: %v: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not exit in 30s")
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !bytes.Contains(cmdline, []byte(KeeperArg)) {
		t.Fatalf("keeper %d's command line %q lacks %s", pid, cmdline, KeeperArg)
	}

	// Its server gone, the old view answers through the keeper.
	for _, name := range []string{"f", "g"} {
		if _, err := syscall.Openat(dir, name, syscall.O_RDONLY, 0); !errors.Is(err, syscall.ESTALE) {
			t.Errorf("open %s in a directory of the retired view: %v, want ESTALE", name, err)
		}
	}
	// A file open through it reads through the kernel's passthrough, where
	// the kernel allows it, or fails ESTALE.
	if _, err := file.Read(make([]byte, 8)); err != nil && !errors.Is(err, syscall.ESTALE) {
		t.Errorf("read of a file open in the retired view: %v, want the data or ESTALE", err)
	}
	if err := syscall.Fsync(dir); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("fsync of a directory of the retired view: %v, want ESTALE", err)
	}

	// The next daemon's view, mounted at the same place, serves a fresh walk.
	s := openStore(t, state)
	defer s.Close()
	v, err := s.Mount(mnt, ViewOptions{Host: true})
	if err != nil {
		t.Fatalf("mount the next view where the retired one was: %v", err)
	}
	defer v.Unmount()
	if b, err := os.ReadFile(filepath.Join(mnt, "s/outputs/f")); err != nil || string(b) != "old" {
		t.Fatalf("read through the next view: %q, %v", b, err)
	}

	// Stopped, the keeper takes the connection with it.
	keeper.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the keeper did not end in 10s after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := syscall.Openat(dir, "f", syscall.O_RDONLY, 0); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("open in the retired view after its keeper ended: %v, want ENOTCONN", err)
	}
}

// TestKeeperEndsWithItsConnections: a keeper whose connections have all
// ended (nothing holds the old mount any more) exits by itself.
func TestKeeperEndsWithItsConnections(t *testing.T) {
	s := testStore(t)
	mustSession(t, s, "s")
	dir := filepath.Join(t.TempDir(), "mnt")
	requireFUSE(t)
	v, err := s.Mount(dir, ViewOptions{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := v.Retire()
	if err != nil {
		t.Fatal(err)
	}
	keeper, err := StartKeeper([]*os.File{conn})
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := keeper.Wait(); done <- err }()
	// Nothing holds the detached mount: its superblock goes, the
	// connection ends, and the keeper's reads fail with ENODEV.
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		keeper.Kill()
		t.Fatal("the keeper outlived its only connection by 20s")
	}
	if err := v.Unmount(); err != nil {
		t.Errorf("Unmount after Retire: %v", err)
	}
}

// FuzzStaleReply: whatever the keeper reads, its answer is a well-formed
// ESTALE for the request's unique id, or none.
func FuzzStaleReply(f *testing.F) {
	req := make([]byte, inHeaderLen)
	req[0] = inHeaderLen
	req[4] = 1 // LOOKUP
	req[8] = 7 // unique
	f.Add(req)
	f.Add(append(append([]byte{}, req[:4]...), 2, 0, 0, 0)) // FORGET, short
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, req []byte) {
		var out [outHeaderLen]byte
		if !staleReply(req, out[:]) {
			return
		}
		if len(req) < inHeaderLen || int(binary.LittleEndian.Uint32(req)) != len(req) {
			t.Fatalf("answered a malformed request %x", req)
		}
		if op := binary.LittleEndian.Uint32(req[4:]); op == opForget || op == opBatchForget || op == opInterrupt {
			t.Fatalf("answered opcode %d, which takes no answer", op)
		}
		if binary.LittleEndian.Uint32(out[:]) != outHeaderLen || int32(binary.LittleEndian.Uint32(out[4:])) != -int32(syscall.ESTALE) || !bytes.Equal(out[8:], req[8:16]) {
			t.Fatalf("answer %x to %x", out, req[:16])
		}
	})
}
