package fs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// mountBtrfs makes a loop-mounted btrfs in a temporary file, a filesystem
// with reflinks, and returns its mount point.
func mountBtrfs(t *testing.T) string {
	t.Helper()
	requireFUSE(t) // root
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		t.Skip("reflink test needs mkfs.btrfs (Debian package btrfs-progs; scripts/test.sh installs it)")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "btrfs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 512<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.btrfs: %v: %s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("reflink test needs a loop mount of a btrfs image, which failed here: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	return mnt
}

func usedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	syscall.Sync()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// TestReflinkCopyOnWrite checks that on a filesystem with reflinks, a file
// changed after a snapshot is cloned, not copied whole: changing one byte
// of a 64 MiB file costs far less than 64 MiB of space.
func TestReflinkCopyOnWrite(t *testing.T) {
	fsDir := mountBtrfs(t)
	s := openStore(t, filepath.Join(fsDir, "state"))
	t.Cleanup(func() { s.Close() })
	if !s.Reflink() {
		t.Fatal("Reflink() = false on btrfs, want true")
	}
	mustSession(t, s, "a")
	mnt := mountView(t, s, ViewOptions{Host: true})
	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20) // 64 MiB
	path := filepath.Join(mnt, "a", "outputs", "big")
	if err := os.WriteFile(path, big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot("a", "before"); err != nil {
		t.Fatal(err)
	}
	before := usedBytes(t, fsDir)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), 1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	grown := usedBytes(t, fsDir) - before
	if grown > 8<<20 {
		t.Errorf("space used after changing 1 byte of a 64 MiB shared file grew by %d bytes, want a clone (< 8 MiB)", grown)
	}
	snap, err := s.ReadFile("a", "before", "outputs/big", 0)
	if err != nil || !bytes.Equal(snap, big) {
		t.Errorf("snapshot content changed after the write (err %v)", err)
	}
	live, _ := os.ReadFile(path)
	if len(live) != len(big) || live[1000] != 'X' {
		t.Errorf("live file lacks the write")
	}
}
