-- Recovery epochs, publication operation ids and source versions.
-- A token is (epoch, generation); every acquisition takes the store's current epoch.
ALTER TABLE fenced_resources ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fenced_resources ADD COLUMN published_epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fenced_resources ADD COLUMN source_version INTEGER NOT NULL DEFAULT 0;

CREATE TABLE fenced_meta (
    id    INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
) STRICT;
-- A new store's epoch is the clock in microseconds since 1970 (sql.go, epochClock), so that a
-- store created again after its file was lost issues tokens above every token of the old one.
INSERT INTO fenced_meta (id, epoch) VALUES (1, fenced_epoch_clock_us());

-- Outcomes of publications by operation id. Later publications never overwrite a record:
-- 'accepted' is written with the payload, 'aborted' by Resolve for an id that never arrived.
CREATE TABLE fenced_operations (
    op_id       TEXT    NOT NULL PRIMARY KEY,
    outcome     TEXT    NOT NULL CHECK (outcome IN ('accepted', 'aborted')),
    resource    TEXT,
    epoch       INTEGER,
    generation  INTEGER,
    recorded_at INTEGER NOT NULL
) STRICT;
CREATE INDEX fenced_operations_recorded_at ON fenced_operations (recorded_at);
