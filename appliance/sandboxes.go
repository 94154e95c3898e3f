package appliance

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"hearth/fs"
	"hearth/image"
	"hearth/internal/atomicfile"
	"hearth/internal/ids"
	"hearth/vmm"
)

// Sandbox statuses, as the API shows them.
const (
	statusRunning = "running"
	statusPaused  = "paused"
	statusStopped = "stopped"
)

// Why a sandbox is paused, as its record keeps it.
const (
	pausedByUser = "user"
	pausedIdle   = "idle"
	// pausedRestart: paused by a daemon that stopped, for the next one
	// to resume once it serves the workspace again.
	pausedRestart = "restart"
)

// networkNone is the only network policy so far: the machine has loopback
// and nothing else; what leaves it goes through the host channel.
const networkNone = "none"

// sandboxRecord is what a restarted daemon needs to know about a sandbox:
// <state_dir>/sandboxes/<id>.json, replaced atomically on every change.
type sandboxRecord struct {
	ID        string `json:"id"`
	Image     string `json:"image"`
	ImageHash string `json:"image_hash"`
	Rootfs    string `json:"rootfs"`
	Session   string `json:"session,omitempty"`
	// Owner is the create request's label saying whose it is (not a
	// permission).
	Owner string `json:"owner,omitempty"`

	CPUs   float64 `json:"cpus,omitempty"`
	Memory int64   `json:"memory,omitempty"`
	Pids   int64   `json:"pids,omitempty"`
	Disk   int64   `json:"disk,omitempty"`

	// Env is what the create request asked for; BaseEnv is the image's
	// environment, under it.
	Env         map[string]string `json:"env,omitempty"`
	BaseEnv     map[string]string `json:"base_env,omitempty"`
	IdleTimeout Duration          `json:"idle_timeout"`
	ExecTimeout Duration          `json:"exec_timeout"`

	// User runs commands that ask for no other; UID and GID are its ids
	// inside the machine.
	User    string    `json:"user"`
	UID     uint32    `json:"uid"`
	GID     uint32    `json:"gid"`
	Home    string    `json:"home,omitempty"` // the default directory of its commands
	Network string    `json:"network"`
	Created time.Time `json:"created"`
	// Paused is "", pausedByUser, pausedIdle or pausedRestart.
	Paused string `json:"paused,omitempty"`
	// ForkedFrom is the sandbox this one is a fork of (sandboxes_fork.go).
	ForkedFrom string `json:"forked_from,omitempty"`
	// Node is the cluster node whose record holds this sandbox, once
	// written there (sandboxes_cluster.go); "" on a single host.
	Node string `json:"node,omitempty"`
}

// sandbox is one sandbox the daemon knows. rec is fixed after creation
// except Paused, which mu guards with the rest of the mutable state.
type sandbox struct {
	rec  sandboxRecord
	m    vmm.Machine // nil when its machine was gone at a restart
	view *fs.View    // the session's view, nil without a session

	mu        sync.Mutex
	active    int       // execs, file calls and machine operations in flight
	last      time.Time // end of the last activity
	op        string    // the machine operation under way (opCheckpoint...), "" if none
	destroyed bool
	exitSeen  bool // the machine's unexpected end was logged
}

func (s *sandbox) stopped() bool {
	if s.m == nil {
		return true
	}
	select {
	case <-s.m.Done():
		return true
	default:
		return false
	}
}

// status reports the status shown to users; the caller holds s.mu.
func (s *sandbox) status() string {
	switch {
	case s.stopped():
		return statusStopped
	case s.rec.Paused != "":
		return statusPaused
	}
	return statusRunning
}

