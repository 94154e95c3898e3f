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
	m  map[string]*served
}

type served struct {
	view *fs.View
	root *os.Root
	refs int
}

// acquire returns handlers inside session's view, mounting it if no
// connection holds it; release gives it back.
func (vs *views) acquire(session string) (*handlers, func(), error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	sv := vs.m[session]
	if sv == nil {
		var err error
		if sv, err = vs.mount(session); err != nil {
			return nil, nil, err
		}
		vs.m[session] = sv
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sv.view.Dir(), session), &st); err != nil {
		if sv.refs == 0 {
			vs.drop(session, sv)
		}
		return nil, nil, fmt.Errorf("serve session %s: %w", session, err)
	}
	sv.refs++
	h := &handlers{root: sv.root, uid: int(st.Uid), gid: int(st.Gid)}
	var once sync.Once
	return h, func() { once.Do(func() { vs.release(session, sv) }) }, nil
}

func (vs *views) mount(session string) (*served, error) {
	v, err := vs.store.Mount(filepath.Join(vs.dir, session), fs.ViewOptions{Session: session})
	if err != nil {
		return nil, fmt.Errorf("serve session %s: %w", session, err)
	}
	root, err := os.OpenRoot(v.Dir())
	if err != nil {
		v.Unmount()
		return nil, fmt.Errorf("serve session %s: %w", session, err)
	}
	return &served{view: v, root: root}, nil
}

func (vs *views) release(session string, sv *served) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if sv.refs--; sv.refs == 0 {
		vs.drop(session, sv)
	}
}

// drop unmounts; the caller holds vs.mu.
func (vs *views) drop(session string, sv *served) {
	delete(vs.m, session)
	sv.root.Close()
	sv.view.Unmount()
}

// closeAll unmounts every view still held (connections are gone).
func (vs *views) closeAll() {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	for s, sv := range vs.m {
		vs.drop(s, sv)
	}
}
