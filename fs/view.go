package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// ViewOptions say whose view a mount is.
type ViewOptions struct {
	// Session is the one session this view may write. Every other session
	// is read-only and its private .home is hidden.
	Session string
	// Host makes a view that writes every session (the appliance's own).
	// Only root may use it, unless AllowOther.
	Host bool
	// AllowOther lets every local user into a host view (file modes
	// still apply). Machine views always allow others: the machine's
	// users are unprivileged ids on the host.
	AllowOther bool
	// IDs shifts owners between the store and the machine that mounts
	// the view, which runs in its own range of host ids.
	IDs IDShift
	// Debug logs every FUSE request.
	Debug bool

	// readers is how the view reads FUSE requests; tests set it to
	// compare the policies.
	readers readerPolicy
}

// readerPolicy says how a view reads its FUSE requests.
type readerPolicy int

const (
	// readersSpin, the default: quickRequest's requests are answered by
	// the reader that read them, which then polls for the next one for
	// up to quickSpin while requests come quickly (see quickRequest).
	readersSpin readerPolicy = iota
	// readersQuick: as readersSpin, but the reader sleeps in read(2)
	// at once.
	readersQuick
	// readersUpstream: go-fuse's own policy, GOMAXPROCS+1 readers
	// blocked in read(2), each request answered by the one that has
	// waited longest.
	readersUpstream
)

// quickSpin is how long a view's reader polls for the next request
// before it sleeps, while requests come within that time of each other:
// a serial client (a build, an unpack, git, npm) sends its next request
// a few microseconds after an answer, and a request taken while polling
// spares the kernel a thread wake-up, about a third of a round trip on
// the development machine (BenchmarkRoundTrip). The cost is up to this
// much CPU after each burst of requests.
const quickSpin = 50 * time.Microsecond

// IDShift maps a range of ids: the store's From..From+Size-1 are the
// view's To..To+Size-1. Each machine runs in a range of host ids of its
// own, while the store keeps one range for all of them, so a file the
// agent of one machine made is its agent's in the next machine too. Ids
// outside the range (root's) pass unchanged. The zero value maps nothing.
type IDShift struct{ From, To, Size uint32 }

// out is the id the view shows for the store's id.
func (m IDShift) out(id uint32) uint32 {
	if id >= m.From && id-m.From < m.Size {
		return id - m.From + m.To
	}
	return id
}

// in is the id the store keeps for the view's id.
func (m IDShift) in(id uint32) uint32 {
	if id >= m.To && id-m.To < m.Size {
		return id - m.To + m.From
	}
	return id
}

// cacheTTL is how long the kernel may trust attributes (and an entry in a
// directory not everyone may search, or an absent name) without asking
// again. Changes made through another view or the Go API are pushed to
// every view as invalidations, so this only bounds how late a change
// nobody announced (a passthrough write still in progress) is seen.
const cacheTTL = time.Second

// View is one mounted view of the workspace tree.
type View struct {
	fuse.RawFileSystem // ENOSYS for what is not implemented below

	s       *Store
	opts    ViewOptions
	dir     string
	srv     *fuse.Server
	mounted time.Time
	conn    uint64 // the FUSE connection's number in /sys/fs/fuse/connections; 0 unknown

	mu      sync.Mutex
	nodes   map[uint64]*kref // kernel node id -> what it names
	ids     map[nodeKey]uint64
	nextID  uint64
	handles map[uint64]*handle
	nextFh  uint64
	noPass  bool // the kernel refused passthrough once: stop asking

	protectedLinks bool // fs.protected_hardlinks, applied by mayLink

	lastLookup atomic.Int64 // unix ns of the last name resolved (LastLookup)

	appendMu sync.Mutex // orders O_APPEND writes that come through FUSE

	qmu     sync.Mutex
	queue   []notice
	qsignal chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  bool
}

// nodeKey names an inode of one incarnation of a session. A restore or a
// rename starts a new incarnation, so the kernel's old node ids go stale
// instead of silently naming other files.
type nodeKey struct {
	sess *session
	gen  uint64
	ino  uint64
}

type kref struct {
	key     nodeKey
	lookups uint64
	dir     uint64 // where the kernel last found it, for event paths
	name    string
	bk      backing
}

