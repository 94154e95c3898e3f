-- Branched sessions: a session made by `hearth agents branch` names the
-- session it came from and the point it was taken at (the call
-- snapshot it started from), so a session's branches can be listed both
-- ways. '' is a session that was not branched.

-- +goose Up
ALTER TABLE sessions ADD COLUMN branched_from TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN branched_at TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_branched_from ON sessions (branched_from, created) WHERE branched_from != '';

-- +goose Down
DROP INDEX sessions_branched_from;
ALTER TABLE sessions DROP COLUMN branched_at;
ALTER TABLE sessions DROP COLUMN branched_from;
