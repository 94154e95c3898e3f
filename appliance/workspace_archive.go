package appliance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"hearth/fs"
)

// Session archives: a session streamed out as a .tar.gz or .zip from a
// snapshot (fs.Store.WriteArchive), and an archive unpacked into a
// session's inputs/ (fs.Store.UnpackArchive), bounded by the config's
// workspace.upload_bytes and upload_files and by the session's quota.

// DownloadArchive writes session id to w as an archive of format (""
// means tar.gz); home includes the private .home.
func (d *Daemon) DownloadArchive(w io.Writer, id, format string, home bool) error {
	if format == "" {
		format = fs.FormatTarGz
	}
	if err := fs.CheckFormat(format); err != nil {
		return invalid(err)
	}
	if err := d.WorkspaceHere("download session " + id); err != nil {
		return err
	}
	return d.store.WriteArchive(w, id, fs.ArchiveOptions{Format: format, Home: home})
}

// UploadArchive unpacks the archive in body (of format, or told by its
// first bytes when format is "") into session id's inputs/ or
// inputs/<dir>. The body is staged under <state_dir>/uploads first (a zip
// is read from its end), at most workspace.upload_bytes of it, and
// removed after.
func (d *Daemon) UploadArchive(id, dir, format string, body io.Reader) (fs.Unpacked, error) {
	maxBytes, maxFiles := d.cfg.Workspace.uploadLimits()
	if err := fs.ValidateID("session", id); err != nil {
		return fs.Unpacked{}, err
	}
	if err := d.WorkspaceHere("upload into session " + id); err != nil {
		return fs.Unpacked{}, err
	}
	uploads := filepath.Join(d.cfg.StateDir, "uploads")
	if err := os.MkdirAll(uploads, 0o700); err != nil {
		return fs.Unpacked{}, err
	}
	f, err := os.CreateTemp(uploads, "archive-")
	if err != nil {
		return fs.Unpacked{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n, err := io.Copy(f, io.LimitReader(body, maxBytes+1))
	if err != nil {
		return fs.Unpacked{}, fmt.Errorf("receive the archive: %w", err)
	}
	if n > maxBytes {
		return fs.Unpacked{}, tooLargef("the archive is more than the %d bytes workspace.upload_bytes allows: split it, or raise that", maxBytes)
	}
	if format == "" {
		head := make([]byte, 4)
		f.ReadAt(head, 0)
		format = sniffFormat(head)
		if format == "" {
			return fs.Unpacked{}, invalidf("the body is neither a .tar.gz nor a .zip (by its first bytes): send one, or say which with format")
		}
	}
	if err := fs.CheckFormat(format); err != nil {
		return fs.Unpacked{}, invalid(err)
	}
	got, err := d.store.UnpackArchive(id, dir, f, n, fs.UnpackOptions{Format: format, MaxBytes: maxBytes, MaxFiles: maxFiles})
	switch {
	case errors.Is(err, fs.ErrBadArchive):
		return got, invalid(err)
	case errors.Is(err, fs.ErrArchiveTooLarge):
		return got, tooLargef("%v", err)
	}
	return got, err
}

// sniffFormat tells an archive's format by its first bytes, or "".
func sniffFormat(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return fs.FormatTarGz
	case bytes.HasPrefix(head, []byte("PK\x03\x04")), bytes.HasPrefix(head, []byte("PK\x05\x06")):
		return fs.FormatZip
	}
	return ""
}
