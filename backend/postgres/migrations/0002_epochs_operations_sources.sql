-- Recovery epochs, publication operation ids and source versions.
-- A token is (epoch, generation); every acquisition takes the store's current epoch.
ALTER TABLE fenced_resources
    ADD COLUMN epoch           bigint NOT NULL DEFAULT 0,
    ADD COLUMN published_epoch bigint NOT NULL DEFAULT 0,
    ADD COLUMN source_version  bigint NOT NULL DEFAULT 0;

-- The store's epoch, and the server's incarnation (system identifier and timeline) when the
-- schema was created or the epoch last bumped. The driver fills the incarnation in when it is
-- NULL, in the migration's transaction, and refuses lease-carrying mutations while the server
-- reports a different one (a restore from a copy, or a promotion).
CREATE TABLE fenced_meta (
    id                integer NOT NULL PRIMARY KEY CHECK (id = 1),
    epoch             bigint  NOT NULL,
    system_identifier bigint,
    timeline          bigint
);
-- A new store's epoch is the server's clock in microseconds since 1970 (sql.go, epochClock), so
-- that a store created again after a total loss issues tokens above every token of the old one.
INSERT INTO fenced_meta (id, epoch) VALUES (1, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint);

-- Outcomes of publications by operation id. Later publications never overwrite a record:
-- 'accepted' is written in the publication's statement, 'aborted' by Resolve for an id that
-- never arrived.
CREATE TABLE fenced_operations (
    op_id       text        NOT NULL PRIMARY KEY,
    outcome     text        NOT NULL CHECK (outcome IN ('accepted', 'aborted')),
    resource    text,
    epoch       bigint,
    generation  bigint,
    recorded_at timestamptz NOT NULL
);
CREATE INDEX fenced_operations_recorded_at ON fenced_operations (recorded_at);
