package vmm

import (
	"io/fs"
	"path/filepath"
	"syscall"
)

// DiskUsage is the bytes a file, or every file under a directory, takes
// on disk (allocated blocks: a sparse file counts what is written), for
// sizes such as a Checkpoint's. What cannot be read counts nothing.
func DiskUsage(path string) int64 {
	var n int64
	filepath.WalkDir(path, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := e.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