// sandboxManager owns the sandboxes: their machines (one vmm.Driver), the
// images they boot from, their workspace views, their records and the
// idle auto-pause loop.
type sandboxManager struct {
	cfg       SandboxConfig
	wcfg      WorkspaceConfig // sessions' default quota
	dir       string          // records
	viewsDir  string
	hostMount string // the daemon's host view, to fix an existing session's owner
	store     *fs.Store
	remote    string // the workspace node's address when it is not store (workspace.remote)
	log       *slog.Logger
	images    *imageService

	driver    vmm.Driver
	driverErr error // why sandboxes are unavailable when driver is nil

	// ports are the exposed ports, which end with their sandbox; nil
	// until the API opens.
	ports *previews

	// imagesMu keeps an image from being removed between a create
	// resolving it and the sandbox being registered.
	imagesMu sync.RWMutex

	mu       sync.Mutex
	boxes    map[string]*sandbox
	reserved map[string]bool // ids being created

	// cl is the cluster node recording the sandboxes, nil on a single
	// host; dirty asks it to write them; syncMu keeps a create's row and
	// registration together against a sync (sandboxes_cluster.go).
	cl     atomic.Pointer[clusterNode]
	dirty  chan struct{}
	syncMu sync.Mutex

	// slots are files made ahead of time for new records
	// (sandboxes_slots.go); nil if none could be.
	slots *slotPool

	tick      time.Duration
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// SandboxDeps is what a sandboxManager is made of.
type SandboxDeps struct {
	Config Config
	Store  *fs.Store // the workspace, whose sessions sandboxes see
	Images *imageService
	// Driver makes the machines; agent executions share it (their machine
	// ids start with "exec-", which sandbox ids may not). Nil when there
	// can be none, and DriverErr says why.
	Driver    vmm.Driver
	DriverErr error
	Log       *slog.Logger
	// RemoteWorkspace is the workspace node's address when another node
	// holds the workspace (workspace.remote): sandboxes with a session
	// are refused here, naming it.
	RemoteWorkspace string
}

// newSandboxManager re-attaches to the sandboxes a previous daemon left
// and starts the idle loop.
func newSandboxManager(deps SandboxDeps) (*sandboxManager, error) {
	cfg, store, images, driver, driverErr, logger := deps.Config, deps.Store, deps.Images, deps.Driver, deps.DriverErr, deps.Log
	m := &sandboxManager{
		cfg: cfg.Sandbox.withDefaults(), wcfg: cfg.Workspace, dir: filepath.Join(cfg.StateDir, "sandboxes"),
		viewsDir: filepath.Join(cfg.StateDir, "views"), hostMount: cfg.Workspace.Mount,
		store: store, log: logger, images: images, driver: driver, driverErr: driverErr, remote: deps.RemoteWorkspace,
		boxes: map[string]*sandbox{}, reserved: map[string]bool{},
		tick: 250 * time.Millisecond, stop: make(chan struct{}), dirty: make(chan struct{}, 1),
	}
	for _, d := range []string{m.dir, m.viewsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	os.RemoveAll(m.forksDir()) // captures a crashed fork left
	if err := m.recoverSlots(); err != nil {
		return nil, fmt.Errorf("sandbox records: %w", err)
	}
	if m.driverErr != nil {
		m.log.Warn("sandboxes are unavailable", "err", m.driverErr)
	} else {
		m.recoverAll()
		m.log.Info("sandboxes ready", "driver", m.driver.Name(), "known", len(m.boxes))
	}
	m.endKeepersLater()
	m.wg.Add(2)
	go m.idleLoop()
	go m.fillSlots()
	return m, nil
}

// guestAgentPath finds the agent binary the config names or, by default,
// hearth-guest beside the running executable.
func guestAgentPath(cfg Config) (string, error) {
	agent := cfg.Sandbox.Agent
	if agent == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find the guest agent: %w", err)
		}
		agent = filepath.Join(filepath.Dir(exe), "hearth-guest")
	}
	if _, err := os.Stat(agent); err != nil {
		return agent, fmt.Errorf("the guest agent %s is missing: build it with `CGO_ENABLED=0 go build -trimpath -ldflags=\"-s -w\" -o %s ./cmd/hearth-guest` "+
			"or name it with agent = \"...\" under [sandbox] in the config", agent, agent)
	}
	return agent, nil
}

func (m *sandboxManager) available() error {
	if m.driver == nil {
		return unavailablef("sandboxes are unavailable: %v", m.driverErr)
	}
	return nil
}

// createSpec is a validated create request; zero values take the config's
// defaults.
type createSpec struct {
	ID, Image, Session       string
	Owner                    string // a label, see sandboxRecord.Owner
	CPUs                     float64
	Memory, Pids, Disk       int64
	WorkspaceBytes           int64 // the session's quota; 0: the config's
	WorkspaceFiles           int64
	Env                      map[string]string
	IdleTimeout, ExecTimeout *time.Duration
	// Layer and ForkedFrom make a fork (sandboxes_fork.go): the captured
	// writable layer it starts with, and its source.
	Layer, ForkedFrom string
	TakeLayer         bool   // see vmm.Spec.TakeLayer
	ImageHash         string // the image's version; "" the newest
}

