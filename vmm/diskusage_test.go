package vmm

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDiskUsage(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), make([]byte, 64<<10), 0o644)
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "b"), make([]byte, 32<<10), 0o644)
	sparse, _ := os.Create(filepath.Join(dir, "sparse"))
	sparse.Truncate(1 << 30) // a GiB that takes nothing
	sparse.Close()
	file := DiskUsage(filepath.Join(dir, "a"))
	if file < 64<<10 || file > 128<<10 {
		t.Errorf("DiskUsage(file) = %d, want about 64 KiB", file)
	}
	if all := DiskUsage(dir); all < 96<<10 || all > 1<<20 {
		t.Errorf("DiskUsage(dir) = %d, want about 96 KiB (the sparse GiB counts nothing)", all)
	}
	if n := DiskUsage(filepath.Join(dir, "missing")); n != 0 {
		t.Errorf("DiskUsage(missing) = %d, want 0", n)
	}
}
