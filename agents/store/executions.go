package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sqlite3 "modernc.org/sqlite/lib"
)

// Kind says how an execution came to be.
type Kind string

const (
	Run    Kind = "run"    // a new task
	Resume Kind = "resume" // continues Parent's conversation in the same session
	Retry  Kind = "retry"  // runs Parent's task again after it failed
)

// Status is where an execution is in its life: Pending, then Running, then
// one of the terminal statuses.
type Status string

const (
	Pending        Status = "pending"
	Running        Status = "running"
	Completed      Status = "completed"
	Failed         Status = "failed"
	BudgetExceeded Status = "budget_exceeded"
	TimedOut       Status = "timed_out"
	Cancelled      Status = "cancelled"
	Interrupted    Status = "interrupted" // the daemon stopped while it was pending or running
)

// next lists the statuses each status may move to; terminal statuses have
// none.
var next = map[Status][]Status{
	Pending: {Running, Failed, Cancelled, Interrupted},
	Running: {Completed, Failed, BudgetExceeded, TimedOut, Cancelled, Interrupted},
}

// Valid reports whether s is one of the statuses above.
func (s Status) Valid() bool {
	switch s {
	case Pending, Running, Completed, Failed, BudgetExceeded, TimedOut, Cancelled, Interrupted:
		return true
	}
	return false
}

// Terminal reports whether an execution in status s has ended.
func (s Status) Terminal() bool { return s.Valid() && len(next[s]) == 0 }

// CanBecome reports whether an execution may move from s to t. Staying in
// the same status is allowed (to update other fields).
func (s Status) CanBecome(t Status) bool { return s == t || slices.Contains(next[s], t) }

// Limits bound one execution; a zero field means no limit at this layer.
type Limits struct {
	USD      float64       `json:"usd,omitempty"`
	Turns    int           `json:"turns,omitempty"`
	WallTime time.Duration `json:"wall_time,omitempty"`
}

// Tokens counts the model tokens an execution used.
type Tokens struct {
	Input         int64 `json:"input"`
	Output        int64 `json:"output"`
	CacheRead     int64 `json:"cache_read"`
	CacheCreation int64 `json:"cache_creation"`
}

// Execution is one run of an agent inside a session.
type Execution struct {
	ID      string `json:"id"` // "exec-4c1d09b2"
	Session string `json:"session"`
	Agent   string `json:"agent"`
	Kind    Kind   `json:"kind"`
	Parent  string `json:"parent,omitempty"` // the execution resumed or retried
	Prompt  string `json:"prompt"`
	// PromptTruncated says Prompt is a preview (ExecutionFilter.PromptPreview).
	PromptTruncated bool   `json:"prompt_truncated,omitempty"`
	Status          Status `json:"status"`

	Created time.Time `json:"created"`
	Started time.Time `json:"started,omitzero"` // set when it becomes Running
	Ended   time.Time `json:"ended,omitzero"`   // set when it reaches a terminal status

	Limits  Limits   `json:"limits"`
	Turns   int      `json:"turns"`
	Tokens  Tokens   `json:"tokens"`
	USD     float64  `json:"usd"` // stored as micro-dollars
	Result  string   `json:"result,omitempty"`
	Error   string   `json:"error,omitempty"`
	Outputs []string `json:"outputs,omitempty"` // workspace paths of the files matched
}

func (e *Execution) validateNew() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("execution %s: %w: %s", e.ID, ErrInvalid, fmt.Sprintf(format, args...))
	}
	switch {
	case e.Session == "":
		return bad("session is empty")
	case e.Status != Pending:
		return bad("a new execution is pending, not %q", e.Status)
	case e.Kind != Run && e.Kind != Resume && e.Kind != Retry:
		return bad("unknown kind %q", e.Kind)
	case (e.Kind == Run) != (e.Parent == ""):
		return bad("a %s has a parent execution exactly when it is a resume or a retry", e.Kind)
	}
	return e.validateValues()
}

