package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// ErrUnreachable wraps a PostgreSQL server that cannot be reached (or
// refuses the login) when a Store is opened.
var ErrUnreachable = errors.New("database server unreachable")

// PostgresOptions says how OpenPostgres joins a shared database.
type PostgresOptions struct {
	// Node names this daemon among those sharing the database (default:
	// the host name). It owns the executions it creates: it writes their
	// events and InterruptRunning touches only its own.
	Node string
}

const (
	maxNodeName   = 255
	pgConns       = 16
	connectTimout = 15 * time.Second
	// writeLockKey is the transaction-scoped advisory lock every write
	// transaction but the events' group commit takes on PostgreSQL (the
	// store's application id): writes that read then write (a credit
	// reservation against the balance, a claim) are serialized across
	// nodes as SQLite's IMMEDIATE transactions serialize them on one
	// file. Events need no lock: one node writes an execution's events,
	// and their primary key refuses a duplicate seq.
	writeLockKey = applicationID
)

// OpenPostgres opens the store in the PostgreSQL database at dbURL
// (postgres://user@host/db?sslmode=...), shared with other nodes, and
// brings its schema up to date with the same migrations as SQLite. Live
// subscribers see the events any node appends (LISTEN/NOTIFY). A node
// name may be used by one open Store at a time (ErrLocked).
func OpenPostgres(ctx context.Context, dbURL string, opts PostgresOptions) (*Store, error) {
	cfg, err := ParsePostgresURL(dbURL)
	if err != nil {
		return nil, err
	}
	if opts.Node == "" {
		if opts.Node, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("open store: node name: %w", err)
		}
	}
	if len(opts.Node) > maxNodeName || strings.ContainsFunc(opts.Node, unicode.IsControl) {
		return nil, fmt.Errorf("open store: node %q: %w: at most %d bytes, no control characters", opts.Node, ErrInvalid, maxNodeName)
	}
	where := redact(dbURL)
	s, err := openPostgres(ctx, cfg, where, opts.Node)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", where, classifyPG(err))
	}
	return s, nil
}

// ParsePostgresURL checks a PostgreSQL URL without connecting.
func ParsePostgresURL(dbURL string) (*pgx.ConnConfig, error) {
	if !strings.HasPrefix(dbURL, "postgres://") && !strings.HasPrefix(dbURL, "postgresql://") {
		return nil, fmt.Errorf("open store %q: %w: want a postgres:// URL such as postgres://hearth@db.example/hearth", redact(dbURL), ErrInvalid)
	}
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w: %w", redact(dbURL), ErrInvalid, err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimout
	}
	return cfg, nil
}

// redact drops a password from a URL, for errors and logs.
func redact(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "(unparsable URL)"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

func openPostgres(ctx context.Context, cfg *pgx.ConnConfig, where, node string) (_ *Store, err error) {
	s := newStore(where)
	s.dialect, s.node, s.pgCfg = postgresDialect, node, cfg
	defer func() {
		if err != nil {
			s.closeDBs()
		}
	}()
	s.w = sql.OpenDB(rebindConnector{stdlib.GetConnector(*cfg)})
	s.w.SetMaxOpenConns(pgConns)
	s.w.SetMaxIdleConns(pgConns)
	s.r = s.w
	pctx, cancel := context.WithTimeout(ctx, connectTimout)
	defer cancel()
	if err := s.w.PingContext(pctx); err != nil {
		return nil, fmt.Errorf("%w: %w (is the server running, and the URL's host, port, user and database right?)", ErrUnreachable, err)
	}
	if s.nodeLock, err = lockNode(ctx, s.w, node); err != nil {
		return nil, err
	}
	if err := migratePostgres(ctx, s.w); err != nil {
		return nil, err
	}
	if s.insertEvent, err = s.w.PrepareContext(ctx, insertEventSQL); err != nil {
		return nil, err
	}
	s.start()
	lctx, stop := context.WithCancel(context.Background())
	s.stopListen = stop
	ready := make(chan struct{})
	s.wg.Add(1)
	go s.listen(lctx, ready)
	// Open returns once the node follows the others: a subscriber from
	// then on misses nothing.
	rctx, rcancel := context.WithTimeout(ctx, connectTimout)
	defer rcancel()
	select {
	case <-ready:
	case <-rctx.Done():
		s.Close()
		return nil, fmt.Errorf("listen for other nodes' events: %w", rctx.Err())
	}
	return s, nil
}

// nodeLockClass is the first key of the session advisory locks that
// keep node names unique ("HR").
const nodeLockClass = 0x4852

// lockNode holds, on a connection of its own for the Store's lifetime, a
// lock on the node's name: two daemons with one name would each take the
// other's executions for their own (InterruptRunning). A second one is
// refused with ErrLocked, as a second Store on one SQLite file is.
func lockNode(ctx context.Context, db *sql.DB, node string) (*sql.Conn, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var ok bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(?, hashtext(?))", nodeLockClass, node).Scan(&ok); err != nil {
		conn.Close()
		return nil, err
	}
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("%w: node %q is open in another Store on this database: give each daemon its own node name", ErrLocked, node)
	}
	return conn, nil
}

