-- Delegation trees (see 00003_delegation.sqlite.sql), with BIGINT totals.

-- +goose Up
ALTER TABLE executions RENAME COLUMN parent_id TO previous_id;
ALTER TABLE executions ADD COLUMN parent_id TEXT REFERENCES executions (id);
ALTER TABLE executions ADD COLUMN depth BIGINT NOT NULL DEFAULT 0 CHECK (depth >= 0);
ALTER TABLE executions ADD COLUMN total_usd_micros BIGINT NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_input_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_output_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_cache_read_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN total_cache_creation_tokens BIGINT NOT NULL DEFAULT 0;
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
