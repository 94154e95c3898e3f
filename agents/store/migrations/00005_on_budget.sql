-- What reaching an execution's dollar limit does ("stop" or "pause"),
-- kept with the execution: a daemon that takes up an execution another
-- one left running (on_shutdown = "leave") goes on with its own agent's
-- or task's choice, not the appliance's default. '' is an execution
-- recorded before this column, which goes on with the default.

-- +goose Up
ALTER TABLE executions ADD COLUMN on_budget TEXT NOT NULL DEFAULT ''
    CHECK (on_budget IN ('', 'stop', 'pause'));

-- +goose Down
ALTER TABLE executions DROP COLUMN on_budget;
