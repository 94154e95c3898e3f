package agents

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"hearth/agents/store"
	"hearth/agents/stream"
)

// Coordination through files: advisory leases on workspace paths, which
// agents take so that two of them do not do the same work, and waiting
// for files to appear or change under a session. Both are for agents
// inside machines (through the "hearth" MCP server) and for operators
// (the API, the CLI, the dashboard).

// claimState is a run's side of its leases: once its execution has ended
// it takes no new ones, so none outlives it.
type claimState struct {
	mu    sync.Mutex
	ended bool
}

// claimPayload is a claim event's payload.
type claimPayload struct {
	Op      store.ClaimOp `json:"op"`
	Path    string        `json:"path"`
	Holder  string        `json:"holder"`
	Expires time.Time     `json:"expires,omitzero"`
	// Previous is the holder whose expired lease was taken over.
	Previous string `json:"previous,omitempty"`
	// By is who released a lease other than its holder: "operator", or
	// "end" when the holder's execution ended.
	By string `json:"by,omitempty"`
}

// holder returns the run of a holder, which must be running here.
func (r *Runner) holder(holder string) (*run, error) {
	r.mu.Lock()
	ru := r.runs[holder]
	r.mu.Unlock()
	if ru == nil {
		return nil, fmt.Errorf("%w: execution %q is not running in this appliance: only a running execution holds leases", ErrNotFound, holder)
	}
	return ru, nil
}

// ClaimPath gives holder, an execution running in this runner, the
// advisory lease on path (relative to /workspace/agents, such as
// "SESSION/outputs/part-1.md"; any session's path may be claimed) for
// ttl (0: 10m; from 1s to 24h). Claiming its own lease again renews it;
// another holder's lease in force is refused with an error wrapping
// store.ErrClaimed that names the holder and the expiry; an expired one
// is taken over. Each is a claim event in the holder's stream, and a
// takeover also in the previous holder's, if it still runs here. The
// lease ends when the holder releases it, when its execution ends, or
// when it expires.
func (r *Runner) ClaimPath(ctx context.Context, holder, path string, ttl time.Duration) (store.Claim, error) {
	ru, err := r.holder(holder)
	if err != nil {
		return store.Claim{}, err
	}
	ru.claims.mu.Lock()
	defer ru.claims.mu.Unlock()
	if ru.claims.ended {
		return store.Claim{}, fmt.Errorf("%w: execution %s has ended: it holds no more leases", ErrNotFound, holder)
	}
	ch, err := r.cfg.Store.AcquireClaim(ctx, path, holder, ttl)
	if err != nil {
		return store.Claim{}, err
	}
	c := ch.Claim
	ru.emit(stream.New("", "", stream.Claim, claimPayload{Op: ch.Op, Path: c.Path, Holder: c.Holder, Expires: c.Expires, Previous: ch.Previous.Holder}))
	if ch.Op == store.TakenOver {
		r.mu.Lock()
		prev := r.runs[ch.Previous.Holder]
		r.mu.Unlock()
		if prev != nil && prev != ru {
			prev.emit(stream.New("", "", stream.Claim, claimPayload{Op: ch.Op, Path: c.Path, Holder: c.Holder, Expires: c.Expires, Previous: ch.Previous.Holder}))
		}
	}
	return c, nil
}

// ReleasePath ends holder's lease on path: a released event in its
// stream. Another holder's lease is refused (store.ErrNotHolder); a path
// with no lease in force is store.ErrNotFound.
func (r *Runner) ReleasePath(ctx context.Context, holder, path string) error {
	ru, err := r.holder(holder)
	if err != nil {
		return err
	}
	c, err := r.cfg.Store.ReleaseClaim(ctx, path, holder)
	if err != nil {
		return err
	}
	ru.emit(stream.New("", "", stream.Claim, claimPayload{Op: store.Released, Path: c.Path, Holder: c.Holder, Expires: c.Expires}))
	return nil
}

// ForceRelease ends whoever's lease on path, as an operator: a released
// event (by "operator") in the holder's stream. It returns the lease it
// ended; a path with no lease in force is store.ErrNotFound.
func (r *Runner) ForceRelease(ctx context.Context, path string) (store.Claim, error) {
	c, err := r.cfg.Store.ReleaseClaim(ctx, path, "")
	if err != nil {
		return store.Claim{}, err
	}
	ev := stream.New(c.Session, c.Holder, stream.Claim, claimPayload{Op: store.Released, Path: c.Path, Holder: c.Holder, Expires: c.Expires, By: "operator"})
	r.mu.Lock()
	ru := r.runs[c.Holder]
	r.mu.Unlock()
	if ru != nil {
		ru.emit(ev)
	} else if _, err := r.cfg.Store.Append(ctx, ev); err != nil {
		return c, fmt.Errorf("lease on %s released, but its event was not recorded: %w", c.Path, err)
	}
	return c, nil
}

// Claims lists the leases in force at or under prefix (relative to
// /workspace/agents; "" for all), by path. Expired leases are not listed.
func (r *Runner) Claims(ctx context.Context, prefix string) ([]store.Claim, error) {
	return r.cfg.Store.ListClaims(ctx, store.ClaimFilter{Prefix: prefix})
}

// endClaims lets go of the run's leases as its execution ends (before its
// final status, so the events come first): a released event for each
// lease in force, an expired one for each that had lapsed. Idempotent.
func (ru *run) endClaims() {
	ru.claims.mu.Lock()
	defer ru.claims.mu.Unlock()
	if ru.claims.ended {
		return
	}
	ru.claims.ended = true
	released, err := ru.r.cfg.Store.ReleaseClaims(context.Background(), ru.exec.ID)
	if err != nil {
		ru.emit(stream.New("", "", stream.Error, map[string]string{"message": "could not release the execution's leases on paths (they stay until they expire): " + err.Error()}))
		return
	}
	now := time.Now()
	for _, c := range released {
		op := store.Released
		if !c.Expires.After(now) {
			op = store.Expired
		}
		ru.emit(stream.New("", "", stream.Claim, claimPayload{Op: op, Path: c.Path, Holder: c.Holder, Expires: c.Expires, By: "end"}))
	}
}

