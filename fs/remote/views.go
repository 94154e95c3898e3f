package remote

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"hearth/fs"
)

// views mounts each served session's view once on the serving node, for
// as long as some connection uses it.
type views struct {
	store *fs.Store
	dir   string

	mu sync.Mutex
	m  map[viewUser]*served
}

type served struct {
	view *fs.View
	root *os.Root
	refs int
}

// acquire returns handlers inside session's view, mounting it if no
// connection holds it; release gives it back.
func (vs *views) acquire(u viewUser) (*handlers, func(), error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	sv := vs.m[u]
	if sv == nil {
		var err error
		if sv, err = vs.mount(u); err != nil {
			return nil, nil, err
		}
		vs.m[u] = sv
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sv.view.Dir(), u.session), &st); err != nil {
		if sv.refs == 0 {
			vs.drop(u, sv)
		}
		return nil, nil, fmt.Errorf("serve session %s: %w", u.session, err)
	}
	sv.refs++
	h := &handlers{root: sv.root, uid: int(st.Uid), gid: int(st.Gid)}
	var once sync.Once
	return h, func() { once.Do(func() { vs.release(u, sv) }) }, nil
}

func (vs *views) mount(u viewUser) (*served, error) {
	v, err := vs.store.Mount(filepath.Join(vs.dir, u.String()), fs.ViewOptions{Session: u.session, IDs: u.ids})
	if err != nil {
		return nil, fmt.Errorf("serve session %s: %w", u.session, err)
	}
	root, err := os.OpenRoot(v.Dir())
	if err != nil {
		v.Unmount()
		return nil, fmt.Errorf("serve session %s: %w", u.session, err)
	}
	return &served{view: v, root: root}, nil
}

func (vs *views) release(u viewUser, sv *served) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if sv.refs--; sv.refs == 0 {
		vs.drop(u, sv)
	}
}

// drop unmounts; the caller holds vs.mu.
func (vs *views) drop(u viewUser, sv *served) {
	delete(vs.m, u)
	sv.root.Close()
	sv.view.Unmount()
}

// closeAll unmounts every view still held (connections are gone).
func (vs *views) closeAll() {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	for u, sv := range vs.m {
		vs.drop(u, sv)
	}
}
