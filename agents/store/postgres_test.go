package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"hearth/internal/pgtest"
)

// An opener opens a fresh, empty Store for a test.
type opener func(t testing.TB) (*Store, error)

func openSQLite(t testing.TB) (*Store, error) { return Open(filepath.Join(t.TempDir(), "hearth.db")) }

// conformance lists the store's tests that are not about the SQLite file
// itself: TestPostgresConformance runs each of them again on PostgreSQL.
var conformance = []struct {
	name string
	fn   func(*testing.T)
}{
	{"TestSessions", TestSessions},
	{"TestCreateExecution", TestCreateExecution},
	{"TestStatusTransitions", TestStatusTransitions},
	{"TestUpdateExecution", TestUpdateExecution},
	{"TestListExecutions", TestListExecutions},
	{"TestListExecutionsPromptPreview", TestListExecutionsPromptPreview},
	{"TestExecutionTree", TestExecutionTree},
	{"TestAppend", TestAppend},
	{"TestAppendConcurrent", TestAppendConcurrent},
	{"TestEventsPaging", TestEventsPaging},
	{"TestSeqsSurviveReopen", TestSeqsSurviveReopen},
	{"TestAppendAsync", TestAppendAsync},
	{"TestCommitFailure", TestCommitFailure},
	{"TestExecutionOnBudget", TestExecutionOnBudget},
	{"TestSubscribeReplayThenLive", TestSubscribeReplayThenLive},
	{"TestSlowSubscriberIsDropped", TestSlowSubscriberIsDropped},
	{"TestSubscribeAll", TestSubscribeAll},
	{"TestSubscribeEdges", TestSubscribeEdges},
	{"TestCreditLedger", TestCreditLedger},
	{"TestReserveRace", TestReserveRace},
	{"TestCarveCredits", TestCarveCredits},
	{"TestClaimAcquireRenewRelease", TestClaimAcquireRenewRelease},
	{"TestClaimRace", TestClaimRace},
	{"TestClaimExpiryTakeover", TestClaimExpiryTakeover},
	{"TestClaimTTLAndHolder", TestClaimTTLAndHolder},
	{"TestClaimInterruptRunning", TestClaimInterruptRunning},
	{"TestListClaimsPrefix", TestListClaimsPrefix},
	{"TestHostileClaimPaths", TestHostileClaimPaths},
}

// pgBases maps a conformance run's top-level test name to the URL of its
// server's first database.
var pgBases sync.Map

const conformanceTest = "TestPostgresConformance"

// openerFor is the opener of the suite t runs in.
func openerFor(t testing.TB) opener {
	return func(t testing.TB) (*Store, error) { return openSame(t)() }
}

// openSame returns a function that opens a Store on one fresh database
// (SQLite file or PostgreSQL database, as the suite t runs in) each time
// it is called: for tests of what a reopened store finds.
func openSame(t testing.TB) func() (*Store, error) {
	top, _, _ := strings.Cut(t.Name(), "/")
	if base, ok := pgBases.Load(top); ok {
		db := freshDB(t, base.(string))
		return func() (*Store, error) { return OpenPostgres(ctx, db, PostgresOptions{Node: "node-a"}) }
	}
	path := filepath.Join(t.TempDir(), "hearth.db")
	return func() (*Store, error) { return Open(path) }
}

// TestPostgresConformance runs the engine-independent tests on
// PostgreSQL, each on a fresh database of one throwaway server.
func TestPostgresConformance(t *testing.T) {
	_, base := pgtest.Start(t, pgtest.Options{})
	pgBases.Store(conformanceTest, base)
	defer pgBases.Delete(conformanceTest)
	for _, c := range conformance {
		t.Run(c.name, c.fn)
	}
}

// startPG starts a server for t and returns the URL of a fresh database.
func startPG(t testing.TB) (*pgtest.Server, string) {
	t.Helper()
	return pgtest.Start(t, pgtest.Options{})
}

// freshDB creates a database beside the one at base, dropped when t ends.
func freshDB(t testing.TB, base string) string {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := "store_" + hex.EncodeToString(b[:])
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(c, base)
	if err != nil {
		t.Fatalf("connect %s: %v", base, err)
	}
	defer conn.Close(c)
	if _, err := conn.Exec(c, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(base)
	u.Path = "/" + name
	return u.String()
}

// TestRebind: SQLite's placeholders become PostgreSQL's, except inside
// strings, quoted names and comments.
func TestRebind(t *testing.T) {
	for in, want := range map[string]string{
		"SELECT 1":                                  "SELECT 1",
		"a = ? AND b = ?":                           "a = $1 AND b = $2",
		"?1 = '' OR x = ?1 LIMIT ?3":                "$1 = '' OR x = $1 LIMIT $3",
		"x = '?' AND y = ?":                         "x = '?' AND y = $1",
		`"we?ird" = ?`:                              `"we?ird" = $1`,
		"x = ? -- why?\nAND y = ?":                  "x = $1 -- why?\nAND y = $2",
		"x = 'it''s ?' AND y = ?":                   "x = 'it''s ?' AND y = $1",
		"x = 'unterminated ?":                       "x = 'unterminated ?",
		"SELECT pg_advisory_xact_lock(?) -- last ?": "SELECT pg_advisory_xact_lock($1) -- last ?",
	} {
		if got := rebind(in); got != want {
			t.Errorf("rebind(%q) = %q, want %q", in, got, want)
		}
	}
}