// backing is the kernel's view of one inode's data path. The kernel gives
// an inode at most one passthrough file at a time and does not mix
// passthrough with cached I/O, so opens are coordinated here.
type backing struct {
	id     int32    // registered passthrough id, 0 if none
	blob   uint64   // blob that id serves
	file   *os.File // the registered file
	pass   int      // open handles using it
	cached int      // open handles using FUSE reads and writes with the page cache
}

type handle struct {
	nodeid   uint64
	key      nodeKey
	f        *os.File // own descriptor when not passthrough; nil for an empty file
	blob     uint64
	write    bool
	appends  bool
	mode     int  // ioPass or ioCached
	fusePath bool // keep data on the FUSE path (byte-quota sessions)
	dir      uint64
	name     string
	// changed says the handle changed the file since its last written
	// event: set by every write on the FUSE path (concurrent writes of
	// one handle set it together, FUSE serves requests in parallel) and
	// by a settle that found the blob changed; announceLocked clears it.
	changed atomic.Bool

	// directories
	entries []fuse.DirEntry
}

const (
	ioCached = iota
	ioPass
)

type notice struct {
	sess  *session
	gen   uint64
	ino   uint64
	name  string
	inode bool // invalidate ino's attributes and data, not an entry
	root  bool // invalidate the session directory name in the mount root
}

// Mount serves a view of the tree at dir. A stale FUSE mount left there by
// a crashed process is detached first.
func (s *Store) Mount(dir string, opts ViewOptions) (*View, error) {
	if !opts.Host {
		if err := ValidateID("session", opts.Session); err != nil {
			return nil, fmt.Errorf("mount view: %w", err)
		}
	}
	if err := CleanStaleMount(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("mount view at %s: %w", dir, err)
	}
	v := &View{RawFileSystem: fuse.NewDefaultRawFileSystem(), s: s, opts: opts, dir: dir,
		nodes: map[uint64]*kref{}, ids: map[nodeKey]uint64{}, nextID: 2, handles: map[uint64]*handle{},
		nextFh: 1, qsignal: make(chan struct{}, 1), done: make(chan struct{}), mounted: time.Now(),
		protectedLinks: protectedHardlinks()}
	name := "hearth-workspace"
	mo := &fuse.MountOptions{
		DirectMount: true,
		AllowOther:  !opts.Host || opts.AllowOther,
		FsName:      name,
		Name:        "hearth",
		// No default_permissions: the view checks permissions (perm.go).
		MaxWrite:             1 << 20,
		DisableReadDirPlus:   true,
		EnableSymlinkCaching: true,
		Debug:                opts.Debug,
	}
	switch opts.readers {
	case readersSpin:
		mo.QuickRequest, mo.QuickSpin = quickRequest, quickSpin
	case readersQuick:
		mo.QuickRequest = quickRequest
	}
	// go-fuse opens /dev/fuse without O_CLOEXEC. A child that inherited it
	// would keep the connection alive after this process dies, so the
	// mount would hang instead of going stale. Hold off forks (ForkLock,
	// as os/exec takes it) until the descriptor is marked.
	syscall.ForkLock.Lock()
	srv, err := fuse.NewServer(v, dir, mo)
	closeOnExecFUSE()
	syscall.ForkLock.Unlock()
	if err != nil {
		return nil, fmt.Errorf("mount view at %s: %w", dir, err)
	}
	v.srv = srv
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		srv.Unmount()
		return nil, ErrClosed
	}
	s.views = append(s.views, v)
	s.mu.Unlock()
	v.wg.Add(2)
	go func() { defer v.wg.Done(); srv.Serve() }()
	go v.notifier()
	if err := srv.WaitMount(); err != nil {
		v.Unmount()
		return nil, fmt.Errorf("mount view at %s: %w", dir, err)
	}
	var st syscall.Stat_t
	if syscall.Stat(dir, &st) == nil {
		// The kernel names a connection by its superblock's dev_t, whose
		// encoding (MKDEV) differs from stat's.
		v.conn = uint64(unix.Major(uint64(st.Dev)))<<20 | uint64(unix.Minor(uint64(st.Dev)))
	}
	return v, nil
}

