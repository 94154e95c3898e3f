package appliance

import (
	"context"
	"io"

	"hearth/vmm/guest"
)

// The files of a running sandbox, through its guest agent. The guest
// resolves each path inside the machine; checkPath only refuses what
// cannot be one.

// MaxUpload is the largest file an upload may write, in bytes.
func (m *sandboxManager) MaxUpload() int64 { return int64(m.cfg.MaxUpload) }

// Stat describes path in sandbox id.
func (m *sandboxManager) Stat(ctx context.Context, id, path string) (guest.FileInfo, error) {
	if err := checkPath(path); err != nil {
		return guest.FileInfo{}, err
	}
	var fi guest.FileInfo
	err := m.withGuest(ctx, id, func(gc *guest.Client) error {
		var err error
		fi, err = gc.Stat(ctx, path)
		return err
	})
	return fi, err
}

// ListDir lists directory path in sandbox id.
func (m *sandboxManager) ListDir(ctx context.Context, id, path string) ([]guest.FileInfo, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	var list []guest.FileInfo
	err := m.withGuest(ctx, id, func(gc *guest.Client) error {
		var err error
		list, err = gc.List(ctx, path)
		return err
	})
	return list, err
}

// Download copies regular file path of sandbox id to the writer open
// returns once the file is known (open is not called for a directory or
// a missing file, so the caller can still report those).
func (m *sandboxManager) Download(ctx context.Context, id, path string, open func(guest.FileInfo) io.Writer) error {
	if err := checkPath(path); err != nil {
		return err
	}
	return m.withGuest(ctx, id, func(gc *guest.Client) error {
		fi, err := gc.Stat(ctx, path)
		if err != nil {
			return err
		}
		if fi.IsDir {
			return invalidf("%s is a directory: download one file at a time", path)
		}
		_, err = gc.Download(ctx, path, open(fi))
		return err
	})
}

// Upload writes r to path in sandbox id with permission bits mode,
// returning how many bytes it wrote.
func (m *sandboxManager) Upload(ctx context.Context, id, path string, r io.Reader, mode uint32) (int64, error) {
	if err := checkPath(path); err != nil {
		return 0, err
	}
	var n int64
	err := m.withGuest(ctx, id, func(gc *guest.Client) error {
		var err error
		n, err = gc.Upload(ctx, path, r, mode)
		return err
	})
	return n, err
}
