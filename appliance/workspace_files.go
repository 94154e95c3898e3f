package appliance

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"hearth/fs"
)

// Workspace files for people: a session's directories listed and its
// files read through the daemon's host view, confined to the session
// (os.Root), its private .home out of reach. The dashboard's workspace
// page previews with them, so a file's type is told from its bytes and
// only ever as plain text or a raster image: an agent's HTML or SVG never
// reaches a browser as something it would run.

// WorkspaceEntry is one entry of a session's directory.
type WorkspaceEntry struct {
	Name, Path string // Path relative to the session
	Type       string // file, dir, link or other
	Size       int64
	Modified   time.Time
}

// previewSniff is how many first bytes tell a file's type.
const previewSniff = 512

// workspacePath checks p, a path relative to a session, and cleans it:
// "" and "." are the session itself; .home is private.
func workspacePath(p string) (string, error) {
	p = strings.Trim(p, "/")
	if p == "" {
		return ".", nil
	}
	if !filepath.IsLocal(p) || strings.ContainsRune(p, '\\') {
		return "", invalidf("path %q: give a path inside the session, like outputs/report.md", p)
	}
	p = path.Clean(p)
	if first, _, _ := strings.Cut(p, "/"); first == ".home" {
		return "", invalidf("path %q: a session's .home is private to its agent", p)
	}
	return p, nil
}

// openWorkspace opens session id's directory in the host view.
func (d *Daemon) openSessionDir(id string) (*os.Root, error) {
	if err := fs.ValidateID("session", id); err != nil {
		return nil, err
	}
	if err := d.WorkspaceHere("files of session " + id); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(path.Join(d.cfg.Workspace.Mount, id))
	if err != nil {
		return nil, notFoundf("no session %s: list them with 'hearth ws ls'", id)
	}
	return root, nil
}

// ListWorkspaceDir lists directory dir of session id, by name, without
// the session's .home.
func (d *Daemon) ListWorkspaceDir(id, dir string) ([]WorkspaceEntry, error) {
	dir, err := workspacePath(dir)
	if err != nil {
		return nil, err
	}
	root, err := d.openSessionDir(id)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	f, err := root.Open(dir)
	if err != nil {
		return nil, workspaceErr(id, dir, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, invalidf("%s in session %s is not a directory", dir, id)
	}
	sort.Strings(names)
	out := make([]WorkspaceEntry, 0, len(names))
	for _, name := range names {
		p := path.Join(dir, name)
		fi, err := root.Lstat(p)
		if err != nil || p == ".home" {
			continue // gone meanwhile; private
		}
		out = append(out, WorkspaceEntry{Name: name, Path: p, Type: entryType(fi.Mode()), Size: fi.Size(), Modified: fi.ModTime().UTC()})
	}
	return out, nil
}

func entryType(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&os.ModeSymlink != 0:
		return "link"
	}
	return "other"
}

// WorkspaceFile is a file of a session opened for reading, and the only
// content type it may be served with.
type WorkspaceFile struct {
	io.ReadCloser
	Size        int64
	ContentType string
}

// OpenWorkspaceFile opens regular file p of session id, never through a
// symbolic link, and tells its type from its first bytes: text/plain
// (UTF-8, no NUL), image/png, jpeg, gif or webp, else
// application/octet-stream.
func (d *Daemon) OpenWorkspaceFile(id, p string) (*WorkspaceFile, error) {
	p, err := workspacePath(p)
	if err != nil {
		return nil, err
	}
	root, err := d.openSessionDir(id)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if fi, err := root.Lstat(p); err != nil {
		return nil, workspaceErr(id, p, err)
	} else if !fi.Mode().IsRegular() {
		return nil, invalidf("%s in session %s is a %s, not a regular file", p, id, entryType(fi.Mode()))
	}
	f, err := root.Open(p)
	if err != nil {
		return nil, workspaceErr(id, p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	head := make([]byte, previewSniff)
	n, _ := io.ReadFull(f, head)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return &WorkspaceFile{ReadCloser: f, Size: fi.Size(), ContentType: PreviewType(head[:n], n < previewSniff)}, nil
}

// PreviewType is the content type a file whose first bytes are head
// (all of it when whole) is served with: a raster image, plain text, or
// opaque bytes. Never HTML, SVG, XML or script, whatever the bytes say.
func PreviewType(head []byte, whole bool) string {
	switch ct := http.DetectContentType(head); ct {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return ct
	}
	text := head
	if !whole { // the sniffed bytes may end inside a rune: leave that rune out
		for i := 1; i < utf8.UTFMax && i <= len(head); i++ {
			if tail := head[len(head)-i:]; utf8.RuneStart(tail[0]) {
				if !utf8.FullRune(tail) {
					text = head[:len(head)-i]
				}
				break
			}
		}
	}
	if utf8.Valid(text) && bytes.IndexByte(head, 0) < 0 {
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}

func workspaceErr(id, p string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return notFoundf("no %s in session %s", p, id)
	}
	return invalidf("%s in session %s: %v", p, id, err)
}