// quickRequest reports whether this package answers a FUSE request quickly:
// in memory, with at most an append to the journal, a file descriptor
// opened or closed, or a backing file registered. op is the request's
// opcode and in its body (linux/fuse.h). The goroutine that reads such a
// request answers it without starting another reader
// (fuse.MountOptions.QuickRequest, a patch of ours: third_party/go-fuse),
// so a process's serial requests stay on one warm thread. Those that may
// copy or sync file data (an open for writing, which may copy a shared
// blob, a truncate, reads and writes off the passthrough path, fsync,
// fallocate, lseek) start another reader first, so that a long copy does
// not hold up the machine's other requests
// (TestSlowRequestLeavesOthersAnswered).
func quickRequest(op uint32, in []byte) bool {
	switch op {
	case 1, 2, 3, 5, 6, 8, 9, 10, 11, 12, 13, // lookup, forget, getattr, readlink, symlink, mknod, mkdir, unlink, rmdir, rename, link
		17, 18, 21, 22, 23, 24, 25, // statfs, release, setxattr, getxattr, listxattr, removexattr, flush
		27, 28, 29, 34, 35, 36, 42, 44, 45: // opendir, readdir, releasedir, access, create, interrupt, batch_forget, readdirplus, rename2
		return true
	case 4: // setattr: quick unless it sets the size (fuse_setattr_in.valid, FATTR_SIZE)
		return len(in) >= 4 && binary.LittleEndian.Uint32(in)&(1<<3) == 0
	case 14: // open: quick for reading, or emptying (fuse_open_in.flags); a writer's open may copy
		if len(in) < 4 {
			return false
		}
		flags := binary.LittleEndian.Uint32(in)
		return flags&syscall.O_ACCMODE == syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	}
	return false
}

// Unmount waits this long for the view's FUSE connection to end before it
// aborts it, and at most unmountBound in all.
const (
	unmountAbort = 2 * time.Second
	unmountBound = 10 * time.Second
)

// Dir is where the view is mounted.
func (v *View) Dir() string { return v.dir }

// OpenFiles is how many files and directories are open through the view
// now. A daemon about to stop pauses a machine at a moment with none
// (package appliance): a file open across a restart belongs to the dead
// view, and its next read or write fails.
func (v *View) OpenFiles() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.handles)
}

// LastLookup is when the view last resolved a name (a FUSE lookup). A
// process caught between resolving a path and opening it holds node ids
// of this view without an open file: after a restart, with this view
// dead, its open fails. A daemon about to stop pauses a machine only once
// no lookup came for a while (package appliance). Zero if none came.
func (v *View) LastLookup() time.Time {
	if ns := v.lastLookup.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Unmount detaches the view and waits, boundedly, for its goroutines.
// Idempotent.
//
// A machine that goes on without the daemon (or a namespace that leaked)
// may still hold a copy of the mount, or a file or working directory in
// it; the connection then outlives the unmount, and go-fuse's request
// readers block in read(2) on /dev/fuse. After unmountAbort the connection
// is aborted through fusectl, which wakes them (its processes get
// ENOTCONN, as if the daemon had died). If even that fails, Unmount
// returns an error after unmountBound and leaves the readers behind
// rather than hang.
func (v *View) Unmount() error {
	v.closeMu.Lock()
	defer v.closeMu.Unlock()
	if v.closed {
		return nil
	}
	v.closed = true
	ended := make(chan struct{})
	go func() {
		v.detach()
		close(v.done)
		v.wg.Wait()
		close(ended)
	}()
	var err error
	select {
	case <-ended:
	case <-time.After(unmountAbort):
		aerr := v.abort()
		select {
		case <-ended:
		case <-time.After(unmountBound - unmountAbort):
			err = fmt.Errorf("unmount view at %s: its FUSE connection did not end (abort: %v); its request readers are left behind", v.dir, aerr)
		}
	}
	v.forget()
	return err
}

// forget drops the view from its store and closes the files its open
// handles and passthrough registrations hold.
func (v *View) forget() {
	v.s.mu.Lock()
	for i, o := range v.s.views {
		if o == v {
			v.s.views = append(v.s.views[:i], v.s.views[i+1:]...)
			break
		}
	}
	v.s.mu.Unlock()
	v.mu.Lock()
	for _, h := range v.handles {
		if h.f != nil {
			h.f.Close()
		}
	}
	for _, k := range v.nodes {
		if k.bk.file != nil {
			k.bk.file.Close()
		}
	}
	v.handles, v.nodes = map[uint64]*handle{}, map[uint64]*kref{}
	v.mu.Unlock()
}

// detach unmounts the view: plainly if it is not busy within a second
// (a file being closed holds it briefly), else lazily, so that no stale
// mount stays behind either way.
func (v *View) detach() {
	deadline := time.Now().Add(time.Second)
	for {
		err := syscall.Unmount(v.dir, 0)
		if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
			return // unmounted, or no longer a mount point
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			syscall.Unmount(v.dir, syscall.MNT_DETACH)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// abort ends the view's FUSE connection: every request reader wakes with
// ENODEV and every process using the view gets ENOTCONN.
func (v *View) abort() error {
	if v.conn == 0 {
		return errors.New("connection number unknown")
	}
	name := filepath.Join("/sys/fs/fuse/connections", strconv.FormatUint(v.conn, 10), "abort")
	err := os.WriteFile(name, []byte("1"), 0)
	if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// fusectl is not mounted (machines without systemd do not mount it):
	// mount it where only this goroutine's thread sees it.
	return inPrivateMountNS(func() error {
		if err := unix.Mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mount fusectl: %w", err)
		}
		return os.WriteFile(name, []byte("1"), 0)
	})
}

// inPrivateMountNS runs fn on a thread of its own in a private copy of
// the mount namespace; the thread ends with it, and the copy with the
// thread, so the process's mounts do not change.
func inPrivateMountNS(fn func() error) error {
	res := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == os.Getpid() {
			// The main thread must keep the process's namespace (and is
			// never ended). Holding it locked here puts the next
			// goroutine on another thread.
			res <- inPrivateMountNS(fn)
			runtime.UnlockOSThread()
			return
		}
		// Never unlocked: Go ends the thread when this goroutine returns.
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			res <- fmt.Errorf("unshare mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			res <- fmt.Errorf("make mounts private: %w", err)
			return
		}
		res <- fn()
	}()
	return <-res
}

// closeOnExecFUSE marks every open /dev/fuse descriptor close-on-exec.
func closeOnExecFUSE() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "/dev/fuse" {
			if fd, err := strconv.Atoi(e.Name()); err == nil {
				syscall.CloseOnExec(fd)
			}
		}
	}
}

