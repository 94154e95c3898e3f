package fs

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Archive formats.
const (
	FormatTarGz = "tar.gz"
	FormatZip   = "zip"
)

// Errors of archives.
var (
	// ErrBadArchive: the archive is damaged or holds what an upload refuses
	// (a path outside, a device, a link that leads out, a name twice).
	ErrBadArchive = errors.New("bad archive")
	// ErrArchiveTooLarge: the archive unpacks to more bytes or files than
	// its caller allows.
	ErrArchiveTooLarge = errors.New("archive too large")
)

// CheckFormat refuses a format other than tar.gz and zip.
func CheckFormat(format string) error {
	if format != FormatTarGz && format != FormatZip {
		return fmt.Errorf("%w: format %q: use tar.gz or zip", ErrBadArchive, format)
	}
	return nil
}

// What archives leave while they work: a download's snapshot, an
// upload's staging directory in inputs/. CleanArchiveLeftovers removes
// those a crash left.
const (
	archiveSnapPrefix = "hearth-archive-"
	uploadPrefix      = ".hearth-upload-"
)

// CleanArchiveLeftovers deletes the snapshots downloads took and the
// staging directories uploads made that a daemon which died left behind;
// it returns how many. Call it before serving.
func (s *Store) CleanArchiveLeftovers() (int, error) {
	n := 0
	for _, info := range s.Sessions() {
		snaps, err := s.Snapshots(info.ID)
		if err != nil {
			return n, err
		}
		for _, sn := range snaps {
			if strings.HasPrefix(sn.Name, archiveSnapPrefix) {
				if err := s.DeleteSnapshot(info.ID, sn.Name); err != nil {
					return n, err
				}
				n++
			}
		}
		s.mu.RLock()
		sess, err := s.sessionLocked(info.ID)
		var stale []string
		if err == nil {
			if _, d := sess.t.lookup(rootIno, InputsDir); d != nil && d.isDir() {
				for it := d.entries.Iterator(); !it.Done(); {
					name, _, _ := it.Next()
					if strings.HasPrefix(name, uploadPrefix) {
						stale = append(stale, InputsDir+"/"+name)
					}
				}
			}
		}
		s.mu.RUnlock()
		for _, p := range stale {
			if err := s.RemoveAll(info.ID, p); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// ArchiveOptions says what WriteArchive writes.
type ArchiveOptions struct {
	Format string // FormatTarGz or FormatZip
	// Home includes the session's private .home (left out by default: it
	// holds the agent CLI's own state and configuration, which other
	// sessions' views hide too).
	Home bool
}

// WriteArchive writes session id to w as an archive of its directories,
// regular files and symbolic links with their permission bits and
// modification times, paths relative to the session ("inputs/a.txt").
// It reads a snapshot taken for it, so the archive is the session at one
// moment even while agents write, and deletes the snapshot when done. It
// streams: memory does not grow with the session. Special files (FIFOs,
// sockets, devices) are left out; a file with several names is written
// once under each. In a zip a symbolic link is an entry whose mode says
// link and whose content is the target, as Info-ZIP's zip writes it (its
// unzip makes the link again). Owners are not kept: the store's ids mean
// nothing elsewhere.
//
// Nothing is written to w before the snapshot is taken, so an error that
// comes with nothing written is the whole answer.
func (s *Store) WriteArchive(w io.Writer, id string, opts ArchiveOptions) error {
	if err := CheckFormat(opts.Format); err != nil {
		return err
	}
	name := archiveSnapPrefix + randomHex()
	if err := s.Snapshot(id, name); err != nil {
		return fmt.Errorf("archive of %q: %w", id, err)
	}
	defer s.DeleteSnapshot(id, name)
	s.mu.RLock()
	sn, err := s.snapshotLocked(id, name)
	var t tree
	if err == nil {
		t = sn.trees[id].t // immutable: read after the lock is let go
	}
	s.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("archive of %q: %w", id, err)
	}
	var aw archiveWriter
	switch opts.Format {
	case FormatZip:
		aw = &zipOut{w: zip.NewWriter(w)}
	default:
		gz := gzip.NewWriter(w)
		aw = &tarOut{gz: gz, w: tar.NewWriter(gz)}
	}
	if err := s.archiveDir(aw, &t, rootIno, "", opts); err != nil {
		return fmt.Errorf("archive of %q: %w", id, err)
	}
	return aw.Close()
}

func randomHex() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// archiveWriter is one archive format's writer.
type archiveWriter interface {
	add(name string, n *node, content io.Reader) error
	Close() error
}

// archiveDir writes the entries of directory dir (reached by prefix),
// sorted, directories before what they hold.
func (s *Store) archiveDir(aw archiveWriter, t *tree, dir uint64, prefix string, opts ArchiveOptions) error {
	d := t.get(dir)
	for it := d.entries.Iterator(); !it.Done(); {
		name, ino, _ := it.Next()
		if prefix == "" && name == HomeDir && !opts.Home {
			continue
		}
		n := t.get(ino)
		if n == nil {
			continue
		}
		p := prefix + name
		switch n.mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			if err := aw.add(p+"/", n, nil); err != nil {
				return err
			}
			if err := s.archiveDir(aw, t, ino, p+"/", opts); err != nil {
				return err
			}
		case syscall.S_IFLNK:
			if err := aw.add(p, n, strings.NewReader(n.target)); err != nil {
				return err
			}
		case syscall.S_IFREG:
			if err := s.archiveFile(aw, p, n); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Store) archiveFile(aw archiveWriter, p string, n *node) error {
	if n.blob == 0 || n.size == 0 {
		return aw.add(p, n, strings.NewReader(""))
	}
	f, err := os.Open(s.blobPath(n.blob))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	// Exactly the snapshot's size: a blob a little longer (a truncate not
	// yet applied) must not make the entry lie about its length.
	return aw.add(p, n, &exactReader{r: f, left: n.size, name: p})
}

// exactReader reads exactly left bytes of r, failing if r ends sooner.
type exactReader struct {
	r    io.Reader
	left int64
	name string
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		err = fmt.Errorf("%s: data ends %d bytes short of its size", e.name, e.left)
	}
	return n, err
}

// fileMode is n's type and permission bits as Go says them.
func fileMode(n *node) os.FileMode {
	m := os.FileMode(n.mode & 0o777)
	if n.mode&syscall.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if n.mode&syscall.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if n.mode&syscall.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	switch n.mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		m |= os.ModeDir
	case syscall.S_IFLNK:
		m |= os.ModeSymlink
	}
	return m
}

type tarOut struct {
	gz *gzip.Writer
	w  *tar.Writer
}

func (o *tarOut) add(name string, n *node, content io.Reader) error {
	h := &tar.Header{Name: name, Mode: int64(n.mode & 0o7777), ModTime: time.Unix(0, n.mtime), Format: tar.FormatPAX}
	switch n.mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		h.Typeflag = tar.TypeDir
	case syscall.S_IFLNK:
		h.Typeflag, h.Linkname = tar.TypeSymlink, n.target
	default:
		h.Typeflag, h.Size = tar.TypeReg, n.size
	}
	if err := o.w.WriteHeader(h); err != nil {
		return err
	}
	if h.Typeflag == tar.TypeReg {
		if _, err := io.Copy(o.w, content); err != nil {
			return err
		}
	}
	return nil
}

