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
	Resume Kind = "resume" // continues Previous's conversation in the same session
	Retry  Kind = "retry"  // runs Previous's task again after it failed
)

// Status is where an execution is in its life: Pending, then Running
// (and AwaitingBudget, back and forth, while it waits for a top-up), then
// one of the terminal statuses.
type Status string

const (
	Pending        Status = "pending"
	Running        Status = "running"
	AwaitingBudget Status = "awaiting_budget" // paused at a dollar limit, its model call held, until a top-up
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
	Pending:        {Running, Failed, Cancelled, Interrupted},
	Running:        {AwaitingBudget, Completed, Failed, BudgetExceeded, TimedOut, Cancelled, Interrupted},
	AwaitingBudget: {Running, Completed, Failed, BudgetExceeded, TimedOut, Cancelled, Interrupted},
}

// Valid reports whether s is one of the statuses above.
func (s Status) Valid() bool {
	switch s {
	case Pending, Running, AwaitingBudget, Completed, Failed, BudgetExceeded, TimedOut, Cancelled, Interrupted:
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
	// OnBudget is what reaching the USD limit does: OnBudgetStop or
	// OnBudgetPause; "" (an execution recorded before it was kept) is the
	// runner's default.
	OnBudget string `json:"on_budget,omitempty"`
}

// What reaching an execution's USD limit does (Limits.OnBudget).
const (
	OnBudgetStop  = "stop"
	OnBudgetPause = "pause"
)

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
	// Previous is the execution resumed or retried.
	Previous string `json:"previous,omitempty"`
	// Parent is the execution that delegated this one ("" for a root) and
	// Depth the number of delegations from the root (0 for a root); the
	// store sets Depth from the parent's.
	Parent string `json:"parent,omitempty"`
	Depth  int    `json:"depth"`
	Prompt string `json:"prompt"`
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

	// TotalUSD and TotalTokens are USD and Tokens plus every
	// descendant's (the executions it delegated to, and theirs): the
	// store adds each change of an execution's figures to its ancestors'
	// in the same transaction. UpdateExecution ignores changes to them.
	TotalUSD    float64 `json:"total_usd"`
	TotalTokens Tokens  `json:"total_tokens"`

	// Node is the node that owns the execution when several share a
	// PostgreSQL store: it writes the execution's events and interrupts
	// it if it restarts. CreateExecution sets the creating Store's node
	// when empty; "" on a single host. UpdateExecution ignores changes.
	Node string `json:"node,omitempty"`
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
	case (e.Kind == Run) != (e.Previous == ""):
		return bad("a %s has a previous execution exactly when it is a resume or a retry", e.Kind)
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
	if l := e.Limits.OnBudget; l != "" && l != OnBudgetStop && l != OnBudgetPause {
		return fmt.Errorf("execution %s: %w: limits.on_budget %q is neither %q nor %q", e.ID, ErrInvalid, l, OnBudgetStop, OnBudgetPause)
	}
	if err := CheckUSD(e.USD); err != nil && !(e.USD > 0 && e.USD < MinUSD) {
		return fmt.Errorf("execution %s: %w: usd %w", e.ID, ErrInvalid, err)
	}
	return nil
}

// CreateExecution records a new pending execution in an existing session.
// An empty ID is generated; an empty Kind is Run; an empty Agent is the
// session's (another agent's is ErrInvalid); an unset Created is now. A
// resume's previous execution must be in the same session. Unknown
// session, previous or parent execution
// is ErrNotFound. A Parent (the delegating execution) must exist and not
// have ended (ErrInvalid); the execution's Depth is its parent's plus
// one. It also makes the execution the session's last one, and
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
	if e.Node == "" {
		e.Node = s.node
	}
	if err := e.validateNew(); err != nil {
		return Execution{}, err
	}
	tx, err := s.beginWrite(ctx)
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