var (
	envKeyRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func validSandboxID(id string) error {
	if !ids.Valid(id) {
		return invalidf("sandbox id %q: use %s", id, ids.Rule)
	}
	return nil
}

// validNewSandboxID also keeps the prefix of agent executions' machines
// free.
func validNewSandboxID(id string) error {
	if strings.HasPrefix(id, executionPrefix) {
		return invalidf("sandbox id %q: ids starting with %q are the machines of agent executions: pick another", id, executionPrefix)
	}
	return validSandboxID(id)
}

// maxOwner is the longest owner label, in bytes.
const maxOwner = 128

// validOwner checks an owner label: printable, short, no surrounding
// spaces (it is shown in lists and compared exactly).
func validOwner(owner string) error {
	if len(owner) > maxOwner {
		return invalidf("owner label of %d bytes: give at most %d", len(owner), maxOwner)
	}
	if strings.TrimSpace(owner) != owner || !utf8.ValidString(owner) || strings.IndexFunc(owner, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return invalidf("owner label %q: use printable characters, with no space at either end", owner)
	}
	return nil
}

func newSandboxID() string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	rand.Read(b)
	for i := range b {
		b[i] = chars[int(b[i])%len(chars)]
	}
	return "sbx-" + string(b)
}

// withDefaults fills what the request left out from the config.
func (m *sandboxManager) withDefaults(spec createSpec) (createSpec, error) {
	if spec.ID == "" {
		spec.ID = newSandboxID()
	}
	if err := validNewSandboxID(spec.ID); err != nil {
		return spec, err
	}
	if spec.Image == "" {
		spec.Image = m.cfg.DefaultImage
	}
	if spec.Session != "" {
		if err := fs.ValidateID("session", spec.Session); err != nil {
			return spec, invalid(err)
		}
	}
	if err := validOwner(spec.Owner); err != nil {
		return spec, err
	}
	if spec.CPUs < 0 || spec.Memory < 0 || spec.Pids < 0 || spec.Disk < 0 || spec.WorkspaceBytes < 0 || spec.WorkspaceFiles < 0 {
		return spec, invalidf("sandbox %s: cpus, memory, pids, disk, workspace_bytes and workspace_files must not be negative", spec.ID)
	}
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&spec.Memory, int64(m.cfg.Memory))
	def(&spec.Pids, m.cfg.Pids)
	def(&spec.Disk, int64(m.cfg.Disk))
	if spec.CPUs == 0 {
		spec.CPUs = m.cfg.CPUs
	}
	for k := range spec.Env {
		if !envKeyRe.MatchString(k) {
			return spec, invalidf("sandbox %s: environment variable name %q: use letters, digits and '_'", spec.ID, k)
		}
	}
	for _, t := range []**time.Duration{&spec.IdleTimeout, &spec.ExecTimeout} {
		if *t != nil && **t < 0 {
			return spec, invalidf("sandbox %s: timeouts must not be negative", spec.ID)
		}
	}
	if spec.IdleTimeout == nil {
		d := time.Duration(m.cfg.IdleTimeout)
		spec.IdleTimeout = &d
	}
	if spec.ExecTimeout == nil {
		d := time.Duration(m.cfg.ExecTimeout)
		spec.ExecTimeout = &d
	}
	return spec, nil
}

// create boots a sandbox and returns once its agent answers. The image
// must be built; the session is made if missing.
func (m *sandboxManager) create(ctx context.Context, spec createSpec) (*sandbox, error) {
	if err := m.available(); err != nil {
		return nil, err
	}
	spec, err := m.withDefaults(spec)
	if err != nil {
		return nil, err
	}
	if err := m.reserve(spec.ID); err != nil {
		return nil, err
	}
	defer m.unreserve(spec.ID)
	if err := m.checkClusterID(ctx, spec.ID); err != nil {
		return nil, err
	}
	m.imagesMu.RLock()
	defer m.imagesMu.RUnlock()
	img, err := m.images.resolveVersion(spec.Image, spec.ImageHash)
	if err != nil {
		return nil, err
	}
	acct, err := imageUser(img)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	start := time.Now()
	s, err := m.boot(ctx, spec, img, acct)
	if err != nil {
		return nil, err
	}
	if err := m.recordCreated(ctx, s); err != nil {
		m.undoBoot(s)
		return nil, err
	}
	m.log.Info("sandbox created", "id", s.rec.ID, "image", img.Name, "hash", shortHash(img.Hash),
		"user", acct.name, "session", spec.Session, "took", time.Since(start).Round(time.Millisecond))
	return s, nil
}

