-- Recovery epochs, publication operation ids and source versions. A token is (epoch,
-- generation); every acquisition stores the store's current epoch in its row.
-- One ALTER, so that it applies whole or not at all; run again after it applied, it fails with
-- "duplicate column" (1060), which the migration runner treats as already done (MySQL has no
-- ADD COLUMN IF NOT EXISTS).
ALTER TABLE fenced_resources
    ADD COLUMN epoch           BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN published_epoch BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN source_version  BIGINT NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS fenced_meta (
    id    TINYINT NOT NULL PRIMARY KEY,
    epoch BIGINT  NOT NULL,
    CONSTRAINT fenced_meta_one_row CHECK (id = 1)
) ENGINE = InnoDB;
-- A new store's epoch is the server's clock in microseconds since 1970 (sql.go, nowMicros), so
-- that a store created again after a total loss issues tokens above every token of the old one.
INSERT INTO fenced_meta (id, epoch)
VALUES (1, TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6)))
ON DUPLICATE KEY UPDATE id = id;

-- Outcomes of publications by operation id. Later publications never overwrite a record:
-- 'accepted' is written with the payload, 'aborted' by Resolve for an id that never arrived.
CREATE TABLE IF NOT EXISTS fenced_operations (
    op_id       VARBINARY(128) NOT NULL PRIMARY KEY,
    outcome     VARCHAR(8)     NOT NULL,
    resource    VARBINARY(255) NULL,
    epoch       BIGINT         NULL,
    generation  BIGINT         NULL,
    recorded_at DATETIME(6)    NOT NULL,
    KEY fenced_operations_recorded_at (recorded_at),
    CONSTRAINT fenced_operations_outcome CHECK (outcome IN ('accepted', 'aborted'))
) ENGINE = InnoDB;
