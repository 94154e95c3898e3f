package appliance

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"hearth/image"
	"hearth/vmm/guest"
)

// account is a user of an image, from its /etc/passwd.
type account struct {
	name     string
	uid, gid uint32
	home     string
}

// readPasswd parses the image's /etc/passwd, read on the host: the image
// never changes under a machine.
func readPasswd(rootfs string) ([]account, error) {
	data, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		return nil, err
	}
	var out []account
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 7 {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 == nil && err2 == nil {
			out = append(out, account{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]})
		}
	}
	return out, nil
}

// imageUser is the image's default user, who runs a sandbox's commands.
func imageUser(img image.Image) (account, error) {
	if img.User == nil {
		return account{}, fmt.Errorf("image %s has no default user: add a [user] table to its recipe", img.Name)
	}
	users, _ := readPasswd(img.Rootfs())
	for _, a := range users {
		if a.name == img.User.Name {
			return a, nil
		}
	}
	u := img.User
	return account{name: u.Name, uid: uint32(u.UID), gid: uint32(u.UID), home: "/home/" + u.Name}, nil
}

// lookupUser resolves an exec's user: a name from the image's passwd, or
// UID[:GID].
func lookupUser(rootfs, spec string) (account, error) {
	users, err := readPasswd(rootfs)
	if err != nil {
		users = nil // numeric ids still work
	}
	uidStr, gidStr, hasGID := strings.Cut(spec, ":")
	if uid, err := strconv.ParseUint(uidStr, 10, 32); err == nil {
		a := account{name: uidStr, uid: uint32(uid), gid: uint32(uid)}
		for _, u := range users {
			if u.uid == a.uid {
				a = u
				break
			}
		}
		if hasGID {
			gid, err := strconv.ParseUint(gidStr, 10, 32)
			if err != nil {
				return account{}, invalidf("user %q: write a name, UID or UID:GID", spec)
			}
			a.gid = uint32(gid)
		}
		return a, nil
	}
	for _, u := range users {
		if u.name == spec {
			return u, nil
		}
	}
	return account{}, invalidf("user %q is not in the image's /etc/passwd: give a name from it, a UID or UID:GID", spec)
}

// baseEnv is every exec's environment before the sandbox's and the
// request's own: the image's /etc/environment values. The agent adds the
// user's HOME, USER, LOGNAME and SHELL.
func baseEnv(img image.Image) map[string]string { return maps.Clone(img.Env) }

// execSpec is a validated exec request.
type execSpec struct {
	Argv       []string
	Env        map[string]string
	Cwd, User  string
	Stdin      []byte
	Timeout    *time.Duration // nil: the sandbox's exec timeout
	TTY        bool
	Rows, Cols uint16
}

// validate checks the spec of an exec or a job (what).
func (e execSpec) validate(what string) error {
	if len(e.Argv) == 0 || e.Argv[0] == "" {
		return invalidf("%s: argv is empty: name the command to run", what)
	}
	for k := range e.Env {
		if !envKeyRe.MatchString(k) {
			return invalidf("%s: environment variable name %q: use letters, digits and '_'", what, k)
		}
	}
	if e.Cwd != "" && !filepath.IsAbs(e.Cwd) {
		return invalidf("%s: cwd %q: give an absolute directory", what, e.Cwd)
	}
	if e.Timeout != nil && *e.Timeout < 0 {
		return invalidf("%s: timeout must not be negative", what)
	}
	return nil
}

// execution is a command started in a sandbox; the sandbox counts as busy
// until Wait returns.
type execution struct {
	*guest.Process
	release func()
	once    sync.Once
}

// Wait copies the output until the command ends.
func (e *execution) Wait() (guest.ExitStatus, error) {
	defer e.once.Do(e.release)
	return e.Process.Wait()
}

// Exec starts a command in the sandbox; its output goes to stdout and
// stderr as it is produced while Wait runs.
func (m *sandboxManager) Exec(ctx context.Context, id string, spec execSpec, stdout, stderr io.Writer) (*execution, error) {
	if err := spec.validate("exec"); err != nil {
		return nil, err
	}
	s, release, err := m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	req, err := m.guestRequest(s, spec)
	if err != nil {
		release()
		return nil, err
	}
	p, err := s.m.Guest().Start(ctx, req, bytes.NewReader(spec.Stdin), stdout, stderr)
	if err != nil {
		release()
		if s.stopped() {
			return nil, errStopped(id)
		}
		return nil, invalidf("sandbox %s: %v", id, err)
	}
	return &execution{Process: p, release: release}, nil
}

// guestRequest builds the agent's request: environment layered image,
// user, sandbox, request; the user's home as the default directory.
func (m *sandboxManager) guestRequest(s *sandbox, spec execSpec) (guest.ExecRequest, error) {
	rec := &s.rec
	env := maps.Clone(rec.BaseEnv)
	if env == nil {
		env = map[string]string{}
	}
	home := rec.Home
	req := guest.ExecRequest{Argv: spec.Argv, Stdin: len(spec.Stdin) > 0, PTY: spec.TTY, Rows: spec.Rows, Cols: spec.Cols}
	if spec.User != "" {
		a, err := lookupUser(rec.Rootfs, spec.User)
		if err != nil {
			return req, err
		}
		req.UID, req.GID = &a.uid, &a.gid
		home = a.home
	}
	maps.Copy(env, rec.Env)
	maps.Copy(env, spec.Env)
	req.Env = env
	req.Dir = spec.Cwd
	if req.Dir == "" && home != "" {
		if fi, err := os.Stat(filepath.Join(rec.Rootfs, home)); err == nil && fi.IsDir() {
			req.Dir = home
		}
	}
	timeout := time.Duration(rec.ExecTimeout)
	if spec.Timeout != nil {
		timeout = *spec.Timeout
	}
	req.Timeout = guest.Duration(timeout)
	return req, nil
}

// withGuest runs fn against the sandbox's agent as one call.
func (m *sandboxManager) withGuest(ctx context.Context, id string, fn func(*guest.Client) error) error {
	return m.withSandbox(ctx, id, func(s *sandbox) error { return fn(s.m.Guest()) })
}

// withSandbox runs fn, which calls the sandbox's agent, as one call.
func (m *sandboxManager) withSandbox(ctx context.Context, id string, fn func(*sandbox) error) error {
	s, release, err := m.use(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	if err := fn(s); err != nil {
		if s.stopped() {
			return errStopped(id)
		}
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// checkPath refuses what cannot be a path in a sandbox. Where the path
// leads is the guest's to confine: it resolves it inside the machine.
func checkPath(p string) error {
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) || len(p) > 4096 {
		return invalidf("path %q: give an absolute path inside the sandbox, like /home/agent/notes.txt", p)
	}
	return nil
}
