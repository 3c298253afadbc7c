-- One row per resource: the lease (owner, expiry, generation) beside the published result.
-- Times are on the server's clock. Rows are never deleted. The table is logged (never UNLOGGED):
-- an unlogged table is emptied by crash recovery, which would reset generations and let an old
-- token be valid again.
CREATE TABLE fenced_resources (
    resource             text        NOT NULL PRIMARY KEY,
    generation           bigint      NOT NULL DEFAULT 0,
    lease_owner          text,
    lease_until          timestamptz,
    published_generation bigint      NOT NULL DEFAULT 0,
    payload              bytea,
    published_at         timestamptz
);
