-- The first schema of the hearth store. Times are Unix nanoseconds (UTC),
-- NULL where a moment has not happened yet; money is integer micro-dollars.

-- +goose Up
CREATE TABLE sessions (
    id               TEXT    PRIMARY KEY,
    agent            TEXT    NOT NULL,
    created          INTEGER NOT NULL,
    last_execution   TEXT,             -- no foreign key: executions point here
    agent_session_id TEXT    NOT NULL DEFAULT '' -- the agent CLI's own id, for --resume
) STRICT;
CREATE INDEX sessions_agent ON sessions (agent, created);

CREATE TABLE executions (
    n                     INTEGER PRIMARY KEY, -- insertion order: newest-first paging
    id                    TEXT    NOT NULL UNIQUE,
    session_id            TEXT    NOT NULL REFERENCES sessions (id),
    agent                 TEXT    NOT NULL,
    kind                  TEXT    NOT NULL CHECK (kind IN ('run', 'resume', 'retry')),
    parent_id             TEXT    REFERENCES executions (id),
    prompt                TEXT    NOT NULL,
    status                TEXT    NOT NULL CHECK (status IN ('pending', 'running', 'completed',
                              'failed', 'budget_exceeded', 'timed_out', 'cancelled', 'interrupted')),
    created               INTEGER NOT NULL,
    started               INTEGER,
    ended                 INTEGER,
    limit_usd_micros      INTEGER NOT NULL DEFAULT 0, -- 0: no limit
    limit_turns           INTEGER NOT NULL DEFAULT 0,
    limit_wall_ms         INTEGER NOT NULL DEFAULT 0,
    turns                 INTEGER NOT NULL DEFAULT 0,
    input_tokens          INTEGER NOT NULL DEFAULT 0,
    output_tokens         INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens     INTEGER NOT NULL DEFAULT 0,
    cache_creation_tokens INTEGER NOT NULL DEFAULT 0,
    usd_micros            INTEGER NOT NULL DEFAULT 0,
    result                TEXT    NOT NULL DEFAULT '',
    error                 TEXT    NOT NULL DEFAULT '',
    outputs               TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(outputs)),
    CHECK ((kind = 'run') = (parent_id IS NULL))
) STRICT;
CREATE INDEX executions_session ON executions (session_id, n);
CREATE INDEX executions_agent ON executions (agent, n);
CREATE INDEX executions_status ON executions (status, n);

CREATE TABLE events (
    execution_id TEXT    NOT NULL REFERENCES executions (id),
    seq          INTEGER NOT NULL CHECK (seq > 0),
    session_id   TEXT    NOT NULL,
    time         INTEGER NOT NULL,
    type         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    PRIMARY KEY (execution_id, seq)
) STRICT;

-- The credit ledger is append-only; credit_totals is kept by a trigger so
-- that Balance is one row read and can never disagree with the entries.
CREATE TABLE credit_entries (
    id               INTEGER PRIMARY KEY,
    time             INTEGER NOT NULL,
    kind             TEXT    NOT NULL CHECK (kind IN ('added', 'reserved', 'released', 'spent')),
    execution_id     TEXT    REFERENCES executions (id),
    micros           INTEGER NOT NULL CHECK (micros >= 0),
    from_reservation INTEGER NOT NULL DEFAULT 0 CHECK (from_reservation BETWEEN 0 AND micros),
    note             TEXT    NOT NULL DEFAULT '',
    CHECK ((kind = 'added') = (execution_id IS NULL))
) STRICT;
CREATE INDEX credit_entries_execution ON credit_entries (execution_id) WHERE execution_id IS NOT NULL;

CREATE TABLE credit_totals (
    one      INTEGER PRIMARY KEY CHECK (one = 1),
    added    INTEGER NOT NULL,
    reserved INTEGER NOT NULL,
    spent    INTEGER NOT NULL
) STRICT;
INSERT INTO credit_totals (one, added, reserved, spent) VALUES (1, 0, 0, 0);

-- +goose StatementBegin
CREATE TRIGGER credit_entries_totals AFTER INSERT ON credit_entries BEGIN
    UPDATE credit_totals SET
        added    = added + CASE NEW.kind WHEN 'added' THEN NEW.micros ELSE 0 END,
        reserved = reserved + CASE NEW.kind
                       WHEN 'reserved' THEN NEW.micros
                       WHEN 'released' THEN -NEW.micros
                       WHEN 'spent' THEN -NEW.from_reservation
                       ELSE 0 END,
        spent    = spent + CASE NEW.kind WHEN 'spent' THEN NEW.micros ELSE 0 END;
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER credit_entries_no_update BEFORE UPDATE ON credit_entries BEGIN
    SELECT RAISE(ABORT, 'credit entries are append-only');
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER credit_entries_no_delete BEFORE DELETE ON credit_entries BEGIN
    SELECT RAISE(ABORT, 'credit entries are append-only');
END;
-- +goose StatementEnd

-- +goose Down
DROP TABLE credit_totals;
DROP TABLE credit_entries;
DROP TABLE events;
DROP TABLE executions;
DROP TABLE sessions;
