-- awaiting_budget: an execution paused at its dollar limit (on_budget =
-- "pause"), its model call held until a top-up. SQLite cannot change a
-- CHECK constraint in place, so the table is rebuilt as
-- https://sqlite.org/lang_altertable.html#otheralter says: foreign keys
-- off (events and credit entries point at executions), a new table, the
-- rows copied, the old one dropped, the new one renamed, its indexes made
-- again, in one transaction. The rows are not changed.

-- +goose NO TRANSACTION

-- +goose Up
PRAGMA foreign_keys = OFF;
BEGIN;
CREATE TABLE executions_new (
    n                     INTEGER PRIMARY KEY, -- insertion order: newest-first paging
    id                    TEXT    NOT NULL UNIQUE,
    session_id            TEXT    NOT NULL REFERENCES sessions (id),
    agent                 TEXT    NOT NULL,
    kind                  TEXT    NOT NULL CHECK (kind IN ('run', 'resume', 'retry')),
    parent_id             TEXT    REFERENCES executions (id),
    prompt                TEXT    NOT NULL,
    status                TEXT    NOT NULL CHECK (status IN ('pending', 'running', 'awaiting_budget', 'completed',
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
INSERT INTO executions_new SELECT * FROM executions;
DROP TABLE executions;
ALTER TABLE executions_new RENAME TO executions;
CREATE INDEX executions_session ON executions (session_id, n);
CREATE INDEX executions_agent ON executions (agent, n);
CREATE INDEX executions_status ON executions (status, n);
COMMIT;
PRAGMA foreign_keys = ON;

-- +goose Down
PRAGMA foreign_keys = OFF;
BEGIN;
CREATE TABLE executions_new (
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
INSERT INTO executions_new SELECT n, id, session_id, agent, kind, parent_id, prompt,
    CASE status WHEN 'awaiting_budget' THEN 'interrupted' ELSE status END,
    created, started, ended, limit_usd_micros, limit_turns, limit_wall_ms, turns, input_tokens,
    output_tokens, cache_read_tokens, cache_creation_tokens, usd_micros, result, error, outputs
    FROM executions;
DROP TABLE executions;
ALTER TABLE executions_new RENAME TO executions;
CREATE INDEX executions_session ON executions (session_id, n);
CREATE INDEX executions_agent ON executions (agent, n);
CREATE INDEX executions_status ON executions (status, n);
COMMIT;
PRAGMA foreign_keys = ON;
