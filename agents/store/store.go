package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"hearth/internal/money"
)

// Errors callers can match with errors.Is. Returned errors wrap them with
// the id or path concerned.
var (
	ErrNotFound            = errors.New("not found")
	ErrExists              = errors.New("already exists")
	ErrInvalid             = errors.New("invalid argument")
	ErrInvalidTransition   = errors.New("invalid status transition")
	ErrInsufficientCredits = errors.New("insufficient credits")
	ErrTooSlow             = errors.New("subscriber too slow: resubscribe from the last seq received")
	ErrClosed              = errors.New("store closed")
	ErrLocked              = errors.New("store in use")
	ErrNotStore            = errors.New("not a hearth store")
	ErrCorrupt             = errors.New("store file is corrupt or not an SQLite database")
	ErrSchemaTooNew        = errors.New("store schema is newer than this program")
)

// applicationID marks an SQLite file as a hearth store ("HRTH").
const applicationID = 0x48525448

const (
	busyTimeout = 10 * time.Second
	readConns   = 4
	// defaultSubBuffer is the channel capacity of a subscription: how far a
	// live subscriber may fall behind before it is dropped with ErrTooSlow.
	defaultSubBuffer = 4096
)

// Store is the durable record of one appliance. Its methods are safe for
// concurrent use. Every write goes through one connection (SQLite allows
// one writer at a time; queuing in Go is cheaper than SQLITE_BUSY
// retries); reads use a pool of read-only connections, which WAL lets run
// beside the writer.
type Store struct {
	path    string
	dialect dialect
	node    string          // PostgreSQL: this daemon's name among the nodes
	pgCfg   *pgx.ConnConfig // PostgreSQL: for the listener's own connection

	stopListen context.CancelFunc // PostgreSQL: stops the listener
	nodeLock   *sql.Conn          // PostgreSQL: holds the node name's lock
	w          *sql.DB            // one connection: all writes
	r          *sql.DB            // read-only pool

	insertEvent *sql.Stmt // prepared on w, used by the writer
	lock        *os.File  // flocked while the Store is open

	q       queue         // appends waiting for the writer
	wr      writes        // failed writes, and those kept to retry
	closing chan struct{} // closed by Close
	hub     hub

	subBuffer int // capacity of new subscriptions' channels

	wg        sync.WaitGroup // the writer, the retrier and subscriptions' replay goroutines
	closeOnce sync.Once
	closeErr  error
}

// Open opens the store in the SQLite file at path, creating it if absent,
// and brings its schema up to date. A file that is not SQLite, is corrupt,
// belongs to another program or has a newer schema is refused with
// ErrCorrupt, ErrNotStore or ErrSchemaTooNew; a file another Store holds
// open (in this process or another) with ErrLocked.
func Open(path string) (*Store, error) {
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("open store %q: %w: path must be non-empty and without '?'", path, ErrInvalid)
	}
	s, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, classify(err))
	}
	return s, nil
}

func newStore(path string) *Store {
	return &Store{
		path:      path,
		dialect:   sqliteDialect,
		closing:   make(chan struct{}),
		subBuffer: defaultSubBuffer,
	}
}

// start starts the store's goroutines once its databases are open.
func (s *Store) start() {
	s.q.init()
	s.hub.init()
	s.wr.init()
	s.wg.Add(2)
	go s.writer()
	go s.retrier()
}

func open(path string) (_ *Store, err error) {
	ctx := context.Background()
	s := newStore(path)
	defer func() {
		if err != nil {
			s.closeDBs()
		}
	}()
	if s.lock, err = lockFile(path + ".lock"); err != nil {
		return nil, err
	}
	if s.w, err = sql.Open("sqlite", dsn(path, false)); err != nil {
		return nil, err
	}
	s.w.SetMaxOpenConns(1)
	if err := claim(ctx, s.w); err != nil {
		return nil, err
	}
	if err := migrate(ctx, s.w, sqliteDialect); err != nil {
		return nil, err
	}
	if s.r, err = sql.Open("sqlite", dsn(path, true)); err != nil {
		return nil, err
	}
	s.r.SetMaxOpenConns(readConns)
	s.r.SetMaxIdleConns(readConns)
	if s.insertEvent, err = s.w.PrepareContext(ctx, insertEventSQL); err != nil {
		return nil, err
	}
	s.start()
	return s, nil
}