// unlockNode lets the node's name go at once (closing the connection
// alone would free it only when the server's backend has exited, after
// Close returned) and closes the connection. A server that is gone has
// let it go already.
func unlockNode(conn *sql.Conn, node string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn.ExecContext(ctx, "SELECT pg_advisory_unlock(?, hashtext(?))", nodeLockClass, node)
	return conn.Close()
}

// migratePostgres migrates under a session advisory lock, so nodes
// starting together do not run the same migration twice.
func migratePostgres(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(?)", writeLockKey+1); err != nil {
		return err
	}
	defer conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock(?)", writeLockKey+1)
	return migrate(ctx, db, postgresDialect)
}

// beginWrite starts a write transaction: on PostgreSQL it first takes
// the store's write lock (see writeLockKey).
func (s *Store) beginWrite(ctx context.Context) (*sql.Tx, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil || s.dialect != postgresDialect {
		return tx, err
	}
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(?)", writeLockKey); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// rebindConnector lets the store's SQL, written with SQLite's ? and ?N
// placeholders, run on PostgreSQL, which numbers them $N.
type rebindConnector struct{ driver.Connector }

func (c rebindConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return rebindConn{conn.(*stdlib.Conn)}, nil
}

type rebindConn struct{ *stdlib.Conn }

func (c rebindConn) Prepare(q string) (driver.Stmt, error) { return c.Conn.Prepare(rebind(q)) }

func (c rebindConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, rebind(q))
}

func (c rebindConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, rebind(q), args)
}

func (c rebindConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.QueryContext(ctx, rebind(q), args)
}

// rebind turns ? into $1, $2, ... in order and ?N into $N, outside
// quoted strings, quoted names and comments.
func rebind(q string) string {
	if !strings.ContainsRune(q, '?') {
		return q
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(q[i+1:], c)
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+2])
			i += j + 1
		case c == '-' && strings.HasPrefix(q[i:], "--"):
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				j = len(q) - i - 1
			}
			b.WriteString(q[i : i+j+1])
			i += j
		case c == '?':
			j := i + 1
			for j < len(q) && q[j] >= '0' && q[j] <= '9' {
				j++
			}
			if j > i+1 {
				b.WriteString("$" + q[i+1:j])
				i = j - 1
			} else {
				n++
				fmt.Fprintf(&b, "$%d", n)
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// PostgreSQL error classes (SQLSTATE) the store maps to its sentinels.
const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
)

// pgCode is err's SQLSTATE, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// pgWriteFailure reports whether err is PostgreSQL failing to write for a
// reason outside the caller's control: the server gone or restarting,
// the connection lost, the disk full, an I/O error, a read-only server.
func pgWriteFailure(err error) bool {
	code := pgCode(err)
	switch {
	case code == "":
		var ce *pgconn.ConnectError
		return errors.As(err, &ce) || errors.Is(err, driver.ErrBadConn) || pgconn.SafeToRetry(err) ||
			pgconn.Timeout(err) || isConnLost(err)
	case strings.HasPrefix(code, "08"), // connection exception
		strings.HasPrefix(code, "53"),                     // insufficient resources: disk full, out of memory
		strings.HasPrefix(code, "58"),                     // system error: I/O
		code == "57P01", code == "57P02", code == "57P03", // shutdown, crash, cannot connect now
		code == "25006",                  // read-only transaction (a standby)
		code == "40001", code == "40P01": // serialization failure, deadlock: retrying is right
		return true
	}
	return false
}

// isConnLost reports the errors a connection returns when the server's
// socket closes under it or refuses it.
func isConnLost(err error) bool {
	var ne net.Error
	return errors.Is(err, sql.ErrConnDone) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ENOENT) || errors.As(err, &ne)
}

// classifyPG wraps a refused login or missing database in ErrUnreachable.
func classifyPG(err error) error {
	switch code := pgCode(err); {
	case strings.HasPrefix(code, "28"), code == "3D000": // auth, no such database
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}
