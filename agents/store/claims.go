package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Claim is an advisory lease on a workspace path: while it lasts, other
// agents agree not to take the same work. Paths are relative to
// /workspace/agents ("session-a8f3e2/outputs/part-1.md"); one holder, a
// running execution, per path.
type Claim struct {
	Path     string    `json:"path"`
	Holder   string    `json:"holder"`  // the execution holding it
	Session  string    `json:"session"` // the holder's session
	Acquired time.Time `json:"acquired"`
	Expires  time.Time `json:"expires"`
}

// ClaimOp says what happened to a lease.
type ClaimOp string

const (
	Claimed   ClaimOp = "claimed"    // a free (or expired and unheld) path was taken
	Renewed   ClaimOp = "renewed"    // its holder claimed it again: a new expiry
	TakenOver ClaimOp = "taken_over" // another holder's lease had expired
	Released  ClaimOp = "released"   // its holder or an operator let it go, or the holder ended
	Expired   ClaimOp = "expired"    // the holder ended after its lease had lapsed
)

// Errors of leases, matched with errors.Is.
var (
	ErrClaimed   = errors.New("path is claimed by another holder")
	ErrNotHolder = errors.New("not the holder of the lease")
)

// Bounds of a lease's time to live.
const (
	DefaultClaimTTL = 10 * time.Minute
	MinClaimTTL     = time.Second
	MaxClaimTTL     = 24 * time.Hour
)

// Bounds of a claimed path.
const (
	MaxClaimPath    = 1024 // bytes
	maxClaimElement = 255  // bytes, as a file name
)

// WorkspaceAgents is where agents see every session's files; a claimed
// path may be given under it and is kept relative to it.
const WorkspaceAgents = "/workspace/agents"

// ClaimTTL applies the bounds to a lease's time to live: 0 is the
// default (10m); under 1s or over 24h is refused.
func ClaimTTL(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl == 0:
		return DefaultClaimTTL, nil
	case ttl < MinClaimTTL || ttl > MaxClaimTTL:
		return 0, fmt.Errorf("%w: a lease lasts from %v to %v (default %v), not %v", ErrInvalid,
			MinClaimTTL, MaxClaimTTL, DefaultClaimTTL, ttl)
	}
	return ttl, nil
}

// CleanClaimPath normalises a path to claim: relative to
// /workspace/agents (that prefix is taken off if given), cleaned, with no
// "..", no empty path, no control characters (NUL included), valid UTF-8,
// at most 1024 bytes and 255 a component. Anything else is refused with
// an error that says what to give.
func CleanClaimPath(p string) (string, error) {
	return cleanPath(p, false)
}

// CleanClaimPrefix is CleanClaimPath for a listing's prefix, where ""
// (every claim) is allowed.
func CleanClaimPrefix(p string) (string, error) {
	return cleanPath(p, true)
}

func cleanPath(p string, emptyOK bool) (string, error) {
	bad := func(why string) error {
		q := p
		if len(q) > 80 {
			q = q[:80] + "..."
		}
		return fmt.Errorf("%w: path %q: %s; give a path relative to %s such as SESSION/outputs/part-1.md",
			ErrInvalid, q, why, WorkspaceAgents)
	}
	if len(p) > MaxClaimPath+len(WorkspaceAgents)+1 {
		return "", bad(fmt.Sprintf("longer than %d bytes", MaxClaimPath))
	}
	if !utf8.ValidString(p) {
		return "", bad("not valid UTF-8")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return "", bad("contains a control character")
		}
	}
	if p == WorkspaceAgents || p == WorkspaceAgents+"/" {
		p = ""
	} else if rest, ok := strings.CutPrefix(p, WorkspaceAgents+"/"); ok {
		p = rest
	}
	if strings.HasPrefix(p, "/") {
		return "", bad("absolute, outside " + WorkspaceAgents)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", bad(`".." is not allowed`)
		}
		if len(el) > maxClaimElement {
			return "", bad(fmt.Sprintf("a component is longer than %d bytes", maxClaimElement))
		}
	}
	if p == "" {
		if emptyOK {
			return "", nil
		}
		return "", bad("empty")
	}
	c := path.Clean(p)
	switch {
	case c == ".":
		if emptyOK {
			return "", nil
		}
		return "", bad("empty")
	case len(c) > MaxClaimPath:
		return "", bad(fmt.Sprintf("longer than %d bytes", MaxClaimPath))
	}
	return c, nil
}

