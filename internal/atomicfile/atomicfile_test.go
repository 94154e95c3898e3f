package atomicfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestWriteFileReplaces(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, content := range []string{"first\n", "second, longer\n", ""} {
		if err := WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		fi, serr := os.Stat(p)
		if err != nil || serr != nil || string(b) != content || fi.Mode().Perm() != 0o644 {
			t.Fatalf("after WriteFile(%q): %q %v, mode %v %v; want the content and 0644 whatever the umask", content, b, err, fi.Mode(), serr)
		}
	}
	if n := names(t, dir); len(n) != 1 {
		t.Errorf("directory holds %q, want only state.json", n)
	}
}

// TestWriteFailureKeepsOld: a write that fails, in fill or at the
// rename, leaves the old content and no temporary file.
func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rec.json")
	if err := WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	err := Write(p, 0o600, func(f *os.File) error {
		f.WriteString("half of the ne")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("Write with a failing fill = %v, want it to wrap the fill's error", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("after a failed write the file holds %q, want the old content", b)
	}
	sub := filepath.Join(dir, "sub")
	os.MkdirAll(filepath.Join(sub, "x"), 0o700) // a non-empty directory: rename over it fails
	if err := WriteFile(sub, []byte("new"), 0o600); err == nil {
		t.Error("WriteFile over a non-empty directory succeeded")
	}
	if n := names(t, dir); strings.Join(n, " ") != "rec.json sub" {
		t.Errorf("directory holds %q after the failures, want rec.json sub", n)
	}
}

// TestConcurrentWritesNeverMix: writers racing on one path leave one of
// their contents whole.
func TestConcurrentWritesNeverMix(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if err := WriteFile(p, bytes.Repeat([]byte{'a' + byte(i)}, 64<<10), 0o600); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	b, _ := os.ReadFile(p)
	if len(b) != 64<<10 || bytes.Count(b, b[:1]) != len(b) {
		t.Errorf("file of %d bytes mixes writers' contents", len(b))
	}
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "checkpoint")
	for _, n := range []string{".checkpoint.tmp-123", ".checkpoint.tmp-9", ".other.tmp-1", "checkpoint"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	if err := RemoveTemps(p); err != nil {
		t.Fatal(err)
	}
	if n := names(t, dir); strings.Join(n, " ") != ".other.tmp-1 checkpoint" {
		t.Errorf("after RemoveTemps: %q, want .other.tmp-1 checkpoint", n)
	}
}