// CleanStaleMount detaches dead FUSE mounts at dir (ones whose server
// died: the kernel answers ENOTCONN). It asks with statfs(2), which the
// kernel never answers from its cache, so a mount that died a moment ago
// is found too. A live mount is left alone.
func CleanStaleMount(dir string) error {
	for i := 0; i < 16; i++ { // mounts can be stacked; peel the dead ones
		var st syscall.Statfs_t
		err := syscall.Statfs(dir, &st)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		// ESTALE: a retired view's (Retire), whose keeper still answers.
		if !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) && !errors.Is(err, syscall.ESTALE) {
			return fmt.Errorf("mount point %s: %w", dir, err)
		}
		if uerr := syscall.Unmount(dir, syscall.MNT_DETACH); uerr != nil {
			return fmt.Errorf("clean stale mount %s: %w", dir, uerr)
		}
	}
	return fmt.Errorf("mount point %s: too many stale mounts stacked", dir)
}

func (v *View) String() string { return "hearth-workspace" }

func (v *View) Init(srv *fuse.Server) {}

// enqueue adds an invalidation for the notifier. Called with s.mu held; it
// never blocks on the kernel.
func (v *View) enqueue(n notice) {
	v.qmu.Lock()
	v.queue = append(v.queue, n)
	v.qmu.Unlock()
	select {
	case v.qsignal <- struct{}{}:
	default:
	}
}

// notifier sends queued invalidations to the kernel. It runs apart from
// request handlers because the kernel may hold locks that a handler's
// caller is waiting for.
func (v *View) notifier() {
	defer v.wg.Done()
	for {
		select {
		case <-v.done:
			return
		case <-v.qsignal:
		}
		v.qmu.Lock()
		q := v.queue
		v.queue = nil
		v.qmu.Unlock()
		for _, n := range q {
			v.deliver(n)
		}
	}
}

func (v *View) deliver(n notice) {
	if n.root {
		v.srv.EntryNotify(fuse.FUSE_ROOT_ID, n.name)
		return
	}
	v.mu.Lock()
	id, ok := v.ids[nodeKey{n.sess, n.gen, n.ino}]
	v.mu.Unlock()
	if !ok {
		return // the kernel has nothing cached for it
	}
	if n.inode {
		v.srv.InodeNotify(id, 0, 0)
	} else {
		v.srv.EntryNotify(id, n.name)
	}
}

