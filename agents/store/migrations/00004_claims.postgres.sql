-- Advisory leases on workspace paths (see 00004_claims.sqlite.sql).

-- +goose Up
CREATE TABLE claims (
    path       TEXT   PRIMARY KEY,
    holder     TEXT   NOT NULL REFERENCES executions (id),
    session_id TEXT   NOT NULL,
    acquired   BIGINT NOT NULL,
    expires    BIGINT NOT NULL,
    CHECK (expires > acquired)
);
CREATE INDEX claims_holder ON claims (holder);

-- +goose Down
DROP TABLE claims;
