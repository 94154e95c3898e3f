-- awaiting_budget (see 00002_awaiting_budget.sqlite.sql): PostgreSQL
-- changes the CHECK constraint in place.

-- +goose Up
ALTER TABLE executions DROP CONSTRAINT executions_status_check;
ALTER TABLE executions ADD CONSTRAINT executions_status_check CHECK (status IN ('pending', 'running',
    'awaiting_budget', 'completed', 'failed', 'budget_exceeded', 'timed_out', 'cancelled', 'interrupted'));

-- +goose Down
UPDATE executions SET status = 'interrupted' WHERE status = 'awaiting_budget';
ALTER TABLE executions DROP CONSTRAINT executions_status_check;
ALTER TABLE executions ADD CONSTRAINT executions_status_check CHECK (status IN ('pending', 'running',
    'completed', 'failed', 'budget_exceeded', 'timed_out', 'cancelled', 'interrupted'));