// nodeID returns the kernel node id for k, found as name in dir, counting
// one lookup.
func (v *View) nodeID(k nodeKey, dir uint64, name string) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	id, ok := v.ids[k]
	if !ok {
		id = v.nextID
		v.nextID++
		v.ids[k] = id
		v.nodes[id] = &kref{key: k}
	}
	r := v.nodes[id]
	r.lookups++
	r.dir, r.name = dir, name
	return id
}

func (v *View) Forget(nodeid, nlookup uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := v.nodes[nodeid]
	if k == nil {
		return
	}
	k.lookups -= min(nlookup, k.lookups)
	if k.lookups == 0 && k.bk.pass == 0 && k.bk.cached == 0 {
		delete(v.nodes, nodeid)
		delete(v.ids, k.key)
	}
}

// key returns what a kernel node id names. Node 1 is the mount root.
func (v *View) key(nodeid uint64) (nodeKey, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := v.nodes[nodeid]
	if k == nil {
		return nodeKey{}, false
	}
	return k.key, true
}

// live returns the session of k if k still names its current incarnation.
// The caller holds s.mu.
func (v *View) live(k nodeKey) (*session, syscall.Errno) {
	if v.s.closed {
		return nil, syscall.EIO
	}
	sess := v.s.sessions[k.sess.name]
	if sess != k.sess || sess.gen != k.gen {
		return nil, syscall.ESTALE
	}
	return sess, 0
}

// writable reports whether this view may change sess.
func (v *View) writable(sess *session) bool {
	return v.opts.Host || sess.name == v.opts.Session
}

// hidden reports whether name in dir of sess is invisible in this view:
// another session's private home.
func (v *View) hidden(sess *session, dir uint64, name string) bool {
	return dir == rootIno && name == HomeDir && !v.writable(sess) && !v.opts.Host
}

func (v *View) fillAttr(out *fuse.Attr, id uint64, sess *session, ino uint64, n *node) {
	size, mtime := n.size, n.mtime
	if sess.writers[ino] > 0 && n.blob != 0 {
		// A passthrough writer changes the blob without telling us.
		var st syscall.Stat_t
		if syscall.Stat(v.s.blobPath(n.blob), &st) == nil {
			size, mtime = st.Size, st.Mtim.Nano()
		}
	}
	mode := n.mode
	if !v.writable(sess) {
		mode &^= 0o222
	}
	*out = fuse.Attr{Ino: id, Size: uint64(size), Blocks: uint64(size+511) / 512, Mode: mode,
		Nlink: n.nlink, Rdev: n.rdev, Blksize: 4096, Owner: fuse.Owner{Uid: v.opts.IDs.out(n.uid), Gid: v.opts.IDs.out(n.gid)}}
	out.SetTimes(ptrTime(n.atime), ptrTime(mtime), ptrTime(n.ctime))
}

func ptrTime(ns int64) *time.Time {
	t := time.Unix(0, ns)
	return &t
}

// entry fills out for ino, found as name in dir of sess (0: the session
// directory itself, in the mount's root), and counts a kernel lookup.
func (v *View) entry(out *fuse.EntryOut, sess *session, dir uint64, name string, ino uint64, n *node) {
	id := v.nodeID(nodeKey{sess, sess.gen, ino}, dir, name)
	out.NodeId = id
	v.fillAttr(&out.Attr, id, sess, ino, n)
	out.SetAttrTimeout(cacheTTL)
	out.SetEntryTimeout(v.entryTimeout(sess, dir))
}

// entryTimeout is how long the kernel may keep an entry of dir (see
// perm.go): long where everyone may search dir, else not at all.
func (v *View) entryTimeout(sess *session, dir uint64) time.Duration {
	if dir == 0 || searchable(sess.t.get(dir)) {
		return entryTTL
	}
	return 0
}

func (v *View) rootAttr(out *fuse.Attr) {
	*out = fuse.Attr{Ino: fuse.FUSE_ROOT_ID, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Blksize: 4096}
	out.SetTimes(&v.mounted, &v.mounted, &v.mounted)
}