func (o *tarOut) Close() error {
	if err := o.w.Close(); err != nil {
		return err
	}
	return o.gz.Close()
}

type zipOut struct{ w *zip.Writer }

func (o *zipOut) add(name string, n *node, content io.Reader) error {
	h := &zip.FileHeader{Name: name, Method: zip.Deflate, Modified: time.Unix(0, n.mtime)}
	h.SetMode(fileMode(n))
	if n.isDir() {
		h.Method = zip.Store
	}
	if n.mode&syscall.S_IFMT == syscall.S_IFLNK {
		h.Method = zip.Store
	}
	fw, err := o.w.CreateHeader(h)
	if err != nil {
		return err
	}
	if content != nil && !n.isDir() {
		_, err = io.Copy(fw, content)
	}
	return err
}

func (o *zipOut) Close() error { return o.w.Close() }

// UnpackOptions bounds what UnpackArchive writes.
type UnpackOptions struct {
	Format   string // FormatTarGz or FormatZip
	MaxBytes int64  // bytes of file content written, in all; 0: no cap but the session's quota
	MaxFiles int64  // entries (files, directories, links); 0: no cap but the session's quota
}

// Unpacked says what UnpackArchive made.
type Unpacked struct {
	Dir   string `json:"dir"` // relative to the session, e.g. "inputs/data"
	Files int64  `json:"files"`
	Bytes int64  `json:"bytes"`
}