// checkLineage checks e's session, previous and parent executions, and
// fills in e.Agent and e.Depth.
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
	e.Depth = 0
	if e.Parent != "" {
		var (
			depth  int
			status Status
		)
		err = tx.QueryRowContext(ctx, "SELECT depth, status FROM executions WHERE id = ?", e.Parent).Scan(&depth, &status)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("create execution: parent %s: %w", e.Parent, ErrNotFound)
		} else if err != nil {
			return fmt.Errorf("create execution: parent %s: %w", e.Parent, err)
		}
		if status.Terminal() {
			return fmt.Errorf("create execution: %w: parent %s has ended (%s): only a running execution delegates", ErrInvalid, e.Parent, status)
		}
		e.Depth = depth + 1
	}
	if e.Previous == "" {
		return nil
	}
	var prevSession string
	err = tx.QueryRowContext(ctx, "SELECT session_id FROM executions WHERE id = ?", e.Previous).Scan(&prevSession)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("create execution: previous %s: %w", e.Previous, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("create execution: previous %s: %w", e.Previous, err)
	}
	if e.Kind == Resume && prevSession != e.Session {
		return fmt.Errorf("create execution: %w: resume of %s (session %s) in session %s", ErrInvalid, e.Previous, prevSession, e.Session)
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
		// A savepoint lets the transaction go on after a colliding id:
		// PostgreSQL aborts the whole transaction on an error otherwise.
		if _, err := tx.ExecContext(ctx, "SAVEPOINT insert_execution"); err != nil {
			return fmt.Errorf("create execution %s: %w", e.ID, err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO executions (id, session_id, agent, kind, previous_id, parent_id, depth,
			prompt, status, created, limit_usd_micros, limit_turns, limit_wall_ms, on_budget, outputs, node) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			e.ID, e.Session, e.Agent, e.Kind, sql.NullString{String: e.Previous, Valid: e.Previous != ""},
			sql.NullString{String: e.Parent, Valid: e.Parent != ""}, e.Depth, e.Prompt, e.Status, e.Created.UnixNano(), toMicros(e.Limits.USD), e.Limits.Turns, e.Limits.WallTime.Milliseconds(), e.Limits.OnBudget, outputs, e.Node)
		if err != nil {
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT insert_execution"); rerr != nil {
				return fmt.Errorf("create execution %s: %w", e.ID, rerr)
			}
		} else if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT insert_execution"); err != nil {
			return fmt.Errorf("create execution %s: %w", e.ID, err)
		}
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

const executionColumns = `id, session_id, agent, kind, previous_id, parent_id, depth, prompt, status, created,
	started, ended, limit_usd_micros, limit_turns, limit_wall_ms, turns, input_tokens, output_tokens,
	cache_read_tokens, cache_creation_tokens, usd_micros, result, error, outputs, total_usd_micros,
	total_input_tokens, total_output_tokens, total_cache_read_tokens, total_cache_creation_tokens, on_budget, node`

