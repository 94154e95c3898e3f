package remote

import (
	"errors"
	"io"
	"os"
	"syscall"

	"github.com/pkg/sftp"
)

// handlers answer one connection's SFTP requests inside one session's
// view. The view decides what may be read and written; root keeps every
// path inside the view.
type handlers struct {
	root     *os.Root
	uid, gid int // the session's owner: what the session's agent creates is its own
}

var (
	_ sftp.OpenFileWriter       = (*handlers)(nil)
	_ sftp.PosixRenameFileCmder = (*handlers)(nil)
	_ sftp.LstatFileLister      = (*handlers)(nil)
	_ sftp.ReadlinkFileLister   = (*handlers)(nil)
	_ sftp.RealPathFileLister   = (*handlers)(nil)
)

func (h *handlers) sftp() sftp.Handlers {
	return sftp.Handlers{FileGet: h, FilePut: h, FileCmd: h, FileList: h}
}

// errOut makes an error the SFTP server reports with the code a client
// maps back to the errno a local view gives: a read-only session is
// "permission denied" (sshfs: EACCES), since SFTP has no EROFS.
func errOut(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EROFS) {
		return syscall.EACCES
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

func (h *handlers) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	p, err := rel(r.Filepath)
	if err != nil {
		return nil, err
	}
	f, err := h.root.OpenFile(p, os.O_RDONLY, 0)
	if err != nil {
		return nil, errOut(err)
	}
	return f, nil
}

func (h *handlers) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	f, err := h.open(r)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (h *handlers) OpenFile(r *sftp.Request) (sftp.WriterAtReaderAt, error) {
	f, err := h.open(r)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// open opens for writing. O_APPEND is left out: every SFTP write carries
// its offset, and os.File refuses WriteAt on an append-only file.
func (h *handlers) open(r *sftp.Request) (*os.File, error) {
	p, err := rel(r.Filepath)
	if err != nil {
		return nil, err
	}
	pf := r.Pflags()
	flags := os.O_WRONLY
	if pf.Read {
		flags = os.O_RDWR
	}
	if pf.Trunc {
		flags |= os.O_TRUNC
	}
	perm := os.FileMode(0o644)
	if a := r.Attributes(); r.AttrFlags().Permissions && a != nil {
		perm = a.FileMode().Perm()
	}
	if pf.Creat {
		// Made here, so it gets the session's owner; the view would make
		// it the server's (root's).
		f, err := h.root.OpenFile(p, flags|os.O_CREATE|os.O_EXCL, perm)
		if err == nil {
			if err := h.own(f.Chown); err != nil {
				f.Close()
				return nil, errOut(err)
			}
			return f, nil
		}
		if pf.Excl || !errors.Is(err, os.ErrExist) {
			return nil, errOut(err)
		}
	}
	f, err := h.root.OpenFile(p, flags, 0)
	if err != nil {
		return nil, errOut(err)
	}
	return f, nil
}

func (h *handlers) own(chown func(uid, gid int) error) error {
	if h.uid == os.Getuid() && h.gid == os.Getgid() {
		return nil
	}
	return chown(h.uid, h.gid)
}

func (h *handlers) Filecmd(r *sftp.Request) error {
	p, err := rel(r.Filepath)
	if err != nil {
		return err
	}
	switch r.Method {
	case "Setstat":
		return errOut(h.setstat(p, r))
	case "Rename", "PosixRename":
		return h.PosixRename(r)
	case "Rmdir", "Remove":
		return errOut(h.remove(p, r.Method == "Rmdir"))
	case "Mkdir":
		return errOut(h.mkdir(p, r))
	case "Link":
		t, err := rel(r.Target)
		if err != nil {
			return err
		}
		return errOut(h.root.Link(p, t))
	case "Symlink":
		// Filepath is the link's target, kept as written: it is
		// resolved by whoever follows the link, os.Root here.
		t, err := rel(r.Target)
		if err != nil {
			return err
		}
		if err := h.root.Symlink(r.Filepath, t); err != nil {
			return errOut(err)
		}
		return errOut(h.own(func(u, g int) error { return h.root.Lchown(t, u, g) }))
	}
	return sftp.ErrSSHFxOpUnsupported
}

// PosixRename replaces the target, as rename(2) does; plain SFTP rename
// gets the same, which is what sshfs expects of a POSIX server.
func (h *handlers) PosixRename(r *sftp.Request) error {
	from, err := rel(r.Filepath)
	if err != nil {
		return err
	}
	to, err := rel(r.Target)
	if err != nil {
		return err
	}
	return errOut(h.root.Rename(from, to))
}

func (h *handlers) remove(p string, dir bool) error {
	fi, err := h.root.Lstat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() != dir {
		if dir {
			return syscall.ENOTDIR
		}
		return syscall.EISDIR
	}
	return h.root.Remove(p)
}

func (h *handlers) mkdir(p string, r *sftp.Request) error {
	perm := os.FileMode(0o755)
	if a := r.Attributes(); r.AttrFlags().Permissions && a != nil {
		perm = a.FileMode().Perm()
	}
	if err := h.root.Mkdir(p, perm); err != nil {
		return err
	}
	return h.own(func(u, g int) error { return h.root.Lchown(p, u, g) })
}

func (h *handlers) setstat(p string, r *sftp.Request) error {
	fl, a := r.AttrFlags(), r.Attributes()
	if a == nil {
		return syscall.EINVAL
	}
	if fl.Size {
		f, err := h.root.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		err = f.Truncate(int64(a.Size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	if fl.Permissions {
		if err := h.root.Chmod(p, a.FileMode().Perm()|a.FileMode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
			return err
		}
	}
	if fl.UidGid {
		if err := h.root.Lchown(p, int(a.UID), int(a.GID)); err != nil {
			return err
		}
	}
	if fl.Acmodtime {
		return h.root.Chtimes(p, a.AccessTime(), a.ModTime())
	}
	return nil
}

func (h *handlers) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	p, err := rel(r.Filepath)
	if err != nil {
		return nil, err
	}
	switch r.Method {
	case "List":
		return one(h.list(p))
	case "Stat":
		fi, err := h.root.Stat(p)
		return one(lister{fi}, err)
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

func (h *handlers) list(p string) (lister, error) {
	d, err := h.root.Open(p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	out := make(lister, 0, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue // removed while listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

func (h *handlers) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	p, err := rel(r.Filepath)
	if err != nil {
		return nil, err
	}
	fi, err := h.root.Lstat(p)
	return one(lister{fi}, err)
}

// one returns a listing, or only the error.
func one(l lister, err error) (sftp.ListerAt, error) {
	if err != nil {
		return nil, errOut(err)
	}
	return l, nil
}

func (h *handlers) Readlink(name string) (string, error) {
	p, err := rel(name)
	if err != nil {
		return "", err
	}
	t, err := h.root.Readlink(p)
	return t, errOut(err)
}

// RealPath does not resolve symlinks: a link's target means something
// only to whoever follows it.
func (h *handlers) RealPath(name string) (string, error) {
	p, err := rel(name)
	if err != nil {
		return "", err
	}
	if p == "." {
		return "/", nil
	}
	return "/" + p, nil
}

// lister is a directory listing or one stat result.
type lister []os.FileInfo

func (l lister) ListAt(out []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(out, l[off:])
	if off+int64(n) == int64(len(l)) {
		return n, io.EOF
	}
	return n, nil
}