// ClaimChange is what AcquireClaim did.
type ClaimChange struct {
	Claim Claim
	Op    ClaimOp // Claimed, Renewed or TakenOver
	// Previous is the lease taken over (expired), with TakenOver.
	Previous Claim
}

const claimColumns = "path, holder, session_id, acquired, expires"

func scanClaim(row scanner) (Claim, error) {
	var (
		c                 Claim
		acquired, expires int64
	)
	if err := row.Scan(&c.Path, &c.Holder, &c.Session, &acquired, &expires); err != nil {
		return Claim{}, err
	}
	c.Acquired, c.Expires = time.Unix(0, acquired).UTC(), time.Unix(0, expires).UTC()
	return c, nil
}

// AcquireClaim gives holder, a pending or running execution, the lease on
// p (CleanClaimPath) for ttl (ClaimTTL), in one transaction: a free path
// is Claimed; holder's own lease is Renewed (a new expiry, the same
// Acquired); another holder's expired lease is TakenOver; another
// holder's lease that has not expired is refused with an error wrapping
// ErrClaimed that names the holder and the expiry.
func (s *Store) AcquireClaim(ctx context.Context, p, holder string, ttl time.Duration) (ClaimChange, error) {
	p, err := CleanClaimPath(p)
	if err != nil {
		return ClaimChange{}, err
	}
	if ttl, err = ClaimTTL(ttl); err != nil {
		return ClaimChange{}, err
	}
	tx, err := s.beginWrite(ctx) // IMMEDIATE: the read and the write are one step
	if err != nil {
		return ClaimChange{}, fmt.Errorf("claim %s: %w", p, err)
	}
	defer tx.Rollback()
	var session string
	var status Status
	err = tx.QueryRowContext(ctx, "SELECT session_id, status FROM executions WHERE id = ?", holder).Scan(&session, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ClaimChange{}, fmt.Errorf("claim %s: execution %s: %w", p, holder, ErrNotFound)
	case err != nil:
		return ClaimChange{}, fmt.Errorf("claim %s: %w", p, err)
	case status.Terminal():
		return ClaimChange{}, fmt.Errorf("claim %s: %w: execution %s has ended (%s): only a running execution holds a lease", p, ErrInvalid, holder, status)
	}
	now := time.Now().UTC()
	ch := ClaimChange{Claim: Claim{Path: p, Holder: holder, Session: session, Acquired: now, Expires: now.Add(ttl)}, Op: Claimed}
	old, err := scanClaim(tx.QueryRowContext(ctx, "SELECT "+claimColumns+" FROM claims WHERE path = ?", p))
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return ClaimChange{}, fmt.Errorf("claim %s: %w", p, err)
	case old.Holder == holder:
		ch.Op, ch.Claim.Acquired = Renewed, old.Acquired
		if !old.Expires.After(now) { // lapsed, then claimed again: a new lease
			ch.Op, ch.Claim.Acquired = Claimed, now
		}
	case old.Expires.After(now):
		return ClaimChange{}, fmt.Errorf("claim %s: %w: held by execution %s until %s (%v from now); wait for it, or take other work",
			p, ErrClaimed, old.Holder, old.Expires.Format(time.RFC3339), old.Expires.Sub(now).Round(time.Second))
	default:
		ch.Op, ch.Previous = TakenOver, old
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO claims ("+claimColumns+") VALUES (?, ?, ?, ?, ?)"+
		" ON CONFLICT (path) DO UPDATE SET holder = excluded.holder, session_id = excluded.session_id,"+
		" acquired = excluded.acquired, expires = excluded.expires",
		p, holder, session, ch.Claim.Acquired.UnixNano(), ch.Claim.Expires.UnixNano()); err != nil {
		return ClaimChange{}, fmt.Errorf("claim %s: %w", p, s.wrote(err, holder))
	}
	if err := s.wrote(tx.Commit(), holder); err != nil {
		return ClaimChange{}, fmt.Errorf("claim %s: %w", p, err)
	}
	return ch, nil
}

