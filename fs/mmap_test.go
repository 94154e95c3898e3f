package fs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

const mmapEnv = "HEARTH_MMAP_HELPER"

// TestMmap writes a file through a shared mapping and reads it back, on
// the passthrough path and on the FUSE path that byte-quota sessions use.
// The mapping is touched by a child process: on the FUSE path a page fault
// needs this process's FUSE server, and a Go process cannot serve a fault
// of its own (the faulting thread blocks a stop-the-world GC).
func TestMmap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quota Quota
	}{{"passthrough", Quota{}}, {"fuse path", Quota{Bytes: 1 << 30}}} {
		t.Run(tc.name, func(t *testing.T) {
			s := testStore(t)
			mustSession(t, s, "m")
			if err := s.SetQuota("m", tc.quota); err != nil {
				t.Fatal(err)
			}
			mnt := mountView(t, s, ViewOptions{Session: "m"})
			path := filepath.Join(mnt, "m", "outputs", "mapped")
			if err := os.WriteFile(path, make([]byte, mmapSize), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestMmapHelper$", "-test.count=1")
			cmd.Env = append(os.Environ(), mmapEnv+"="+path)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("mmap child: %v: %s", err, out)
			}
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, mmapContent()) {
				t.Fatalf("ReadFile after the child's mmap write: %d bytes, err %v; want the mapped content", len(got), err)
			}
		})
	}
}

const mmapSize = 3 * 4096

func mmapContent() []byte { return bytes.Repeat([]byte("hearth!\n"), mmapSize/8) }

// TestMmapHelper is the child of TestMmap; it does nothing in a normal run.
func TestMmapHelper(t *testing.T) {
	path := os.Getenv(mmapEnv)
	if path == "" {
		return
	}
	if err := mmapWrite(path); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// mmapWrite writes mmapContent through a shared mapping, syncs it, and
// checks a fresh private mapping sees it.
func mmapWrite(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, mmapSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap shared: %w", err)
	}
	copy(m, mmapContent())
	if _, _, e := syscall.Syscall(syscall.SYS_MSYNC, uintptr(unsafe.Pointer(&m[0])), mmapSize, syscall.MS_SYNC); e != 0 {
		return fmt.Errorf("msync: %w", e)
	}
	syscall.Munmap(m)
	r, err := syscall.Mmap(int(f.Fd()), 0, mmapSize, syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("mmap private: %w", err)
	}
	defer syscall.Munmap(r)
	if !bytes.Equal(r, mmapContent()) {
		return fmt.Errorf("a private mapping does not see what the shared one wrote")
	}
	return nil
}