func (m *sandboxManager) reserve(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.boxes[id] != nil || m.reserved[id] {
		return conflictf("sandbox %s already exists: pick another id or destroy it first", id)
	}
	m.reserved[id] = true
	return nil
}

func (m *sandboxManager) unreserve(id string) {
	m.mu.Lock()
	delete(m.reserved, id)
	m.mu.Unlock()
}

// boot attaches the session, starts the machine and writes the record,
// undoing what it did when a step fails.
func (m *sandboxManager) boot(ctx context.Context, spec createSpec, img image.Image, acct account) (s *sandbox, err error) {
	s = &sandbox{last: time.Now(), rec: sandboxRecord{
		ID: spec.ID, Image: img.Name, ImageHash: img.Hash, Rootfs: img.Rootfs(), Session: spec.Session, Owner: spec.Owner,
		CPUs: spec.CPUs, Memory: spec.Memory, Pids: spec.Pids, Disk: spec.Disk,
		Env: spec.Env, BaseEnv: baseEnv(img), Home: acct.home,
		IdleTimeout: Duration(*spec.IdleTimeout), ExecTimeout: Duration(*spec.ExecTimeout),
		User: acct.name, UID: acct.uid, GID: acct.gid, Network: networkNone, Created: time.Now().UTC(),
		ForkedFrom: spec.ForkedFrom,
	}}
	if c := m.clustered(); c != nil {
		s.rec.Node = c.node.ID // recordCreated writes its row before anyone sees it
	}
	if spec.Session != "" && m.remote != "" {
		return nil, errWorkspaceElsewhere(m.remote, "sandbox "+spec.ID+" in session "+spec.Session)
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if spec.Session != "" {
		created, err := m.ensureSession(spec.Session, acct)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if created {
			undo = append(undo, func() { m.store.DeleteSession(spec.Session) })
		}
		if err := applyQuota(m.store, spec.Session, m.wcfg.quota(spec.WorkspaceBytes, spec.WorkspaceFiles)); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		ids, err := viewIDs(m.driver, spec.ID)
		if err == nil {
			s.view, err = m.store.Mount(m.viewDir(spec.ID), fs.ViewOptions{Session: spec.Session, IDs: ids})
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		undo = append(undo, func() { s.view.Unmount(); os.Remove(m.viewDir(spec.ID)) })
	}
	vspec := vmm.Spec{ID: spec.ID, RootFS: img.Rootfs(), Hostname: spec.ID, CPUs: spec.CPUs, Memory: spec.Memory,
		Pids: spec.Pids, Disk: spec.Disk, UID: acct.uid, GID: acct.gid, Layer: spec.Layer, TakeLayer: spec.TakeLayer}
	if s.view != nil {
		vspec.Workspace = s.view.Dir()
	}
	// The record is written (and synced) while the machine starts: it is
	// fixed already, and the create is acknowledged only once both are
	// done. A daemon that dies in between leaves a record whose machine
	// is gone, shown stopped after the restart.
	saved := make(chan error, 1)
	go func() { saved <- m.saveNew(&s.rec) }()
	undo = append(undo, func() { os.Remove(filepath.Join(m.dir, spec.ID+".json")) })
	s.m, err = m.driver.Create(ctx, vspec)
	if serr := <-saved; err == nil && serr != nil {
		s.m.Destroy(context.Background())
		return nil, serr
	}
	if err != nil {
		if errors.Is(err, vmm.ErrExists) {
			return nil, conflictf("sandbox %s: a machine with this id is still running: destroy it or pick another id", spec.ID)
		}
		return nil, err
	}
	return s, nil
}

func (m *sandboxManager) viewDir(id string) string { return filepath.Join(m.viewsDir, id) }

// ensureSession makes the session owned by the image's user as the host
// sees it, or gives an existing one's directories to that user.
func (m *sandboxManager) ensureSession(session string, acct account) (created bool, err error) {
	off := m.driver.Capabilities().HostIDOffset
	owner := fs.Owner{UID: acct.uid + off, GID: acct.gid + off}
	err = m.store.CreateSession(session, owner)
	if err == nil || !errors.Is(err, fs.ErrExists) {
		return err == nil, err
	}
	for _, sub := range []string{"", fs.InputsDir, fs.OutputsDir, fs.HomeDir} {
		p := filepath.Join(m.hostMount, session, sub)
		if err := os.Lchown(p, int(owner.UID), int(owner.GID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("give session %s to uid %d: %w", session, owner.UID, err)
		}
	}
	return false, nil
}

// save writes a record atomically: a crash leaves the old one or the new.
func (m *sandboxManager) save(rec *sandboxRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(m.dir, rec.ID+".json"), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("save sandbox %s: %w", rec.ID, err)
	}
	m.changed()
	return nil
}

// get returns the sandbox id or a not_found error.
func (m *sandboxManager) get(id string) (*sandbox, error) {
	if err := validSandboxID(id); err != nil {
		return nil, err
	}
	if s := m.local(id); s != nil {
		return s, nil
	}
	if err := m.elsewhere(id); err != nil {
		return nil, err
	}
	return nil, notFoundf("no sandbox %s: list them with `hearth sandboxes ls`", id)
}

// local returns this node's sandbox id, nil if it has none.
func (m *sandboxManager) local(id string) *sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boxes[id]
}

// lock returns the sandbox locked, or not_found if it was destroyed
// meanwhile.
func (m *sandboxManager) lock(id string) (*sandbox, error) {
	s, err := m.get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return nil, notFoundf("no sandbox %s: it was just destroyed", id)
	}
	return s, nil
}