func (e *Execution) validateValues() error {
	if e.Limits.USD < 0 || e.Limits.Turns < 0 || e.Limits.WallTime < 0 || e.Turns < 0 || e.USD < 0 ||
		e.Tokens.Input < 0 || e.Tokens.Output < 0 || e.Tokens.CacheRead < 0 || e.Tokens.CacheCreation < 0 {
		return fmt.Errorf("execution %s: %w: negative limit, count or amount", e.ID, ErrInvalid)
	}
	if err := CheckUSD(e.Limits.USD); err != nil {
		return fmt.Errorf("execution %s: %w: limits.usd %w", e.ID, ErrInvalid, err)
	}
	if err := CheckUSD(e.USD); err != nil && !(e.USD > 0 && e.USD < MinUSD) {
		return fmt.Errorf("execution %s: %w: usd %w", e.ID, ErrInvalid, err)
	}
	return nil
}

// CreateExecution records a new pending execution in an existing session.
// An empty ID is generated; an empty Kind is Run; an empty Agent is the
// session's (another agent's is ErrInvalid); an unset Created is now. A
// resume's parent must be in the same session. Unknown session or parent
// is ErrNotFound. It also makes the execution the session's last one, and
// returns the execution as stored.
func (s *Store) CreateExecution(ctx context.Context, e Execution) (Execution, error) {
	if e.Kind == "" {
		e.Kind = Run
	}
	if e.Status == "" {
		e.Status = Pending
	}
	if e.Created.IsZero() {
		e.Created = time.Now()
	}
	e.Created = e.Created.UTC()
	e.Started, e.Ended = time.Time{}, time.Time{}
	if err := e.validateNew(); err != nil {
		return Execution{}, err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return Execution{}, fmt.Errorf("create execution: %w", err)
	}
	defer tx.Rollback()
	if err := checkLineage(ctx, tx, &e); err != nil {
		return Execution{}, err
	}
	if err := insertExecution(ctx, tx, &e); err != nil {
		return Execution{}, err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE sessions SET last_execution = ? WHERE id = ?", e.ID, e.Session); err != nil {
		return Execution{}, fmt.Errorf("create execution %s: %w", e.ID, err)
	}
	if err := s.wrote(tx.Commit()); err != nil {
		return Execution{}, fmt.Errorf("create execution %s: %w", e.ID, err)
	}
	return e, nil
}

// checkLineage checks e's session and parent, and fills in e.Agent.
func checkLineage(ctx context.Context, tx *sql.Tx, e *Execution) error {
	var agent string
	err := tx.QueryRowContext(ctx, "SELECT agent FROM sessions WHERE id = ?", e.Session).Scan(&agent)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("create execution: session %s: %w", e.Session, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("create execution: session %s: %w", e.Session, err)
	}
	if e.Agent == "" {
		e.Agent = agent
	} else if e.Agent != agent {
		return fmt.Errorf("create execution: %w: agent %s in session %s of agent %s", ErrInvalid, e.Agent, e.Session, agent)
	}
	if e.Parent == "" {
		return nil
	}
	var parentSession string
	err = tx.QueryRowContext(ctx, "SELECT session_id FROM executions WHERE id = ?", e.Parent).Scan(&parentSession)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("create execution: parent %s: %w", e.Parent, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("create execution: parent %s: %w", e.Parent, err)
	}
	if e.Kind == Resume && parentSession != e.Session {
		return fmt.Errorf("create execution: %w: resume of %s (session %s) in session %s", ErrInvalid, e.Parent, parentSession, e.Session)
	}
	return nil
}

