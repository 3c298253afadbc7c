-- One row per resource: the lease (owner, expiry, generation) beside the published result.
-- Times are microseconds since the Unix epoch on SQLite's clock. Rows are never deleted.
CREATE TABLE fenced_resources (
    resource             TEXT    NOT NULL PRIMARY KEY,
    generation           INTEGER NOT NULL DEFAULT 0,
    lease_owner          TEXT,
    lease_until          INTEGER,
    published_generation INTEGER NOT NULL DEFAULT 0,
    payload              BLOB,
    published_at         INTEGER
) STRICT;
