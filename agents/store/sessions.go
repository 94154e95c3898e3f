package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// Session is a persistent working directory plus agent home, in which
// executions run one after another.
type Session struct {
	ID            string    `json:"id"` // "session-a8f3e2"
	Agent         string    `json:"agent"`
	Created       time.Time `json:"created"`
	LastExecution string    `json:"last_execution,omitempty"` // set by CreateExecution
	// AgentSessionID is the agent CLI's own session id, which a resume
	// passes back to it (claude --resume <id>).
	AgentSessionID string `json:"agent_session_id,omitempty"`
	// BranchedFrom is the session this one was branched from, and
	// BranchedAt the snapshot of it that it started as ("" for a session
	// that was not branched).
	BranchedFrom string `json:"branched_from,omitempty"`
	BranchedAt   string `json:"branched_at,omitempty"`
}

// idAttempts bounds the retries when a generated id collides.
const idAttempts = 8

func (s *Session) validate() error {
	if s.Agent == "" {
		return fmt.Errorf("session: %w: agent is empty", ErrInvalid)
	}
	return nil
}

// CreateSession records a new session for sess.Agent. An empty ID is
// generated (retrying on collision); an ID already in use is ErrExists. An
// unset Created is now. LastExecution is ignored. It returns the session
// as stored.
func (s *Store) CreateSession(ctx context.Context, sess Session) (Session, error) {
	if err := sess.validate(); err != nil {
		return Session{}, err
	}
	if sess.Created.IsZero() {
		sess.Created = time.Now()
	}
	sess.Created = sess.Created.UTC()
	sess.LastExecution = ""
	generate := sess.ID == ""
	for range idAttempts {
		if generate {
			sess.ID = NewSessionID()
		}
		_, err := s.w.ExecContext(ctx,
			"INSERT INTO sessions (id, agent, created, agent_session_id, branched_from, branched_at) VALUES (?, ?, ?, ?, ?, ?)",
			sess.ID, sess.Agent, sess.Created.UnixNano(), sess.AgentSessionID, sess.BranchedFrom, sess.BranchedAt)
		switch {
		case err == nil:
			return sess, nil
		case !constraint(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY):
			return Session{}, fmt.Errorf("create session %s: %w", sess.ID, err)
		case !generate:
			return Session{}, fmt.Errorf("create session %s: %w", sess.ID, ErrExists)
		}
	}
	return Session{}, fmt.Errorf("create session: %w: no free id after %d attempts", ErrExists, idAttempts)
}

const sessionColumns = "id, agent, created, last_execution, agent_session_id, branched_from, branched_at"

type scanner interface{ Scan(dest ...any) error }

func scanSession(row scanner) (Session, error) {
	var (
		sess    Session
		created int64
		last    sql.NullString
	)
	if err := row.Scan(&sess.ID, &sess.Agent, &created, &last, &sess.AgentSessionID, &sess.BranchedFrom, &sess.BranchedAt); err != nil {
		return Session{}, err
	}
	sess.Created = time.Unix(0, created).UTC()
	sess.LastExecution = last.String
	return sess, nil
}

// GetSession returns the session id, or an error wrapping ErrNotFound.
func (s *Store) GetSession(ctx context.Context, id string) (Session, error) {
	row := s.r.QueryRowContext(ctx, "SELECT "+sessionColumns+" FROM sessions WHERE id = ?", id)
	sess, err := scanSession(row)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Session{}, fmt.Errorf("session %s: %w", id, err)
	}
	return sess, nil
}

// SessionFilter selects sessions for ListSessions. Zero fields select all.
type SessionFilter struct {
	Agent        string
	BranchedFrom string // only the sessions branched from this one
	Before       string // a session id: only sessions older than it (the next page); unknown gives none
	Limit        int    // at most this many; 0 means 100
}

// ListSessions returns sessions newest first.
func (s *Store) ListSessions(ctx context.Context, f SessionFilter) ([]Session, error) {
	q := "SELECT " + sessionColumns + " FROM sessions WHERE (?1 = '' OR agent = ?1)" +
		" AND (?2 = '' OR (created, rowid) < (SELECT created, rowid FROM sessions WHERE id = ?2))" +
		" AND (?4 = '' OR branched_from = ?4)" +
		" ORDER BY created DESC, rowid DESC LIMIT ?3"
	rows, err := s.r.QueryContext(ctx, q, f.Agent, f.Before, pageLimit(f.Limit), f.BranchedFrom)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		sess, err := scanSession(rows)
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		out = append(out, sess)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	return out, nil
}

// SetAgentSessionID records the agent CLI's own session id for a session,
// as reported by the agent (for a later resume). Idempotent.
func (s *Store) SetAgentSessionID(ctx context.Context, session, agentSessionID string) error {
	res, err := s.w.ExecContext(ctx, "UPDATE sessions SET agent_session_id = ? WHERE id = ?", agentSessionID, session)
	if err != nil {
		return fmt.Errorf("session %s: set agent session id: %w", session, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("session %s: %w", session, ErrNotFound)
	}
	return nil
}

// pageLimit turns a requested page size into a bounded one.
func pageLimit(n int) int {
	switch {
	case n <= 0:
		return 100
	case n > 10000:
		return 10000
	}
	return n
}