func insertExecution(ctx context.Context, tx *sql.Tx, e *Execution) error {
	generate := e.ID == ""
	outputs, err := encodeOutputs(e.Outputs)
	if err != nil {
		return err
	}
	for range idAttempts {
		if generate {
			e.ID = NewExecutionID()
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO executions (id, session_id, agent, kind, parent_id, prompt,
			status, created, limit_usd_micros, limit_turns, limit_wall_ms, outputs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)`,
			e.ID, e.Session, e.Agent, e.Kind, sql.NullString{String: e.Parent, Valid: e.Parent != ""}, e.Prompt,
			e.Status, e.Created.UnixNano(), toMicros(e.Limits.USD), e.Limits.Turns, e.Limits.WallTime.Milliseconds(), outputs)
		switch {
		case err == nil:
			return nil
		case !constraint(err, sqlite3.SQLITE_CONSTRAINT_UNIQUE):
			return fmt.Errorf("create execution %s: %w", e.ID, err)
		case !generate:
			return fmt.Errorf("create execution %s: %w", e.ID, ErrExists)
		}
	}
	return fmt.Errorf("create execution: %w: no free id after %d attempts", ErrExists, idAttempts)
}

func encodeOutputs(outputs []string) (string, error) {
	if outputs == nil {
		outputs = []string{}
	}
	b, err := json.Marshal(outputs)
	return string(b), err
}

const executionColumns = `id, session_id, agent, kind, parent_id, prompt, status, created, started, ended,
	limit_usd_micros, limit_turns, limit_wall_ms, turns, input_tokens, output_tokens, cache_read_tokens,
	cache_creation_tokens, usd_micros, result, error, outputs`

func scanExecution(row scanner) (Execution, error) {
	var (
		e                      Execution
		parent                 sql.NullString
		created                int64
		started, ended         sql.NullInt64
		limitMicros, usdMicros int64
		limitWallMS            int64
		outputs                string
	)
	err := row.Scan(&e.ID, &e.Session, &e.Agent, &e.Kind, &parent, &e.Prompt, &e.Status, &created, &started, &ended,
		&limitMicros, &e.Limits.Turns, &limitWallMS, &e.Turns, &e.Tokens.Input, &e.Tokens.Output, &e.Tokens.CacheRead,
		&e.Tokens.CacheCreation, &usdMicros, &e.Result, &e.Error, &outputs)
	if err != nil {
		return Execution{}, err
	}
	e.Parent = parent.String
	e.Created = time.Unix(0, created).UTC()
	e.Started, e.Ended = fromNanos(started), fromNanos(ended)
	e.Limits.USD = toUSD(limitMicros)
	e.Limits.WallTime = time.Duration(limitWallMS) * time.Millisecond
	e.USD = toUSD(usdMicros)
	if err := json.Unmarshal([]byte(outputs), &e.Outputs); err != nil {
		return Execution{}, fmt.Errorf("execution %s: outputs: %w", e.ID, err)
	}
	if len(e.Outputs) == 0 {
		e.Outputs = nil
	}
	return e, nil
}

// GetExecution returns the execution id, or an error wrapping ErrNotFound.
func (s *Store) GetExecution(ctx context.Context, id string) (Execution, error) {
	e, err := getExecution(ctx, s.r, id)
	if k, ok := s.keptEnded(id); ok && err == nil {
		e = k
	}
	return e, err
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getExecution(ctx context.Context, db queryRower, id string) (Execution, error) {
	e, err := scanExecution(db.QueryRowContext(ctx, "SELECT "+executionColumns+" FROM executions WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Execution{}, fmt.Errorf("execution %s: %w", id, err)
	}
	return e, nil
}

// UpdateExecution changes an execution atomically: it reads the record,
// lets fn change it, checks the change and writes it. The status may only
// move forward (Status.CanBecome; otherwise ErrInvalidTransition); ID,
// Session, Agent, Kind, Parent, Prompt and Created cannot change
// (ErrInvalid). Started is set when the status becomes Running and Ended
// when it becomes terminal, unless fn set them. An error from fn aborts
// the update and is returned. fn runs inside the store's write
// transaction: it must be quick and must not call the Store.
//
// When the database refuses the write (ErrWriteFailed: the disk is full)
// and the update ends the execution, the record is kept in memory: reads
// return it at once, it is written as soon as the database allows, and
// UpdateExecution returns it with the error.
func (s *Store) UpdateExecution(ctx context.Context, id string, fn func(*Execution) error) (Execution, error) {
	s.wr.endMu.Lock()
	defer s.wr.endMu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return Execution{}, fmt.Errorf("update execution %s: %w", id, s.wrote(err, id))
	}
	defer tx.Rollback()
	old, err := getExecution(ctx, tx, id)
	if err != nil {
		return Execution{}, err
	}
	if k, ok := s.keptEnded(id); ok {
		old = k
	}
	e := old
	e.Outputs = slices.Clone(old.Outputs)
	if err := fn(&e); err != nil {
		return Execution{}, err
	}
	if err := checkUpdate(old, &e, time.Now().UTC()); err != nil {
		return Execution{}, err
	}
	err = writeExecution(ctx, tx, &e)
	if err == nil {
		err = tx.Commit()
	}
	if err = s.wrote(err, id); err == nil {
		s.forgetEnded(id) // this write, made over it, supersedes it
		return e, nil
	}
	if writeFailure(err) && e.Status.Terminal() {
		s.keepEnded(e)
		return e, fmt.Errorf("update execution %s: %w: %w (the record is kept and written once the store can be written)", id, ErrWriteFailed, err)
	}
	return Execution{}, fmt.Errorf("update execution %s: %w", id, err)
}

// checkUpdate validates the change from old to e and stamps the times of
// a status change.
func checkUpdate(old Execution, e *Execution, now time.Time) error {
	if e.ID != old.ID || e.Session != old.Session || e.Agent != old.Agent || e.Kind != old.Kind ||
		e.Parent != old.Parent || e.Prompt != old.Prompt || !e.Created.Equal(old.Created) {
		return fmt.Errorf("update execution %s: %w: id, session, agent, kind, parent, prompt and created are fixed", old.ID, ErrInvalid)
	}
	if !e.Status.Valid() {
		return fmt.Errorf("update execution %s: %w: unknown status %q", old.ID, ErrInvalid, e.Status)
	}
	if !old.Status.CanBecome(e.Status) {
		return fmt.Errorf("update execution %s: %s -> %s: %w", old.ID, old.Status, e.Status, ErrInvalidTransition)
	}
	if err := e.validateValues(); err != nil {
		return err
	}
	if e.Status == Running && e.Started.IsZero() {
		e.Started = now
	}
	if e.Status.Terminal() && e.Ended.IsZero() {
		e.Ended = now
	}
	e.Started, e.Ended = e.Started.UTC(), e.Ended.UTC()
	return nil
}

func writeExecution(ctx context.Context, tx *sql.Tx, e *Execution) error {
	outputs, err := encodeOutputs(e.Outputs)
	if err != nil {
		return fmt.Errorf("update execution %s: outputs: %w", e.ID, err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE executions SET status = ?, started = ?, ended = ?, limit_usd_micros = ?,
		limit_turns = ?, limit_wall_ms = ?, turns = ?, input_tokens = ?, output_tokens = ?, cache_read_tokens = ?,
		cache_creation_tokens = ?, usd_micros = ?, result = ?, error = ?, outputs = ? WHERE id = ?`,
		e.Status, nanos(e.Started), nanos(e.Ended), toMicros(e.Limits.USD), e.Limits.Turns,
		e.Limits.WallTime.Milliseconds(), e.Turns, e.Tokens.Input, e.Tokens.Output, e.Tokens.CacheRead,
		e.Tokens.CacheCreation, toMicros(e.USD), e.Result, e.Error, outputs, e.ID)
	if err != nil {
		return fmt.Errorf("update execution %s: %w", e.ID, err)
	}
	return nil
}

// ExecutionFilter selects executions for ListExecutions. Zero fields
// select all.
type ExecutionFilter struct {
	Session string
	Agent   string
	Status  []Status // any of these
	Before  string   // an execution id: only executions created before it (the next page); unknown gives none
	Limit   int      // at most this many; 0 means 100, at most 10000
	// PromptPreview, when > 0, cuts each prompt to that many characters
	// in the query, so a page of long prompts is never read whole.
	PromptPreview int
}

// ListExecutions returns the executions f selects, newest first. For the
// next page, pass the last one's ID as Before.
func (s *Store) ListExecutions(ctx context.Context, f ExecutionFilter) ([]Execution, error) {
	var (
		where []string
		args  []any
	)
	add := func(cond string, arg ...any) { where = append(where, cond); args = append(args, arg...) }
	if f.Session != "" {
		add("session_id = ?", f.Session)
	}
	if f.Agent != "" {
		add("agent = ?", f.Agent)
	}
	if len(f.Status) > 0 {
		marks := strings.TrimSuffix(strings.Repeat("?,", len(f.Status)), ",")
		for _, st := range f.Status {
			args = append(args, st)
		}
		where = append(where, "status IN ("+marks+")")
	}
	if f.Before != "" {
		add("n < (SELECT n FROM executions WHERE id = ?)", f.Before)
	}
	cols := executionColumns
	if f.PromptPreview > 0 {
		// One character more than the preview tells a cut prompt.
		cols = strings.Replace(cols, " prompt,", fmt.Sprintf(" substr(prompt, 1, %d),", f.PromptPreview+1), 1)
	}
	q := "SELECT " + cols + " FROM executions"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY n DESC LIMIT ?"
	args = append(args, pageLimit(f.Limit))
	list, err := s.queryExecutions(ctx, s.r, q, args...)
	if err != nil {
		return nil, err
	}
	list = s.overlay(list, f.Status)
	if f.PromptPreview > 0 {
		for i := range list {
			list[i].Prompt, list[i].PromptTruncated = preview(list[i].Prompt, f.PromptPreview)
		}
	}
	return list, nil
}

// preview cuts s to n characters and says whether it did.
func preview(s string, n int) (string, bool) {
	i := 0
	for off := range s {
		if i == n {
			return s[:off], true
		}
		i++
	}
	return s, false
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s *Store) queryExecutions(ctx context.Context, db querier, q string, args ...any) ([]Execution, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	defer rows.Close()
	var out []Execution
	for rows.Next() {
		e, err := scanExecution(rows)
		if err != nil {
			return nil, fmt.Errorf("list executions: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	return out, nil
}

// InterruptRunning marks every execution still pending or running as
// Interrupted, with Ended now and an Error saying why, and releases their
// credit reservations. The daemon calls it once at start-up, before it
// starts executions: any execution in those states was left by a daemon
// that died. Their events are kept. It returns the executions changed,
// so the caller can append a status event to each stream. Executions
// named in keep (their agents still run and are taken up again) are left
// as they are.
func (s *Store) InterruptRunning(ctx context.Context, keep ...string) ([]Execution, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("interrupt running executions: %w", err)
	}
	defer tx.Rollback()
	list, err := s.queryExecutions(ctx, tx, "SELECT "+executionColumns+" FROM executions WHERE status IN (?, ?) ORDER BY n",
		Pending, Running)
	if err != nil {
		return nil, fmt.Errorf("interrupt running executions: %w", err)
	}
	list = slices.DeleteFunc(list, func(e Execution) bool { return slices.Contains(keep, e.ID) })
	now := time.Now().UTC()
	for i := range list {
		e := &list[i]
		if e.Error == "" {
			e.Error = fmt.Sprintf("the daemon stopped while the execution was %s", e.Status)
		}
		e.Status, e.Ended = Interrupted, now
		if err := writeExecution(ctx, tx, e); err != nil {
			return nil, err
		}
		if _, err := release(ctx, tx, e.ID, now); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("interrupt running executions: %w", err)
	}
	return list, nil
}