func scanExecution(row scanner) (Execution, error) {
	var (
		e                      Execution
		previous, parent       sql.NullString
		totalMicros            int64
		created                int64
		started, ended         sql.NullInt64
		limitMicros, usdMicros int64
		limitWallMS            int64
		outputs                string
	)
	t := &e.TotalTokens
	err := row.Scan(&e.ID, &e.Session, &e.Agent, &e.Kind, &previous, &parent, &e.Depth, &e.Prompt, &e.Status, &created,
		&started, &ended, &limitMicros, &e.Limits.Turns, &limitWallMS, &e.Turns, &e.Tokens.Input, &e.Tokens.Output,
		&e.Tokens.CacheRead, &e.Tokens.CacheCreation, &usdMicros, &e.Result, &e.Error, &outputs, &totalMicros,
		&t.Input, &t.Output, &t.CacheRead, &t.CacheCreation, &e.Limits.OnBudget, &e.Node)
	if err != nil {
		return Execution{}, err
	}
	e.Previous, e.Parent = previous.String, parent.String
	e.TotalUSD = toUSD(totalMicros)
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
// Session, Agent, Kind, Previous, Parent, Depth, Prompt and Created
// cannot change (ErrInvalid). A change of USD or Tokens is added to
// TotalUSD and TotalTokens, the execution's and every ancestor's. Started is set when the status becomes Running and Ended
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
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return Execution{}, fmt.Errorf("update execution %s: %w", id, s.wrote(err, id))
	}
	defer tx.Rollback()
	old, err := getExecution(ctx, tx, id)
	if err != nil {
		return Execution{}, err
	}
	stored := old // what the database has, totals included
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
	micros, tokens := withTotals(stored, &e)
	err = writeExecution(ctx, tx, &e)
	if err == nil {
		err = addTotals(ctx, tx, e.ID, micros, tokens)
	}
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
		e.Previous != old.Previous || e.Parent != old.Parent || e.Depth != old.Depth || e.Prompt != old.Prompt ||
		!e.Created.Equal(old.Created) {
		return fmt.Errorf("update execution %s: %w: id, session, agent, kind, previous, parent, depth, prompt and created are fixed", old.ID, ErrInvalid)
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
		limit_turns = ?, limit_wall_ms = ?, on_budget = ?, turns = ?, input_tokens = ?, output_tokens = ?, cache_read_tokens = ?,
		cache_creation_tokens = ?, usd_micros = ?, result = ?, error = ?, outputs = ? WHERE id = ?`,
		e.Status, nanos(e.Started), nanos(e.Ended), toMicros(e.Limits.USD), e.Limits.Turns,
		e.Limits.WallTime.Milliseconds(), e.Limits.OnBudget, e.Turns, e.Tokens.Input, e.Tokens.Output, e.Tokens.CacheRead,
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
	Parent  string // the executions this one delegated to (its children)
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
	if f.Parent != "" {
		add("parent_id = ?", f.Parent)
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

// InterruptRunning marks every execution still pending, running or
// awaiting a top-up as
// Interrupted, with Ended now and an Error saying why, and releases their
// credit reservations. The daemon calls it once at start-up, before it
// starts executions: any execution in those states was left by a daemon
// that died. Their events are kept. It returns the executions changed,
// so the caller can append a status event to each stream. Executions
// named in keep (their agents still run and are taken up again) are left
// as they are; the others' leases on paths (claims) are let go. On a
// shared PostgreSQL store it touches only this node's executions.
func (s *Store) InterruptRunning(ctx context.Context, keep ...string) ([]Execution, error) {
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return nil, fmt.Errorf("interrupt running executions: %w", err)
	}
	defer tx.Rollback()
	list, err := s.queryExecutions(ctx, tx, "SELECT "+executionColumns+" FROM executions WHERE status IN (?, ?, ?) AND node = ? ORDER BY n",
		Pending, Running, AwaitingBudget, s.node)
	if err != nil {
		return nil, fmt.Errorf("interrupt running executions: %w", err)
	}
	list = slices.DeleteFunc(list, func(e Execution) bool { return slices.Contains(keep, e.ID) })
	if err := interrupt(ctx, tx, list, ""); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("interrupt running executions: %w", err)
	}
	return list, nil
}

// interrupt ends each execution of list interrupted, with why as its
// error (if it has none; "" says the daemon stopped), releasing its
// credits and claims, in tx.
func interrupt(ctx context.Context, tx *sql.Tx, list []Execution, why string) error {
	now := time.Now().UTC()
	for i := range list {
		e := &list[i]
		if e.Error == "" {
			e.Error = why
		}
		if e.Error == "" {
			e.Error = fmt.Sprintf("the daemon stopped while the execution was %s", e.Status)
		}
		e.Status, e.Ended = Interrupted, now
		if err := writeExecution(ctx, tx, e); err != nil {
			return err
		}
		if _, err := release(ctx, tx, e.ID, now); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM claims WHERE holder = ?", e.ID); err != nil {
			return err
		}
	}
	return nil
}

// Interrupt ends execution id interrupted, with why as its error,
// whichever node owns it (a cluster's node that died): its credits and
// claims are released. It returns the execution as it is now; one
// already ended is left as it is (ended false).
func (s *Store) Interrupt(ctx context.Context, id, why string) (e Execution, ended bool, err error) {
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return Execution{}, false, fmt.Errorf("interrupt execution %s: %w", id, err)
	}
	defer tx.Rollback()
	if e, err = getExecution(ctx, tx, id); err != nil {
		return Execution{}, false, err
	}
	if e.Status.Terminal() {
		return e, false, nil
	}
	list := []Execution{e}
	if err := interrupt(ctx, tx, list, why); err != nil {
		return Execution{}, false, fmt.Errorf("interrupt execution %s: %w", id, err)
	}
	if err := s.wrote(tx.Commit()); err != nil {
		return Execution{}, false, fmt.Errorf("interrupt execution %s: %w", id, err)
	}
	return list[0], true, nil
}

// minus is t - o, field by field.
func (t Tokens) minus(o Tokens) Tokens {
	return Tokens{t.Input - o.Input, t.Output - o.Output, t.CacheRead - o.CacheRead, t.CacheCreation - o.CacheCreation}
}

// withTotals sets e's totals to old's plus the change of its own figures
// from old, which it returns (what addTotals adds up the tree).
func withTotals(old Execution, e *Execution) (micros int64, d Tokens) {
	micros, d = toMicros(e.USD)-toMicros(old.USD), e.Tokens.minus(old.Tokens)
	e.TotalUSD = toUSD(toMicros(old.TotalUSD) + micros)
	t := old.TotalTokens
	e.TotalTokens = Tokens{t.Input + d.Input, t.Output + d.Output, t.CacheRead + d.CacheRead, t.CacheCreation + d.CacheCreation}
	return micros, d
}

// addTotals adds a change of an execution's own figures to the totals of
// it and of every ancestor, in tx. A tree is a chain of a few parents
// (the runner bounds its depth), walked up one row at a time.
func addTotals(ctx context.Context, tx *sql.Tx, exec string, micros int64, d Tokens) error {
	if micros == 0 && d == (Tokens{}) {
		return nil
	}
	for id, seen := exec, 0; id != ""; seen++ {
		if seen > maxTreeDepth {
			return fmt.Errorf("update execution %s: the chain of parents is longer than %d", exec, maxTreeDepth)
		}
		var parent sql.NullString
		err := tx.QueryRowContext(ctx, `UPDATE executions SET total_usd_micros = total_usd_micros + ?,
			total_input_tokens = total_input_tokens + ?, total_output_tokens = total_output_tokens + ?,
			total_cache_read_tokens = total_cache_read_tokens + ?, total_cache_creation_tokens = total_cache_creation_tokens + ?
			WHERE id = ? RETURNING parent_id`, micros, d.Input, d.Output, d.CacheRead, d.CacheCreation, id).Scan(&parent)
		if err != nil {
			return fmt.Errorf("update execution %s: totals of %s: %w", exec, id, err)
		}
		id = parent.String
	}
	return nil
}

// maxTreeDepth bounds the walk up a tree; the runner's depth limit is far
// below it.
const maxTreeDepth = 1000

// Children returns the executions id delegated to, oldest first (at most
// 10000).
func (s *Store) Children(ctx context.Context, id string) ([]Execution, error) {
	list, err := s.ListExecutions(ctx, ExecutionFilter{Parent: id, Limit: 10000})
	if err != nil {
		return nil, err
	}
	slices.Reverse(list)
	return list, nil
}

// Adopt makes this Store's node the owner of an execution that has not
// ended (one queued by another node's API, or left by a node that
// stopped), so that it appends its events from now on. The previous
// owner must no longer append to it: its events would be refused by
// the primary key. An ended execution is ErrInvalidTransition.
func (s *Store) Adopt(ctx context.Context, id string) (Execution, error) {
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return Execution{}, fmt.Errorf("adopt execution %s: %w", id, err)
	}
	defer tx.Rollback()
	e, err := getExecution(ctx, tx, id)
	if err != nil {
		return Execution{}, err
	}
	if e.Status.Terminal() {
		return Execution{}, fmt.Errorf("adopt execution %s: %w: it is %s", id, ErrInvalidTransition, e.Status)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE executions SET node = ? WHERE id = ?", s.node, id); err != nil {
		return Execution{}, fmt.Errorf("adopt execution %s: %w", id, err)
	}
	if err := s.wrote(tx.Commit()); err != nil {
		return Execution{}, fmt.Errorf("adopt execution %s: %w", id, err)
	}
	e.Node = s.node
	return e, nil
}
