-- The node that owns an execution: the one whose daemon runs it, writes
-- its events (so their seqs come from one place) and interrupts it when
-- it restarts. '' on a single host (the embedded SQLite store), and for
-- executions recorded before this column.

-- +goose Up
ALTER TABLE executions ADD COLUMN node TEXT NOT NULL DEFAULT '';
CREATE INDEX executions_node ON executions (node, status);

-- +goose Down
DROP INDEX executions_node;
ALTER TABLE executions DROP COLUMN node;
