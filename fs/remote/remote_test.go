package remote

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"hearth/fs"
)

// eventually retries check until it passes or a bound passes: a change
// made through another mount shows up within sshfs's cache time.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestViewRulesOverSSHFS(t *testing.T) {
	tb := newTestbed(t, "alpha", "beta")
	if err := tb.write("beta", ".home/secret", "beta's"); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if err := tb.write("beta", "outputs/report.md", "beta's report"); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	a := tb.mount(t, "alpha")

	own := filepath.Join(a, "alpha", "outputs", "a.txt")
	if err := os.WriteFile(own, []byte("hello"), 0o644); err != nil {
		t.Fatalf("write own session: %v", err)
	}
	if got, err := tb.read("alpha", "outputs/a.txt"); err != nil || got != "hello" {
		t.Errorf("store has alpha/outputs/a.txt = %q, %v; want hello", got, err)
	}
	if err := os.Mkdir(filepath.Join(a, "alpha", "outputs", "d"), 0o755); err != nil {
		t.Errorf("mkdir in own session: %v", err)
	}
	for _, p := range []string{own, filepath.Join(a, "alpha", "outputs", "d")} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Uid != 2000 || st.Gid != 2000 {
			t.Errorf("owner of %s = %d:%d, %v; want the session's, 2000:2000", p, st.Uid, st.Gid, err)
		}
	}
	if err := os.Rename(own, filepath.Join(a, "alpha", "outputs", "d", "b.txt")); err != nil {
		t.Errorf("rename in own session: %v", err)
	}

	if got, err := os.ReadFile(filepath.Join(a, "beta", "outputs", "report.md")); err != nil || string(got) != "beta's report" {
		t.Errorf("read beta's report = %q, %v", got, err)
	}
	for _, op := range []struct {
		name string
		fn   func() error
	}{
		{"write", func() error {
			return os.WriteFile(filepath.Join(a, "beta", "outputs", "report.md"), []byte("x"), 0o644)
		}},
		{"create", func() error { return os.WriteFile(filepath.Join(a, "beta", "outputs", "new"), []byte("x"), 0o644) }},
		{"remove", func() error { return os.Remove(filepath.Join(a, "beta", "outputs", "report.md")) }},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(a, "beta", "inputs", "d"), 0o755) }},
		{"chmod", func() error { return os.Chmod(filepath.Join(a, "beta", "outputs", "report.md"), 0o777) }},
	} {
		if err := op.fn(); !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EPERM) {
			t.Errorf("%s in beta's session through alpha's view = %v, want EACCES/EROFS", op.name, err)
		}
	}
	if got, _ := tb.read("beta", "outputs/report.md"); got != "beta's report" {
		t.Errorf("beta's report changed to %q", got)
	}

	ents, err := os.ReadDir(filepath.Join(a, "beta"))
	if err != nil {
		t.Fatalf("ReadDir(beta): %v", err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if slices.Contains(names, ".home") {
		t.Errorf("beta's directory through alpha's view lists %v, want no .home", names)
	}
	if _, err := os.ReadFile(filepath.Join(a, "beta", ".home", "secret")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read beta's .home/secret = %v, want ENOENT", err)
	}
	if _, err := os.Stat(filepath.Join(a, "alpha", ".home")); err != nil {
		t.Errorf("own .home: %v", err)
	}
}

func TestWriteVisibleThroughOtherMount(t *testing.T) {
	tb := newTestbed(t, "alpha", "beta")
	a, b := tb.mount(t, "alpha"), tb.mount(t, "beta")
	p := filepath.Join("alpha", "outputs", "shared.txt")
	// Seen once before it changes, so a stale cache would show.
	if _, err := os.Stat(filepath.Join(b, p)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat before write = %v, want ENOENT", err)
	}
	for i, want := range []string{"first", "second, longer"} {
		if err := os.WriteFile(filepath.Join(a, p), []byte(want), 0o644); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		eventually(t, "read through beta's mount", func() error {
			got, err := os.ReadFile(filepath.Join(b, p))
			if err == nil && string(got) != want {
				err = errors.New("got " + string(got) + ", want " + want)
			}
			return err
		})
	}
}

func TestWrongKeyRefused(t *testing.T) {
	tb := newTestbed(t, "alpha")
	other := filepath.Join(t.TempDir(), "stranger")
	if _, err := GenerateKey(other); err != nil {
		t.Fatal(err)
	}
	n := tb.node("alpha")
	n.KeyFile = other
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "mnt")
	if m, err := MountView(ctx, n, dir); err == nil {
		m.Unmount()
		t.Fatalf("MountView with an unauthorized key succeeded")
	}
	if err := Follow(ctx, n, nil, func(fs.Event) {}); err == nil {
		t.Fatalf("Follow with an unauthorized key succeeded")
	}
	n = tb.node("nosuch")
	if m, err := MountView(ctx, n, dir); err == nil {
		m.Unmount()
		t.Fatalf("MountView of a session that does not exist succeeded")
	}
}

