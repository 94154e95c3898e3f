package vmm

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestMachineDirs(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "a"), 0o700)
	os.Mkdir(filepath.Join(dir, "b"), 0o700)
	os.WriteFile(filepath.Join(dir, "audit.jsonl"), nil, 0o600)
	if ids, err := MachineDirs(dir); err != nil || !slices.Equal(ids, []string{"a", "b"}) {
		t.Errorf("MachineDirs = %v, %v; want [a b]", ids, err)
	}
	if _, err := MachineDirs(filepath.Join(dir, "none")); err == nil {
		t.Errorf("MachineDirs of a missing directory: no error")
	}
}

func TestRemoveCheckpoint(t *testing.T) {
	dir := t.TempDir()
	file, sub := filepath.Join(dir, "one.ext4"), filepath.Join(dir, "two")
	os.WriteFile(file, []byte("x"), 0o600)
	os.MkdirAll(filepath.Join(sub, "memory"), 0o700)
	for name, p := range map[string]string{"one": file, "two": sub} {
		if err := RemoveCheckpoint("m", name, p); err != nil {
			t.Errorf("RemoveCheckpoint(%s) = %v", p, err)
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there", p)
		}
	}
	if err := RemoveCheckpoint("m", "two", sub); !errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveCheckpoint of a missing one = %v, want ErrNotFound", err)
	}
	if err := RemoveCheckpoint("m", "../x", filepath.Join(dir, "../x")); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveCheckpoint with a bad name = %v, want the name refused", err)
	}
}