// ErrTimeout: what WaitForFiles waited for did not happen in time.
var ErrTimeout = errors.New("timed out")

// Bounds of WaitForFiles.
const (
	DefaultWaitTimeout = 60 * time.Second
	MaxWaitTimeout     = time.Hour
	maxPattern         = 1024
	recheckEvery       = 2 * time.Second
)

// checkPattern refuses a glob that is not relative to a session, such as
// outputs/*.md.
func checkPattern(pattern string) error {
	bad := func(why string) error {
		q := pattern
		if len(q) > 80 {
			q = q[:80] + "..."
		}
		return fmt.Errorf("%w: pattern %q: %s; give a glob relative to the session such as outputs/*.md", store.ErrInvalid, q, why)
	}
	switch {
	case pattern == "":
		return bad("empty")
	case len(pattern) > maxPattern:
		return bad(fmt.Sprintf("longer than %d bytes", maxPattern))
	case !utf8.ValidString(pattern):
		return bad("not valid UTF-8")
	case strings.ContainsFunc(pattern, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return bad("contains a control character")
	case strings.HasPrefix(pattern, "/"):
		return bad("absolute")
	case path.Clean(pattern) != strings.TrimSuffix(pattern, "/") || path.Clean(pattern) == ".":
		return bad("not in its simplest form (no ., .., // or trailing /)")
	}
	for _, el := range strings.Split(pattern, "/") {
		if el == ".." {
			return bad(`".." is not allowed`)
		}
		if _, err := path.Match(el, ""); err != nil {
			return bad("malformed: " + err.Error())
		}
	}
	return nil
}

// WaitForFiles waits for files of session matching pattern (a glob
// relative to the session, such as outputs/*.md) and returns their paths,
// relative to the session. With changes false it returns at once the
// files that already match, or else waits for one to be created, written
// or renamed; with changes true it waits for a matching file to be
// created, written or renamed after the call, and returns those that
// were. It waits at most timeout (0: 60s; at most 1h), then fails with an
// error wrapping ErrTimeout that says what it waited for; and at most as
// long as ctx.
func (r *Runner) WaitForFiles(ctx context.Context, session, pattern string, changes bool, timeout time.Duration) ([]string, error) {
	switch {
	case timeout == 0:
		timeout = DefaultWaitTimeout
	case timeout < 0 || timeout > MaxWaitTimeout:
		return nil, fmt.Errorf("%w: a wait lasts up to %v (default %v), not %v", store.ErrInvalid, MaxWaitTimeout, DefaultWaitTimeout, timeout)
	}
	if err := checkPattern(pattern); err != nil {
		return nil, err
	}
	pattern = strings.TrimSuffix(pattern, "/")
	if _, err := r.cfg.Store.GetSession(ctx, session); err != nil {
		return nil, fmt.Errorf("wait for %s: %w", pattern, err)
	}
	ws := r.cfg.Workspace
	// Subscribed before the first look: nothing written in between is
	// missed.
	events, stop, err := ws.FileEvents(session)
	if err != nil {
		return nil, fmt.Errorf("wait for %s in session %s: %w", pattern, session, err)
	}
	defer stop()
	look := func() ([]string, error) {
		m, err := ws.Glob(session, pattern)
		if err != nil {
			return nil, fmt.Errorf("wait for %s in session %s: %w", pattern, session, err)
		}
		return m, nil
	}
	if !changes {
		if m, err := look(); err != nil || len(m) > 0 {
			return m, err
		}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	// The workspace drops the events of a subscriber that falls behind;
	// waiting for a file to exist, a look now and then catches one whose
	// event was lost.
	var recheck <-chan time.Time
	if !changes {
		t := time.NewTicker(recheckEvery)
		defer t.Stop()
		recheck = t.C
	}
	var changed []string
	for {
		select {
		case <-recheck:
			if m, err := look(); err != nil || len(m) > 0 {
				return m, err
			}
		case ev, ok := <-events:
			if !ok {
				return nil, fmt.Errorf("wait for %s in session %s: the workspace stopped reporting changes", pattern, session)
			}
			if !fileChanged(ev, pattern) {
				continue
			}
			if !changes {
				if m, err := look(); err != nil || len(m) > 0 {
					return m, err
				}
				continue // gone again already
			}
			changed = append(changed, ev.Path)
			// Take what else has already arrived, as one answer.
			for more := true; more; {
				select {
				case ev, ok := <-events:
					if ok && fileChanged(ev, pattern) {
						changed = append(changed, ev.Path)
					}
					more = ok
				default:
					more = false
				}
			}
			slices.Sort(changed)
			return slices.Compact(changed), nil
		case <-timer.C:
			what := "no file matching %s appeared in session %s within %v"
			if changes {
				what = "no file matching %s was created, written or renamed in session %s within %v"
			}
			return nil, fmt.Errorf("%w: "+what, ErrTimeout, pattern, session, timeout)
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for %s in session %s: %w", pattern, session, ctx.Err())
		}
	}
}

// fileChanged reports whether ev makes a file matching pattern exist.
func fileChanged(ev FileEvent, pattern string) bool {
	if ev.Op != "created" && ev.Op != "written" && ev.Op != "renamed" {
		return false
	}
	ok, _ := path.Match(pattern, ev.Path)
	return ok
}