// lockRunning is lock for operations on the machine: it also fails if the
// machine has stopped or a long operation (checkpoint, restore, save)
// holds the sandbox.
func (m *sandboxManager) lockRunning(id string) (*sandbox, error) {
	s, err := m.lock(id)
	if err != nil {
		return nil, err
	}
	if s.stopped() {
		s.mu.Unlock()
		return nil, errStopped(id)
	}
	if err := s.busy(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// list returns the sandboxes, oldest first.
func (m *sandboxManager) list() []*sandbox {
	m.mu.Lock()
	out := make([]*sandbox, 0, len(m.boxes))
	for _, s := range m.boxes {
		out = append(out, s)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].rec.Created.Equal(out[j].rec.Created) {
			return out[i].rec.Created.Before(out[j].rec.Created)
		}
		return out[i].rec.ID < out[j].rec.ID
	})
	return out
}

// Destroy kills the sandbox's machine, unmounts its view and forgets it.
// Its workspace session stays.
func (m *sandboxManager) Destroy(ctx context.Context, id string) error {
	if validSandboxID(id) == nil && m.local(id) == nil && m.clustered() != nil {
		return m.removeRecorded(ctx, id)
	}
	s, err := m.lock(id)
	if err != nil {
		return err
	}
	gone := false
	defer func() {
		// Its exposed ports end with it, once its lock is let go: closing
		// their connections takes it.
		if gone && m.ports != nil {
			m.ports.closeSandbox(id)
		}
	}()
	defer s.mu.Unlock()
	if err := s.busy(); err != nil {
		return err
	}
	if s.m != nil {
		if err := s.m.Destroy(ctx); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
	}
	// The machine held the view's mount in its namespace; with it gone
	// the view unmounts cleanly.
	if s.view != nil {
		if err := s.view.Unmount(); err != nil {
			m.log.Warn("sandbox: unmount workspace view", "id", id, "err", err)
		}
	} else {
		fs.CleanStaleMount(m.viewDir(id)) // left by a daemon that crashed
	}
	os.Remove(m.viewDir(id))
	if err := os.Remove(filepath.Join(m.dir, id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	s.destroyed, gone = true, true
	m.mu.Lock()
	delete(m.boxes, id)
	m.mu.Unlock()
	m.forgetDestroyed(ctx, id)
	m.log.Info("sandbox destroyed", "id", id)
	return nil
}

// pause freezes the sandbox on request; it stays paused until Resume.
func (m *sandboxManager) pause(ctx context.Context, id string) (*sandbox, error) {
	s, err := m.lockRunning(id)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.rec.Paused == "" {
		if err := s.m.Pause(ctx); err != nil {
			return nil, err
		}
	}
	if s.rec.Paused != pausedByUser {
		s.rec.Paused = pausedByUser
		m.log.Info("sandbox paused", "id", id, "by", pausedByUser)
		return s, m.save(&s.rec)
	}
	return s, nil
}

// resume thaws a paused sandbox. Idempotent.
func (m *sandboxManager) resume(ctx context.Context, id string) (*sandbox, error) {
	s, err := m.lockRunning(id)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	s.last = time.Now()
	return s, m.resumeLocked(ctx, s, "resumed")
}

func (m *sandboxManager) resumeLocked(ctx context.Context, s *sandbox, what string) error {
	if s.rec.Paused == "" {
		return nil
	}
	if err := s.m.Resume(ctx); err != nil {
		return err
	}
	s.rec.Paused = ""
	m.log.Info("sandbox "+what, "id", s.rec.ID)
	return m.save(&s.rec)
}

func errStopped(id string) error {
	return conflictf("sandbox %s has stopped (its machine is gone): destroy it with `hearth sandboxes destroy %s` and create a new one", id, id)
}

// use marks the sandbox busy for one exec, file or job call, resuming it
// first if it was paused for being idle. A sandbox paused on request is
// refused, and so is one being restored (its agent is starting again) or
// one paused for being idle while a checkpoint or save copies it.
// release marks the call done.
func (m *sandboxManager) use(ctx context.Context, id string) (s *sandbox, release func(), err error) {
	if s, err = m.lock(id); err != nil {
		return nil, nil, err
	}
	defer s.mu.Unlock()
	switch {
	case s.stopped():
		return nil, nil, errStopped(id)
	case s.op == opRestore:
		return nil, nil, s.busy()
	case s.rec.Paused == pausedByUser:
		return nil, nil, conflictf("sandbox %s is paused: run `hearth sandboxes resume %s` first", id, id)
	case s.rec.Paused == pausedIdle && s.op != "":
		return nil, nil, s.busy() // resuming would thaw it in the middle of a copy
	case s.rec.Paused == pausedIdle:
		if err := m.resumeLocked(ctx, s, "resumed after being idle"); err != nil {
			return nil, nil, err
		}
	}
	s.active++
	s.last = time.Now()
	return s, func() {
		s.mu.Lock()
		s.active--
		s.last = time.Now()
		s.mu.Unlock()
	}, nil
}

// Close stops the idle loop and lets go of the sandboxes without stopping
// them: their machines keep running for the next daemon to recover. The
// views' FUSE connections are served by this daemon, so a machine with a
// workspace view is paused first (pausedRestart, in its record): a
// machine let run meanwhile would have its writes into the workspace
// fail until the next daemon attaches a new view (bytes lost across a
// restart, issue 19). Frozen, its processes wait instead; the next
// daemon attaches a new view and resumes it (recoverOne). A machine
// paused already stays so, as it was. Their views are retired and left
// to a keeper that answers ESTALE, so that a process caught holding a
// view's names walks its path again into the next view
// (sandboxes_keeper.go). The driver is the daemon's to close.
func (m *sandboxManager) Close() error {
	m.closeOnce.Do(func() {
		close(m.stop)
		m.wg.Wait()
		var conns []*os.File
		for _, s := range m.list() {
			if c := m.release(s); c != nil {
				conns = append(conns, c)
			}
		}
		m.startKeeper(conns)
	})
	return nil
}

// release lets go of s. The view of a machine that lives on is retired,
// and its connection returned for the keeper (sandboxes_keeper.go);
// any other view is unmounted.
func (m *sandboxManager) release(s *sandbox) *os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	lives := s.m != nil && !s.stopped()
	if lives {
		if s.rec.Paused == "" && s.view != nil {
			m.freezeForRestart(s)
		}
		s.m.Guest().Close()
	}
	if s.view == nil {
		return nil
	}
	if lives {
		conn, err := s.view.Retire()
		if err == nil {
			return conn
		}
		m.log.Warn("sandbox: retire its workspace view; aborting it instead: a process caught opening a workspace file at the restart fails with ENOTCONN", "id", s.rec.ID, "err", err)
	}
	if err := abortFUSE(s.view.Dir()); err != nil {
		m.log.Warn("sandbox", "id", s.rec.ID, "err", err)
	}
	s.view.Unmount()
	return nil
}

func (m *sandboxManager) driverName() string {
	if m.driver == nil {
		return ""
	}
	return m.driver.Name()
}

// RemoveImage deletes an image unless a sandbox boots from it: a jail's
// root is an overlay over the image's directory.
func (m *sandboxManager) RemoveImage(name string) error {
	if err := checkImageName(name); err != nil {
		return err
	}
	m.imagesMu.Lock()
	defer m.imagesMu.Unlock()
	var users []string
	for _, s := range m.list() {
		if s.rec.Image == name {
			users = append(users, s.rec.ID)
		}
	}
	switch len(users) {
	case 0:
	case 1:
		return conflictf("image %s is used by sandbox %s: destroy it first", name, users[0])
	default:
		return conflictf("image %s is used by sandboxes %s: destroy them first", name, strings.Join(users, ", "))
	}
	return m.images.Remove(name)
}

// SandboxInfo is what the manager tells about a sandbox: a copy, taken
// under its lock, that callers may keep.
type SandboxInfo struct {
	sandboxRecord
	// Status is statusRunning, statusPaused or statusStopped; another
	// node's sandbox (ListCluster) may also be cluster.SandboxLost, and
	// has NodeAddr, its node's API address.
	Status     string
	NodeAddr   string
	AutoPaused bool // paused by the idle timeout, not by a user
	LastActive time.Time
	Driver     string
	// Usage is what its machine uses, nil when it is stopped or its tier
	// cannot say; Workspace what its session holds, nil without one.
	Usage     *vmm.Usage
	Workspace *fs.SessionInfo
}

// info describes s; it takes s.mu.
func (m *sandboxManager) info(s *sandbox) SandboxInfo {
	s.mu.Lock()
	out := SandboxInfo{sandboxRecord: s.rec, Status: s.status(), AutoPaused: s.rec.Paused == pausedIdle && !s.stopped(),
		LastActive: s.last, Driver: m.driverName()}
	u, ok := s.usage()
	s.mu.Unlock()
	if !ok {
		return out
	}
	out.Usage = &u
	if out.Session == "" {
		return out
	}
	for _, ws := range m.store.Sessions() {
		if ws.ID == out.Session {
			out.Workspace = &ws
		}
	}
	return out
}

// infoOf describes the sandbox an operation returned, or passes its error.
func (m *sandboxManager) infoOf(s *sandbox, err error) (SandboxInfo, error) {
	if err != nil {
		return SandboxInfo{}, err
	}
	return m.info(s), nil
}

// Create boots a sandbox and returns once its agent answers. The image
// must be built; the session is made if missing.
func (m *sandboxManager) Create(ctx context.Context, spec createSpec) (SandboxInfo, error) {
	return m.infoOf(m.create(ctx, spec))
}

// Get describes sandbox id.
func (m *sandboxManager) Get(id string) (SandboxInfo, error) {
	return m.infoOf(m.get(id))
}

// List describes the sandboxes, oldest first.
func (m *sandboxManager) List() []SandboxInfo {
	boxes := m.list()
	out := make([]SandboxInfo, len(boxes))
	for i, s := range boxes {
		out[i] = m.info(s)
	}
	return out
}

// Pause freezes the sandbox on request; it stays paused until Resume.
func (m *sandboxManager) Pause(ctx context.Context, id string) (SandboxInfo, error) {
	return m.infoOf(m.pause(ctx, id))
}

// Resume thaws a paused sandbox. Idempotent.
func (m *sandboxManager) Resume(ctx context.Context, id string) (SandboxInfo, error) {
	return m.infoOf(m.resume(ctx, id))
}

// Restore puts checkpoint name back (see restore).
func (m *sandboxManager) Restore(ctx context.Context, id, name string) (SandboxInfo, error) {
	return m.infoOf(m.restore(ctx, id, name))
}
