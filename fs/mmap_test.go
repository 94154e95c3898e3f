package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

// TestMmap writes a file through a shared mapping and reads it back, on
// the passthrough path and on the FUSE path that byte-quota sessions use.
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
			const size = 3 * 4096
			if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			m, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
			if err != nil {
				t.Fatalf("Mmap = %v", err)
			}
			want := bytes.Repeat([]byte("hearth!\n"), size/8)
			copy(m, want)
			if _, _, e := syscall.Syscall(syscall.SYS_MSYNC, uintptr(unsafePointer(m)), size, syscall.MS_SYNC); e != 0 {
				t.Fatalf("msync = %v", e)
			}
			syscall.Munmap(m)
			f.Close()
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("ReadFile after mmap write: %d bytes, err %v; want the mapped content", len(got), err)
			}
			// A private read-only mapping sees the same bytes.
			f, _ = os.Open(path)
			defer f.Close()
			r, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_PRIVATE)
			if err != nil {
				t.Fatalf("Mmap read-only = %v", err)
			}
			defer syscall.Munmap(r)
			if !bytes.Equal(r, want) {
				t.Errorf("read-only mapping differs from what was written")
			}
		})
	}
}
