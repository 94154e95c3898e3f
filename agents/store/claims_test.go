package store

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

// runningExec creates an execution and makes it running.
func runningExec(t testing.TB, s *Store) Execution {
	t.Helper()
	return setStatus(t, s, newExec(t, s).ID, Running)
}

func TestClaimAcquireRenewRelease(t *testing.T) {
	s := openTest(t)
	a, b := runningExec(t, s), runningExec(t, s)
	p := a.Session + "/outputs/part-1.md"
	ch, err := s.AcquireClaim(ctx, "/workspace/agents/"+p, a.ID, time.Minute)
	if err != nil || ch.Op != Claimed || ch.Claim.Path != p || ch.Claim.Holder != a.ID || ch.Claim.Session != a.Session ||
		ch.Claim.Expires.Sub(ch.Claim.Acquired) != time.Minute {
		t.Fatalf("AcquireClaim = %+v, %v", ch, err)
	}
	first := ch.Claim
	// The same holder renews: a new expiry, the same start.
	ch, err = s.AcquireClaim(ctx, p, a.ID, 2*time.Minute)
	if err != nil || ch.Op != Renewed || !ch.Claim.Acquired.Equal(first.Acquired) || !ch.Claim.Expires.After(first.Expires) {
		t.Fatalf("renew = %+v, %v (first %+v)", ch, err, first)
	}
	// Another holder is refused, told who holds it and until when.
	_, err = s.AcquireClaim(ctx, p, b.ID, 0)
	if !errors.Is(err, ErrClaimed) || !strings.Contains(err.Error(), a.ID) || !strings.Contains(err.Error(), ch.Claim.Expires.Format(time.RFC3339)) {
		t.Fatalf("claim by another = %v, want ErrClaimed naming %s and the expiry", err, a.ID)
	}
	// A claim by b on another path, with the default TTL.
	other, err := s.AcquireClaim(ctx, b.Session+"/outputs", b.ID, 0)
	if err != nil || other.Claim.Expires.Sub(other.Claim.Acquired) != DefaultClaimTTL {
		t.Fatalf("default ttl claim = %+v, %v", other, err)
	}
	list, err := s.ListClaims(ctx, ClaimFilter{})
	if err != nil || len(list) != 2 {
		t.Fatalf("ListClaims = %+v, %v; want 2", list, err)
	}
	if list, _ := s.ListClaims(ctx, ClaimFilter{Holder: b.ID}); len(list) != 1 || list[0].Holder != b.ID {
		t.Fatalf("ListClaims(holder %s) = %+v", b.ID, list)
	}
	if _, err := s.ReleaseClaim(ctx, p, b.ID); !errors.Is(err, ErrNotHolder) || !strings.Contains(err.Error(), a.ID) {
		t.Fatalf("release by non-holder = %v, want ErrNotHolder", err)
	}
	if c, err := s.ReleaseClaim(ctx, p, a.ID); err != nil || c.Holder != a.ID || c.Path != p {
		t.Fatalf("release by holder = %+v, %v", c, err)
	}
	if _, err := s.ReleaseClaim(ctx, p, a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second release = %v, want ErrNotFound", err)
	}
	// Now b may take it; an operator ("") may release anyone's.
	if ch, err := s.AcquireClaim(ctx, p, b.ID, 0); err != nil || ch.Op != Claimed {
		t.Fatalf("claim of a released path = %+v, %v", ch, err)
	}
	if c, err := s.ReleaseClaim(ctx, p, ""); err != nil || c.Holder != b.ID {
		t.Fatalf("operator release = %+v, %v", c, err)
	}
	// The holder's end lets go of the rest.
	got, err := s.ReleaseClaims(ctx, b.ID)
	if err != nil || len(got) != 1 || got[0].Path != b.Session+"/outputs" {
		t.Fatalf("ReleaseClaims = %+v, %v", got, err)
	}
	if list, _ := s.ListClaims(ctx, ClaimFilter{}); len(list) != 0 {
		t.Fatalf("claims after every release: %+v", list)
	}
}

// TestClaimRace: many holders claim one path at once; exactly one wins,
// every other is told it is claimed, by the winner.
func TestClaimRace(t *testing.T) {
	s := openTest(t)
	const n = 32
	execs := make([]Execution, n)
	for i := range execs {
		execs[i] = runningExec(t, s)
	}
	for round := range 5 {
		p := fmt.Sprintf("shared/work-%d", round)
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = s.AcquireClaim(ctx, p, execs[i].ID, time.Minute)
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: both %s and %s won", round, execs[winner].ID, execs[i].ID)
			case err == nil:
				winner = i
			case !errors.Is(err, ErrClaimed):
				t.Fatalf("round %d: %s: %v, want ErrClaimed", round, execs[i].ID, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody won", round)
		}
		for i, err := range errs {
			if i != winner && !strings.Contains(err.Error(), execs[winner].ID) {
				t.Errorf("round %d: refusal %q does not name the winner %s", round, err, execs[winner].ID)
			}
		}
		list, err := s.ListClaims(ctx, ClaimFilter{Prefix: p})
		if err != nil || len(list) != 1 || list[0].Holder != execs[winner].ID {
			t.Fatalf("round %d: ListClaims = %+v, %v; want the winner's", round, list, err)
		}
	}
}