// UnpackArchive unpacks the archive in r (size bytes) into session id's
// inputs/ (or inputs/<dir>), all or nothing: it unpacks into a hidden
// directory inputs/.hearth-upload-<random> and moves what it made into place in
// one step, or removes it. It refuses (ErrBadArchive) a path that is
// absolute or climbs out with "..", a name twice, an entry below a file
// or a link, a hard link, a device, FIFO or other special file, and a
// symbolic link that is absolute or leads out of the unpacked tree
// (links that stay inside are kept); and an existing name it would
// replace (ErrExists). Bytes and files are counted as they are written,
// never from what the archive declares, so a decompression bomb stops at
// opts.MaxBytes (ErrArchiveTooLarge); the session's quota applies too
// (ErrQuota). Permission bits (without setuid, setgid and sticky) and
// modification times are kept; owners are those of inputs/.
func (s *Store) UnpackArchive(id, dir string, r io.ReaderAt, size int64, opts UnpackOptions) (Unpacked, error) {
	if err := CheckFormat(opts.Format); err != nil {
		return Unpacked{}, err
	}
	target := InputsDir
	if strings.Trim(dir, "/") != "" {
		parts, err := splitPath(dir)
		if err != nil {
			return Unpacked{}, fmt.Errorf("unpack into inputs/%s: %w", dir, err)
		}
		target = path.Join(append([]string{InputsDir}, parts...)...)
	}
	owner, err := s.ownerOf(id, InputsDir)
	if err != nil {
		return Unpacked{}, fmt.Errorf("unpack: %w", err)
	}
	if target != InputsDir {
		if _, err := s.ownerOf(id, target); err == nil {
			return Unpacked{}, fmt.Errorf("unpack into %s: %w: name another directory, or remove it first", target, ErrExists)
		}
	}
	staging := InputsDir + "/" + uploadPrefix + randomHex()
	if err := s.MkdirAll(id, staging, owner); err != nil {
		return Unpacked{}, fmt.Errorf("unpack: %w", err)
	}
	u := &unpacker{s: s, id: id, root: staging, owner: owner, opts: opts, seen: map[string]byte{}}
	err = u.run(r, size)
	if err == nil {
		err = u.finish(target)
	}
	if err != nil {
		s.RemoveAll(id, staging)
		return Unpacked{}, err
	}
	return Unpacked{Dir: target, Files: u.files, Bytes: u.bytes}, nil
}

// ownerOf returns the owner of path p in session id, not following links.
func (s *Store) ownerOf(id, p string) (Owner, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return Owner{}, err
	}
	dir, name, err := s.resolve(sess, p, true)
	if err != nil {
		return Owner{}, err
	}
	_, n := sess.t.lookup(dir, name)
	if n == nil {
		return Owner{}, fmt.Errorf("%q: %w", p, ErrNotFound)
	}
	return Owner{UID: n.uid, GID: n.gid}, nil
}

// What the unpacker has made at a path.
const (
	madeDir  = 'd'
	madeFile = 'f'
	madeLink = 'l'
	// madeImplicit: a directory made as the parent of a later entry,
	// which the archive may still name itself.
	madeImplicit = 'i'
)

type unpacker struct {
	s     *Store
	id    string
	root  string // the staging directory, relative to the session
	owner Owner
	opts  UnpackOptions
	seen  map[string]byte // cleaned path -> what it is
	dirs  []dirAttrs      // set once their contents are written
	files int64
	bytes int64
}

type dirAttrs struct {
	path  string
	mode  os.FileMode
	mtime time.Time
}

