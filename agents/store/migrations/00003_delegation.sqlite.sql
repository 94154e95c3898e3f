-- Delegation trees (numbered 3: version 2, awaiting_budget, rebuilds the
-- executions table with the first schema's columns, so it comes first). The column that named the execution a resume or retry
-- follows becomes previous_id; parent_id now names the execution that
-- delegated this one (NULL for a root), depth counts the delegations
-- from the root, and the total_ columns are the execution's own figures
-- plus every descendant's, kept by the store as they change.

-- +goose Up
ALTER TABLE executions RENAME COLUMN parent_id TO previous_id;
ALTER TABLE executions ADD COLUMN parent_id TEXT REFERENCES executions (id);
ALTER TABLE executions ADD COLUMN depth INTEGER NOT NULL DEFAULT 0 CHECK (depth >= 0);
ALTER TABLE executions ADD COLUMN total_usd_micros INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_cache_read_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_cache_creation_tokens INTEGER NOT NULL DEFAULT 0;
UPDATE executions SET total_usd_micros = usd_micros, total_input_tokens = input_tokens,
    total_output_tokens = output_tokens, total_cache_read_tokens = cache_read_tokens,
    total_cache_creation_tokens = cache_creation_tokens;
CREATE INDEX executions_parent ON executions (parent_id, n) WHERE parent_id IS NOT NULL;

-- +goose Down
DROP INDEX executions_parent;
ALTER TABLE executions DROP COLUMN total_cache_creation_tokens;
ALTER TABLE executions DROP COLUMN total_cache_read_tokens;
ALTER TABLE executions DROP COLUMN total_output_tokens;
ALTER TABLE executions DROP COLUMN total_input_tokens;
ALTER TABLE executions DROP COLUMN total_usd_micros;
ALTER TABLE executions DROP COLUMN depth;
ALTER TABLE executions DROP COLUMN parent_id;
ALTER TABLE executions RENAME COLUMN previous_id TO parent_id;