// TestClaimSecondStore: a second Store on the same file, which could race
// the first one's leases, is refused.
func TestClaimSecondStore(t *testing.T) {
	s := openTest(t)
	if _, err := Open(s.Path()); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
}

// TestClaimExpiryTakeover: an expired lease is not listed, cannot be
// released, and another holder takes it over, told whose it was.
func TestClaimExpiryTakeover(t *testing.T) {
	s := openTest(t)
	a, b := runningExec(t, s), runningExec(t, s)
	first, err := s.AcquireClaim(ctx, "s/x", a.ID, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireClaim(ctx, "s/x", b.ID, time.Second); !errors.Is(err, ErrClaimed) {
		t.Fatalf("claim before expiry = %v, want ErrClaimed", err)
	}
	time.Sleep(time.Until(first.Claim.Expires) + 10*time.Millisecond)
	if list, err := s.ListClaims(ctx, ClaimFilter{}); err != nil || len(list) != 0 {
		t.Fatalf("expired claim listed: %+v, %v", list, err)
	}
	if _, err := s.ReleaseClaim(ctx, "s/x", a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("release of an expired lease = %v, want ErrNotFound", err)
	}
	ch, err := s.AcquireClaim(ctx, "s/x", b.ID, time.Minute)
	if err != nil || ch.Op != TakenOver || ch.Previous.Holder != a.ID || ch.Claim.Holder != b.ID {
		t.Fatalf("takeover = %+v, %v", ch, err)
	}
	// a's lapsed lease is gone: its end releases nothing of b's.
	if got, err := s.ReleaseClaims(ctx, a.ID); err != nil || len(got) != 0 {
		t.Fatalf("ReleaseClaims(a) = %+v, %v", got, err)
	}
	// A holder whose own lease lapsed claims again: a new lease.
	c, err := s.AcquireClaim(ctx, "s/y", a.ID, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(c.Claim.Expires) + 10*time.Millisecond)
	ch, err = s.AcquireClaim(ctx, "s/y", a.ID, time.Minute)
	if err != nil || ch.Op != Claimed || !ch.Claim.Acquired.After(c.Claim.Acquired) {
		t.Fatalf("claim after own lapse = %+v, %v", ch, err)
	}
}

func TestClaimTTLAndHolder(t *testing.T) {
	s := openTest(t)
	a := runningExec(t, s)
	for _, ttl := range []time.Duration{-time.Second, time.Millisecond, 999 * time.Millisecond, 24*time.Hour + 1} {
		if _, err := s.AcquireClaim(ctx, "s/x", a.ID, ttl); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "24h") {
			t.Errorf("ttl %v: %v, want ErrInvalid with the bounds", ttl, err)
		}
	}
	for _, ttl := range []time.Duration{time.Second, 24 * time.Hour} {
		if _, err := s.AcquireClaim(ctx, "s/x", a.ID, ttl); err != nil {
			t.Errorf("ttl %v: %v", ttl, err)
		}
	}
	if _, err := s.AcquireClaim(ctx, "s/z", "exec-00000000", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown holder: %v, want ErrNotFound", err)
	}
	setStatus(t, s, a.ID, Completed)
	if _, err := s.AcquireClaim(ctx, "s/z", a.ID, 0); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "ended") {
		t.Errorf("ended holder: %v, want ErrInvalid", err)
	}
}