// lockFile takes an exclusive lock that lasts as long as the Store: the
// writer's seq cache and InterruptRunning are only right if no other
// process writes the same file.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held by another process or Store", ErrLocked, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// closeDBs closes whatever open managed to open, in reverse order.
func (s *Store) closeDBs() error {
	var errs []error
	if s.insertEvent != nil {
		errs = append(errs, s.insertEvent.Close())
	}
	if s.nodeLock != nil {
		errs = append(errs, unlockNode(s.nodeLock, s.node))
	}
	if s.r != nil && s.r != s.w {
		errs = append(errs, s.r.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // releases the flock
	}
	return errors.Join(errs...)
}

// dsn is the driver's data source name: WAL so readers never block the
// writer, NORMAL sync (durable across a crash of the daemon; a power cut
// may lose the last transactions, never corrupt the file), foreign keys
// on, and IMMEDIATE transactions so that a write never fails half-way
// with SQLITE_BUSY when another process holds the file.
func dsn(path string, readOnly bool) string {
	q := fmt.Sprintf("_busy_timeout=%d&_foreign_keys=1&_journal_mode=WAL&_synchronous=NORMAL",
		busyTimeout.Milliseconds())
	if readOnly {
		return path + "?" + q + "&_query_only=1"
	}
	return path + "?" + q + "&_txlock=immediate"
}

// claim checks that the file is empty or already a hearth store, and marks
// an empty one as a hearth store.
func claim(ctx context.Context, db *sql.DB) error {
	var id, objects int64
	if err := db.QueryRowContext(ctx, "PRAGMA application_id").Scan(&id); err != nil {
		return err
	}
	if id == applicationID {
		return nil
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&objects); err != nil {
		return err
	}
	if id != 0 || objects != 0 {
		return fmt.Errorf("%w: SQLite application id %#x with %d schema objects", ErrNotStore, id, objects)
	}
	_, err := db.ExecContext(ctx, fmt.Sprintf("PRAGMA application_id = %d", applicationID))
	return err
}

// classify wraps SQLite's "not a database" and "corrupt" results in
// ErrCorrupt so callers need not know the driver.
func classify(err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
	return err
}

// constraint reports whether err is the SQLite extended result code code
// (for example SQLITE_CONSTRAINT_PRIMARYKEY), or PostgreSQL's violation
// of the same kind of constraint.
func constraint(err error, code int) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() == code
	}
	switch pgCode(err) {
	case pgUniqueViolation:
		return code == sqlite3.SQLITE_CONSTRAINT_UNIQUE || code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	case pgForeignKeyViolation:
		return code == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
	}
	return false
}

// Close refuses new appends, stores those already accepted (AppendAsync
// included), closes every subscription with ErrClosed, and closes the
// database. It is idempotent and waits for the store's goroutines.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.q.mu.Lock()
		s.q.closed = true
		s.q.space.Broadcast()
		s.q.mu.Unlock()
		close(s.closing)
		if s.stopListen != nil {
			s.stopListen()
		}
		s.hub.closeAll(ErrClosed)
		s.wg.Wait()
		s.closeErr = s.closeDBs()
	})
	return s.closeErr
}

// Path is the store's SQLite file, or its PostgreSQL URL without a
// password.
func (s *Store) Path() string { return s.path }

// NewSessionID returns a fresh session id such as "session-a8f3e2".
// CreateSession retries on the rare collision.
func NewSessionID() string { return "session-" + randomHex(3) }

// NewExecutionID returns a fresh execution id such as "exec-4c1d09b2".
func NewExecutionID() string { return "exec-" + randomHex(4) }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b)
}

// Times are stored as Unix nanoseconds, NULL for a moment not reached.
func nanos(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

func fromNanos(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.Unix(0, n.Int64).UTC()
}

// Micros are millionths of a US dollar, the store's unit of money.
const microsPerUSD = money.MicrosPerUSD

// MinUSD is the ledger's unit, one micro-dollar (money.Min).
const MinUSD = money.Min

// MaxUSD is the largest amount the store takes (money.Max).
const MaxUSD = money.Max

// CheckUSD refuses an amount of dollars the ledger cannot hold exactly
// enough (money.Check).
func CheckUSD(usd float64) error { return money.Check(usd) }

func toMicros(usd float64) int64 { return money.Micros(usd) }

func toUSD(micros int64) float64 { return float64(micros) / microsPerUSD }