// TestServerRestartMountRecovers: the serving node restarts on the same
// address with the same host key; the node's mount carries on.
func TestServerRestartMountRecovers(t *testing.T) {
	tb := newTestbed(t, "alpha")
	a := tb.mount(t, "alpha")
	p := filepath.Join(a, "alpha", "outputs", "before")
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := tb.addr
	tb.srv.Close()
	if m := mountsUnder(t, tb.dir); len(m) > 0 {
		t.Errorf("views still mounted after Close: %v", m)
	}
	// Down: requests fail at once (sshfs tries to reconnect and is
	// refused), they do not hang.
	if _, err := os.ReadFile(filepath.Join(a, "alpha", "outputs", "before")); err == nil {
		t.Fatalf("read while the server is down succeeded")
	} else {
		t.Logf("read while the server is down: %v", err)
	}
	tb.start(t, addr)
	eventually(t, "write after restart", func() error {
		return os.WriteFile(filepath.Join(a, "alpha", "outputs", "after"), []byte("2"), 0o644)
	})
	if got, err := tb.read("alpha", "outputs/after"); err != nil || got != "2" {
		t.Errorf("store has outputs/after = %q, %v", got, err)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != "1" {
		t.Errorf("read what was written before the restart = %q, %v; want 1", got, err)
	}
}

func TestFollowEvents(t *testing.T) {
	tb := newTestbed(t, "alpha", "beta")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan fs.Event, 64)
	done := make(chan error, 1)
	// Once Follow says it is ready, the first write's event arrives.
	ready := make(chan struct{})
	go func() { done <- Follow(ctx, tb.node("alpha"), func() { close(ready) }, func(e fs.Event) { got <- e }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Follow ended before it was ready: %v", err)
	case <-ctx.Done():
		t.Fatal("Follow not ready within a minute")
	}
	if err := tb.write("beta", "outputs/x", "x"); err != nil {
		t.Fatal(err)
	}
	var first fs.Event
	select {
	case first = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s of a write made after Follow was ready")
	}
	if first.Session != "beta" || first.Path != "outputs/x" {
		t.Errorf("first event = %+v, want beta outputs/x", first)
	}
	if err := tb.write("beta", ".home/hidden", "x"); err != nil {
		t.Fatal(err)
	}
	if err := tb.write("alpha", "outputs/mark", "x"); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case e := <-got:
			if e.Session == "beta" && e.Path == ".home/hidden" {
				t.Fatalf("alpha's node saw an event in beta's .home: %+v", e)
			}
			if e.Session == "alpha" && e.Path == "outputs/mark" {
				cancel()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("Follow after cancel = %v, want context.Canceled", err)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("no event for alpha/outputs/mark")
		}
	}
}

// TestQuotaOverSSHFS: a write the store refuses (the session's quota)
// fails on the node, and the file never holds more than was accepted.
func TestQuotaOverSSHFS(t *testing.T) {
	tb := newTestbed(t, "alpha")
	if err := tb.store.SetQuota("alpha", fs.Quota{Bytes: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	a := tb.mount(t, "alpha")
	p := filepath.Join(a, "alpha", "outputs", "big")
	err := os.WriteFile(p, make([]byte, 1<<20), 0o644)
	if err == nil {
		t.Fatalf("writing 1 MiB into a 64 KiB quota through sshfs succeeded")
	}
	t.Logf("over quota through sshfs: %v", err)
	if got, err := tb.read("alpha", "outputs/big"); err == nil && len(got) > 64<<10 {
		t.Errorf("store holds %d bytes of big, over the quota", len(got))
	}
}

// TestIDShiftOverSSHFS: a node whose machine runs in its own range of
// host ids sees owners shifted into it, and what it makes is kept under
// the store's ids, as with a local machine's view.
func TestIDShiftOverSSHFS(t *testing.T) {
	tb := newTestbed(t, "alpha") // owned by 2000 in the store
	n := tb.node("alpha")
	n.IDs = fs.IDShift{From: 2000, To: 302000, Size: 1000}
	dir := filepath.Join(t.TempDir(), "shifted")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := MountView(ctx, n, dir)
	if err != nil {
		t.Fatalf("MountView: %v", err)
	}
	defer m.Unmount()
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "alpha"), &st); err != nil || st.Uid != 302000 {
		t.Errorf("owner of alpha through the shifted view = %d, %v; want 302000", st.Uid, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alpha", "outputs", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(dir, "alpha", "outputs", "f"), &st); err != nil || st.Uid != 302000 {
		t.Errorf("owner of a new file through the shifted view = %d, %v; want 302000", st.Uid, err)
	}
	plain := tb.mount(t, "alpha")
	if err := syscall.Stat(filepath.Join(plain, "alpha", "outputs", "f"), &st); err != nil || st.Uid != 2000 {
		t.Errorf("owner of the new file in the store = %d, %v; want 2000", st.Uid, err)
	}
}