// ReleaseClaim ends the lease on p (CleanClaimPath) and returns it. A
// holder may release only its own lease (another's is ErrNotHolder); ""
// is an operator, who may release any. A path with no lease in force
// (none, or an expired one) is ErrNotFound.
func (s *Store) ReleaseClaim(ctx context.Context, p, holder string) (Claim, error) {
	p, err := CleanClaimPath(p)
	if err != nil {
		return Claim{}, err
	}
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return Claim{}, fmt.Errorf("release %s: %w", p, err)
	}
	defer tx.Rollback()
	now := time.Now()
	c, err := scanClaim(tx.QueryRowContext(ctx, "SELECT "+claimColumns+" FROM claims WHERE path = ?", p))
	switch {
	case errors.Is(err, sql.ErrNoRows) || err == nil && !c.Expires.After(now):
		return Claim{}, fmt.Errorf("release %s: %w: no lease in force on it (never claimed, released, or expired)", p, ErrNotFound)
	case err != nil:
		return Claim{}, fmt.Errorf("release %s: %w", p, err)
	case holder != "" && c.Holder != holder:
		return Claim{}, fmt.Errorf("release %s: %w: execution %s holds it, not %s", p, ErrNotHolder, c.Holder, holder)
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM claims WHERE path = ?", p); err != nil {
		return Claim{}, fmt.Errorf("release %s: %w", p, s.wrote(err))
	}
	if err := s.wrote(tx.Commit()); err != nil {
		return Claim{}, fmt.Errorf("release %s: %w", p, err)
	}
	return c, nil
}

// ReleaseClaims ends every lease of holder, expired ones too (the runner
// calls it when the execution ends), and returns them, by path.
func (s *Store) ReleaseClaims(ctx context.Context, holder string) ([]Claim, error) {
	// Most executions hold none: a read spares them a write (and the
	// write failures of a full disk).
	var held bool
	if err := s.r.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM claims WHERE holder = ?)", holder).Scan(&held); err != nil {
		return nil, fmt.Errorf("release the leases of %s: %w", holder, err)
	}
	if !held {
		return nil, nil
	}
	rows, err := s.w.QueryContext(ctx, "DELETE FROM claims WHERE holder = ? RETURNING "+claimColumns, holder)
	if err != nil {
		return nil, fmt.Errorf("release the leases of %s: %w", holder, s.wrote(err, holder))
	}
	defer rows.Close()
	var out []Claim
	for rows.Next() {
		c, err := scanClaim(rows)
		if err != nil {
			return nil, fmt.Errorf("release the leases of %s: %w", holder, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("release the leases of %s: %w", holder, s.wrote(err, holder))
	}
	s.wrote(nil)
	sortClaims(out)
	return out, nil
}

func sortClaims(cs []Claim) {
	slices.SortFunc(cs, func(a, b Claim) int { return strings.Compare(a.Path, b.Path) })
}

// ClaimFilter selects leases for ListClaims; zero fields select all.
type ClaimFilter struct {
	// Prefix selects the paths at or under it (CleanClaimPrefix):
	// "s1/outputs" gives s1/outputs and s1/outputs/a.md, not s1/outputs2.
	Prefix string
	Holder string
}

// ListClaims returns the leases in force (expired ones are not listed),
// by path.
func (s *Store) ListClaims(ctx context.Context, f ClaimFilter) ([]Claim, error) {
	prefix, err := CleanClaimPrefix(f.Prefix)
	if err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, "SELECT "+claimColumns+" FROM claims WHERE expires > ?1"+
		" AND (?2 = '' OR path = ?2 OR substr(path, 1, length(?2) + 1) = ?2 || '/')"+
		" AND (?3 = '' OR holder = ?3) ORDER BY path",
		time.Now().UnixNano(), prefix, f.Holder)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer rows.Close()
	var out []Claim
	for rows.Next() {
		c, err := scanClaim(rows)
		if err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return out, nil
}
