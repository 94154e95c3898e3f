-- Advisory leases on workspace paths: at most one holder (a running
-- execution) per path, until it releases the path, ends, or its lease
-- expires. Paths are relative to /workspace/agents.

-- +goose Up
CREATE TABLE claims (
    path       TEXT    PRIMARY KEY,
    holder     TEXT    NOT NULL REFERENCES executions (id),
    session_id TEXT    NOT NULL, -- the holder's session
    acquired   INTEGER NOT NULL,
    expires    INTEGER NOT NULL,
    CHECK (expires > acquired)
) STRICT;
CREATE INDEX claims_holder ON claims (holder);

-- +goose Down
DROP TABLE claims;