// TestClaimInterruptRunning: the executions a dead daemon left running
// let go of their leases; those kept do not.
func TestClaimInterruptRunning(t *testing.T) {
	s := openTest(t)
	a, b := runningExec(t, s), runningExec(t, s)
	for _, e := range []Execution{a, b} {
		if _, err := s.AcquireClaim(ctx, e.Session+"/work", e.ID, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.InterruptRunning(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListClaims(ctx, ClaimFilter{})
	if err != nil || len(list) != 1 || list[0].Holder != b.ID {
		t.Fatalf("claims after InterruptRunning = %+v, %v; want only %s's", list, err, b.ID)
	}
}

func TestListClaimsPrefix(t *testing.T) {
	s := openTest(t)
	a := runningExec(t, s)
	for _, p := range []string{"s1/outputs", "s1/outputs/a.md", "s1/outputs2/b.md", "s2/outputs/c.md", "s1/out%/d.md", "s1/out_/e.md"} {
		if _, err := s.AcquireClaim(ctx, p, a.ID, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for prefix, want := range map[string]string{
		"":                          "s1/out%/d.md s1/out_/e.md s1/outputs s1/outputs/a.md s1/outputs2/b.md s2/outputs/c.md",
		"s1/outputs":                "s1/outputs s1/outputs/a.md",
		"s1/outputs/":               "s1/outputs s1/outputs/a.md",
		"/workspace/agents/s1/out%": "s1/out%/d.md",
		"s1/out_":                   "s1/out_/e.md",
		"s2":                        "s2/outputs/c.md",
		"s3":                        "",
	} {
		list, err := s.ListClaims(ctx, ClaimFilter{Prefix: prefix})
		var got []string
		for _, c := range list {
			got = append(got, c.Path)
		}
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("ListClaims(%q) = %q, %v; want %q", prefix, got, err, want)
		}
	}
	if _, err := s.ListClaims(ctx, ClaimFilter{Prefix: "../etc"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("prefix ../etc: %v, want ErrInvalid", err)
	}
}

// TestHostileClaimPaths: paths an agent could craft to escape the tree,
// alias another path or smuggle bytes are refused or made canonical, and
// a holder cannot release or renew another's lease.
func TestHostileClaimPaths(t *testing.T) {
	s := openTest(t)
	a, b := runningExec(t, s), runningExec(t, s)
	for _, p := range []string{
		"", ".", "/", "./", "..", "../x", "s/../../x", "s/..", "/etc/passwd", "/workspace/agents/../x",
		"/workspace/agentsX/s", "s/\x00/x", "s\x00", "s/\n", "s/\x7f", "\xff\xfe", strings.Repeat("a", 256),
		strings.Repeat("a/", 600), "/workspace/agents",
	} {
		if c, err := CleanClaimPath(p); !errors.Is(err, ErrInvalid) {
			t.Errorf("CleanClaimPath(%q) = %q, %v; want ErrInvalid", p, c, err)
		}
		if _, err := s.AcquireClaim(ctx, p, a.ID, 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("AcquireClaim(%q) = %v; want ErrInvalid", p, err)
		}
	}
	// Aliases of one path are one lease.
	if _, err := s.AcquireClaim(ctx, "s/outputs/a.md", a.ID, 0); err != nil {
		t.Fatal(err)
	}
	for _, alias := range []string{"s/outputs/a.md/", "s//outputs/./a.md", "/workspace/agents/s/outputs/a.md", "./s/outputs/a.md"} {
		if _, err := s.AcquireClaim(ctx, alias, b.ID, 0); !errors.Is(err, ErrClaimed) {
			t.Errorf("alias %q: %v, want ErrClaimed", alias, err)
		}
		if _, err := s.ReleaseClaim(ctx, alias, b.ID); !errors.Is(err, ErrNotHolder) {
			t.Errorf("release of alias %q by another: %v, want ErrNotHolder", alias, err)
		}
	}
	list, _ := s.ListClaims(ctx, ClaimFilter{})
	if len(list) != 1 || list[0].Holder != a.ID {
		t.Fatalf("after the attacks: %+v", list)
	}
}

// FuzzCleanClaimPath: whatever is accepted is canonical (cleaning it
// again changes nothing), relative, inside the tree, bounded and free of
// control bytes.
func FuzzCleanClaimPath(f *testing.F) {
	for _, p := range []string{"s/outputs/a.md", "/workspace/agents/s/x", "../x", "s/../x", "a//b/./c/", "\x00", "/", "é/ü", strings.Repeat("ab/", 400)} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := CleanClaimPath(p)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("CleanClaimPath(%q): %v, not ErrInvalid", p, err)
			}
			return
		}
		again, err := CleanClaimPath(c)
		if err != nil || again != c {
			t.Fatalf("CleanClaimPath(%q) = %q, then %q, %v", p, c, again, err)
		}
		if c == "" || c == "." || strings.HasPrefix(c, "/") || strings.HasSuffix(c, "/") || len(c) > MaxClaimPath ||
			!utf8.ValidString(c) || strings.ContainsFunc(c, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("CleanClaimPath(%q) = %q", p, c)
		}
		for _, el := range strings.Split(c, "/") {
			if el == "" || el == "." || el == ".." || len(el) > 255 {
				t.Fatalf("CleanClaimPath(%q) = %q: element %q", p, c, el)
			}
		}
	})
}