// entry is one archive member, read but not yet checked.
type entry struct {
	name   string
	mode   os.FileMode // type and permission bits
	mtime  time.Time
	target string // links
	open   func() (io.Reader, error)
}

func badf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadArchive}, args...)...)
}

func (u *unpacker) run(r io.ReaderAt, size int64) error {
	if u.opts.Format == FormatZip {
		zr, err := zip.NewReader(r, size)
		if err != nil {
			return badf("not a readable zip (%v): make it again with zip, or send a tar.gz", err)
		}
		for _, f := range zr.File {
			e := entry{name: f.Name, mode: f.Mode(), mtime: f.Modified}
			f := f
			e.open = func() (io.Reader, error) { return f.Open() }
			if f.Mode()&os.ModeSymlink != 0 {
				if f.UncompressedSize64 > MaxPathLen {
					return badf("%q: a link target of %d bytes", f.Name, f.UncompressedSize64)
				}
				rc, err := f.Open()
				if err != nil {
					return badf("%q: %v", f.Name, err)
				}
				b, err := io.ReadAll(io.LimitReader(rc, MaxPathLen+1))
				rc.Close()
				if err != nil {
					return badf("%q: %v", f.Name, err)
				}
				e.target = string(b)
			}
			if err := u.add(e); err != nil {
				return err
			}
		}
		return nil
	}
	gz, err := gzip.NewReader(io.NewSectionReader(r, 0, size))
	if err != nil {
		return badf("not gzip-compressed (%v): send a .tar.gz, or a .zip with format zip", err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return badf("damaged tar.gz: %v", err)
		}
		e := entry{name: h.Name, mtime: h.ModTime, target: h.Linkname, open: func() (io.Reader, error) { return tr, nil }}
		perm := os.FileMode(h.Mode & 0o777)
		switch h.Typeflag {
		case tar.TypeReg: // the reader gives old-style TypeRegA as TypeReg
			e.mode = perm
		case tar.TypeDir:
			e.mode = os.ModeDir | perm
		case tar.TypeSymlink:
			e.mode = os.ModeSymlink | 0o777
		case tar.TypeLink:
			return badf("%q is a hard link (to %q): hard links are refused; archive the file itself", h.Name, h.Linkname)
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			return badf("%q is a device or FIFO: special files are refused", h.Name)
		default:
			return badf("%q has entry type %q, which an upload does not take (files, directories and links only)", h.Name, h.Typeflag)
		}
		if err := u.add(e); err != nil {
			return err
		}
	}
}

// clean checks an archive member's name and returns it as a path
// relative to the unpacked tree.
func clean(name string) (string, error) {
	switch {
	case name == "":
		return "", badf("an entry has no name")
	case strings.HasPrefix(name, "/"):
		return "", badf("%q is an absolute path: paths must be relative", name)
	case strings.ContainsAny(name, "\\\x00"):
		return "", badf("%q holds a backslash or NUL: use '/' between names", name)
	case len(name) > MaxPathLen:
		return "", badf("a name of %d bytes: the limit is %d", len(name), MaxPathLen)
	}
	var parts []string
	for _, c := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		switch {
		case c == "" || c == ".":
			continue
		case c == "..":
			return "", badf("%q climbs out with \"..\": paths must stay inside", name)
		case len(c) > MaxNameLen:
			return "", badf("%q: a name of %d bytes, the limit is %d", name, len(c), MaxNameLen)
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 {
		return "", nil // "./": the tree itself
	}
	return strings.Join(parts, "/"), nil
}

func (u *unpacker) add(e entry) error {
	p, err := clean(e.name)
	if err != nil {
		return err
	}
	if p == "" {
		if e.mode.IsDir() {
			return nil // the root itself
		}
		return badf("%q names no file", e.name)
	}
	if what, ok := u.seen[p]; ok && !(what == madeImplicit && e.mode.IsDir()) {
		return badf("%q is in the archive twice: each name once", p)
	}
	// Every parent is a directory this archive made (or will make now),
	// never a file or a link: nothing is written through a link.
	parts := strings.Split(p, "/")
	for i := 1; i < len(parts); i++ {
		parent := strings.Join(parts[:i], "/")
		switch u.seen[parent] {
		case 0:
			if err := u.count(); err != nil {
				return err
			}
			if err := u.s.MkdirAll(u.id, u.root+"/"+parent, u.owner); err != nil {
				return u.storeErr(p, err)
			}
			u.seen[parent] = madeImplicit
		case madeDir, madeImplicit:
		default:
			return badf("%q lies below %q, which is not a directory (a file or a link): nothing is written through a link", p, parent)
		}
	}
	full := u.root + "/" + p
	perm := e.mode.Perm()
	if u.seen[p] == 0 {
		if err := u.count(); err != nil {
			return err
		}
	}
	switch {
	case e.mode.IsDir():
		if err := u.s.MkdirAll(u.id, full, u.owner); err != nil {
			return u.storeErr(p, err)
		}
		u.seen[p] = madeDir
		u.dirs = append(u.dirs, dirAttrs{path: full, mode: perm, mtime: e.mtime})
	case e.mode&os.ModeSymlink != 0:
		if err := checkLink(p, e.target); err != nil {
			return err
		}
		if err := u.s.Symlink(u.id, full, e.target, u.owner); err != nil {
			return u.storeErr(p, err)
		}
		u.seen[p] = madeLink
		if err := u.s.Chtimes(u.id, full, e.mtime); err != nil {
			return u.storeErr(p, err)
		}
	case e.mode.IsRegular():
		rd, err := e.open()
		if err != nil {
			return badf("%q: %v", p, err)
		}
		if rc, ok := rd.(io.Closer); ok {
			defer rc.Close()
		}
		limit := int64(0)
		if u.opts.MaxBytes > 0 {
			limit = u.opts.MaxBytes - u.bytes
		}
		cr := &countReader{r: rd, left: limit, capped: u.opts.MaxBytes > 0}
		n, err := u.s.writeFile(u.id, full, cr, 0, u.owner, false) // synced once, in finish
		if cr.over {
			return fmt.Errorf("%w: it unpacks to more than %d bytes: split it, or raise workspace.upload_bytes", ErrArchiveTooLarge, u.opts.MaxBytes)
		}
		if cr.err != nil {
			return badf("%q: damaged data: %v", p, cr.err)
		}
		if err != nil {
			return u.storeErr(p, err)
		}
		u.bytes += n
		u.seen[p] = madeFile
		if err := u.s.Chmod(u.id, full, perm); err != nil {
			return u.storeErr(p, err)
		}
		if err := u.s.Chtimes(u.id, full, e.mtime); err != nil {
			return u.storeErr(p, err)
		}
	default:
		return badf("%q is a special file (mode %v): only files, directories and links are taken", p, e.mode)
	}
	return nil
}

// count counts one more entry against the cap.
func (u *unpacker) count() error {
	if u.opts.MaxFiles > 0 && u.files+1 > u.opts.MaxFiles {
		return fmt.Errorf("%w: more than %d files, directories and links: split it, or raise workspace.upload_files", ErrArchiveTooLarge, u.opts.MaxFiles)
	}
	u.files++
	return nil
}

func (u *unpacker) storeErr(p string, err error) error {
	return fmt.Errorf("unpack %s: %w", p, err)
}

// checkLink keeps a symbolic link at p only if its target is relative and
// stays inside the unpacked tree wherever it is moved.
func checkLink(p, target string) error {
	switch {
	case target == "" || len(target) > MaxPathLen || strings.ContainsRune(target, 0):
		return badf("link %q has an empty, over-long or NUL-holding target", p)
	case strings.HasPrefix(target, "/"):
		return badf("link %q points at the absolute path %q: only relative links that stay inside are kept", p, target)
	}
	if j := path.Join(path.Dir(p), target); j == ".." || strings.HasPrefix(j, "../") {
		return badf("link %q points at %q, outside the unpacked tree: only links that stay inside are kept", p, target)
	}
	return nil
}

// countReader reads r until left bytes would be passed (when capped),
// remembering r's own error apart from the store's.
type countReader struct {
	r      io.Reader
	left   int64
	capped bool
	over   bool
	err    error
}

func (c *countReader) Read(p []byte) (int, error) {
	if c.capped && int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	if c.capped {
		c.left -= int64(n)
		if c.left < 0 {
			c.over = true
			return 0, ErrArchiveTooLarge
		}
	}
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// finish sets the directories' modes and times, deepest first, makes
// the files' data durable with one syncfs(2) (rather than an fsync per
// file), moves the unpacked tree into place and syncs the journal.
func (u *unpacker) finish(target string) error {
	if err := u.s.syncBlobs(); err != nil {
		return err
	}
	if err := u.place(target); err != nil {
		return err
	}
	return u.s.Sync()
}

// syncBlobs flushes the filesystem that holds the blobs.
func (s *Store) syncBlobs() error {
	d, err := os.Open(filepath.Join(s.dir, "blobs"))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("sync the workspace's blobs: %w", err)
	}
	return nil
}

func (u *unpacker) place(target string) error {
	slices.SortFunc(u.dirs, func(a, b dirAttrs) int { return strings.Count(b.path, "/") - strings.Count(a.path, "/") })
	for _, d := range u.dirs {
		if err := u.s.Chmod(u.id, d.path, d.mode); err != nil {
			return u.storeErr(d.path, err)
		}
		if err := u.s.Chtimes(u.id, d.path, d.mtime); err != nil {
			return u.storeErr(d.path, err)
		}
	}
	if target != InputsDir {
		if parent := path.Dir(target); parent != InputsDir {
			if err := u.s.MkdirAll(u.id, parent, u.owner); err != nil {
				return err
			}
		}
		return u.s.Move(u.id, [][2]string{{u.root, target}})
	}
	var moves [][2]string
	for p := range u.seen {
		if !strings.Contains(p, "/") {
			moves = append(moves, [2]string{u.root + "/" + p, InputsDir + "/" + p})
		}
	}
	slices.SortFunc(moves, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	if err := u.s.Move(u.id, moves); err != nil {
		return err
	}
	return u.s.RemoveAll(u.id, u.root)
}

// Symlink makes a symbolic link at path p in session id pointing at
// target.
func (s *Store) Symlink(id, p, target string, owner Owner) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	dir, name, err := s.resolve(sess, p, true)
	if err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	_, _, e := s.mknod(nil, sess, dir, name, syscall.S_IFLNK|0o777, owner.UID, owner.GID, 0, target)
	return errOf("symlink "+p, e)
}

// Chtimes sets the modification time of path p in session id, not
// following a symbolic link anywhere in it.
func (s *Store) Chtimes(id, p string, mtime time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return fmt.Errorf("chtimes: %w", err)
	}
	dir, name, err := s.resolve(sess, p, true)
	if err != nil {
		return fmt.Errorf("chtimes: %w", err)
	}
	ino, n := sess.t.lookup(dir, name)
	if n == nil {
		return fmt.Errorf("chtimes %q: %w", p, ErrNotFound)
	}
	ns := mtime.UnixNano()
	if _, e := s.setattr(nil, sess, ino, attrChange{mtime: &ns}); e != 0 {
		return errOf("chtimes "+p, e)
	}
	return nil
}

// Move renames each moves[i][0] to moves[i][1] in session id, all in one
// commit or none; it replaces nothing (ErrExists) and follows no link.
func (s *Store) Move(id string, moves [][2]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.sessionLocked(id)
	if err != nil {
		return fmt.Errorf("move: %w", err)
	}
	end := s.batch()
	for _, m := range moves {
		dir, name, err := s.resolve(sess, m[0], true)
		if err == nil {
			var newdir uint64
			var newname string
			if newdir, newname, err = s.resolve(sess, m[1], true); err == nil {
				const noReplace = 1
				if e := s.rename(nil, sess, dir, name, newdir, newname, noReplace); e != 0 {
					err = errOf(fmt.Sprintf("move %s to %s", m[0], m[1]), e)
					if e == syscall.EEXIST {
						err = fmt.Errorf("%w: remove it first, or unpack into another directory", err)
					}
				}
			}
		}
		if err != nil {
			end(false)
			return err
		}
	}
	if e := end(true); e != 0 {
		return s.journalErr("move", e)
	}
	return nil
}
